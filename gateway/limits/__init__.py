"""Tenants' rate limits and quotas: stored in the backend's metadata, enforced with ``throttling``.

- :mod:`.document`: the ``/v1/limits`` document (what may be limited, and how PUT merges);
- :mod:`.store`: where documents live (metadata namespace ``limits``), cached per process;
- :mod:`.enforcer`: turns a request into rules, a refusal into ``429 rate_limited`` or
  ``409 quota_exceeded``;
- :mod:`.headers`: the IETF ``RateLimit-Policy`` / ``RateLimit`` header fields;
- :mod:`.shared`: wake-ups and cache invalidations between gateways (the broadcaster).
"""
