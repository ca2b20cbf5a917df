"""Authentication: who a bearer token is (API key or JWT) and what its scopes allow.

The HTTP and WebSocket layers use :class:`~gateway.auth.authenticator.Authenticator`
(``authenticate``, ``mint_token``, ``origin_allowed``) and
:func:`~gateway.auth.bootstrap.ensure_bootstrap`; ``pushgate admin`` uses the stores in
``tenants``, ``api_keys`` and ``jwt_keys``. See docs/auth.md.
"""
