"""Which browser origins may act for a tenant: one rule for HTTP (CORS) and WebSocket.

A request that carries an ``Origin`` header comes from a browser page. docs/auth.md's rule:
the page's origin must be one the caller's tenant lists (``pushgate admin tenant create
acme --origin https://app.acme.com``); a tenant with no origins accepts no browser at all.
One exception: the gateway's own origin (a page it serves itself, such as ``/docs`` or the
console), since a browser sends ``Origin`` on its same-origin POSTs and WebSockets too.

:class:`OriginRule` is the one place that decides; :class:`gateway.cors.CorsMiddleware`
asks it for every HTTP request, the WebSocket handler for every WebSocket (see
docs/browser.md).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from urllib.parse import urlsplit

from backend_store.errors import InvalidRequest

from .auth.authenticator import Authenticator
from .auth.tenants import normalize_origin

_DEFAULT_PORTS = {"http": 80, "https": 443}


# Both memos are of pure functions of a few distinct strings (a deployment's origins and its
# own host names); parsing them on every browser request cost more than the rest of the rule.
@functools.lru_cache(maxsize=4096)
def normalized_origin(origin: str) -> str | None:
    """``origin`` as tenants list it (``scheme://host[:port]``), or None if it is no valid origin."""
    try:
        return normalize_origin(origin)
    except InvalidRequest:
        return None


@functools.lru_cache(maxsize=4096)
def same_origin(origin: str, host: str | None) -> bool:
    """Whether ``origin`` names the host the request was sent to (its ``Host`` header).

    The scheme is not compared: behind a proxy that ends TLS the gateway sees ``http``
    while the page is ``https``. A ``Host`` without a port matches the origin's default
    port (80 or 443), for the same reason.
    """
    normalized = normalized_origin(origin)
    if not host or normalized is None:
        return False
    parts = urlsplit(normalized)
    try:
        host_parts = urlsplit("//" + host.strip().lower())
        host_port = host_parts.port
    except ValueError:
        return False
    if parts.hostname is None or parts.hostname != host_parts.hostname:
        return False
    origin_port = parts.port or _DEFAULT_PORTS[parts.scheme]
    return origin_port == (host_port or _DEFAULT_PORTS[parts.scheme])


class OriginRule:
    """The origin rule of one gateway (see the module docstring).

    ``any_tenant_allows`` answers CORS preflights, which carry no credentials: it checks
    the union of every tenant's origins, read at most every ``union_ttl_s`` seconds (the
    same delay as any other change made by ``pushgate admin`` in another process).
    """

    def __init__(
        self,
        authenticator: Authenticator,
        *,
        union_ttl_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.authenticator = authenticator
        self.union_ttl_s = union_ttl_s
        self._clock = clock
        self._union: frozenset[str] = frozenset()
        self._union_expires = float("-inf")

    async def allows(self, tenant: str, origin: str, host: str | None) -> bool:
        """Whether a page on ``origin`` may act with a credential of ``tenant``."""
        if same_origin(origin, host):
            return True
        normalized = normalized_origin(origin)
        return normalized is not None and normalized in await self.authenticator.allowed_origins(tenant)

    async def any_tenant_allows(self, origin: str, host: str | None) -> bool:
        """Whether any tenant (or the gateway itself) allows ``origin``: a preflight's question."""
        if same_origin(origin, host):
            return True
        normalized = normalized_origin(origin)
        if normalized is None:
            return False
        now = self._clock()
        if now >= self._union_expires:
            tenants = await self.authenticator.tenants.list_all()
            self._union = frozenset(o for t in tenants for o in t.origins)
            self._union_expires = now + self.union_ttl_s
        return normalized in self._union
