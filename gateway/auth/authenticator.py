"""Turns a bearer token (API key or JWT) into a :class:`Principal`, and mints JWTs.

One :class:`Authenticator` per gateway process, built from its store's metadata (:class:`MetadataStore`).
Verified tokens and key records are cached for ``cache_ttl_s`` seconds (default 5; a
token never past its ``exp``): changes made through this object's stores (``tenants``,
``api_keys``, ``jwt_keys``) take effect at once; changes made elsewhere (``pushgate
admin`` in another process, another gateway) take effect within ``cache_ttl_s``.
The token cache matters: verifying a JWT costs a few hundred microseconds (PyJWT and
store reads), a cache hit a few.
"""

from __future__ import annotations

import hashlib
import math
import secrets
import time
from collections.abc import Callable, Collection
from dataclasses import replace
from typing import Any

import jwt

from backend_store.backend import MetadataStore
from backend_store.encryption import Keyring
from backend_store.errors import Forbidden, InvalidRequest, PushgateError, Unauthorized
from backend_store.types import TenantId

from .api_keys import ApiKey, ApiKeyStore, is_api_key, key_id_of
from .aws_keys import AwsKeyStore
from .failure_log import FailureLog
from .jwt_keys import (
    MINTING_KID,
    JwtKey,
    JwtKeyStore,
    VerificationKey,
    is_valid_kid,
    load_verification_key,
)
from .jwt_verify import principal_from_claims, read_header, verify_claims
from .principal import Principal
from .scopes import format_scopes, parse_scopes, scopes_beyond
from .tenants import Tenant, TenantStore, is_valid_tenant_name, normalize_origin
from .ttl_cache import TtlCache

MAX_TOKEN_CHARS = 8192
MIN_TOKEN_TTL_S = 1.0
MAX_TOKEN_TTL_S = 86400.0
DEFAULT_TOKEN_TTL_S = 900.0


class Authenticator:
    """Authentication and token minting for one gateway process.

    ``audience``: when set, every JWT must carry it in ``aud`` (and minted tokens do);
    when None, a JWT that carries any ``aud`` is refused, since it was meant for
    someone else (RFC 7519 section 4.1.3). ``leeway_s`` tolerates clock skew on
    ``exp``, ``nbf`` and ``iat``.
    """

    def __init__(
        self,
        backend: MetadataStore,
        *,
        audience: str | None = None,
        leeway_s: float = 0.0,
        cache_ttl_s: float = 5.0,
        cache_max_entries: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        keyring: Keyring | None = None,
    ) -> None:
        self.audience = audience
        self.leeway_s = leeway_s
        self._clock = clock
        self._wall_clock = wall_clock
        self.tenants = TenantStore(backend, on_change=self._tenant_changed)
        self.api_keys = ApiKeyStore(backend, on_change=self._api_key_changed)
        self.jwt_keys = JwtKeyStore(backend, on_change=self._jwt_key_changed)
        self.aws_keys = AwsKeyStore(backend, keyring)
        self._api_key_cache: TtlCache[str, ApiKey | None] = TtlCache(cache_ttl_s, cache_max_entries, clock)
        self._jwt_key_cache: TtlCache[tuple[str, str], tuple[JwtKey, VerificationKey] | None] = TtlCache(
            cache_ttl_s, cache_max_entries, clock
        )
        self._tenant_cache: TtlCache[str, Tenant | None] = TtlCache(cache_ttl_s, cache_max_entries, clock)
        # Keyed by the token's SHA-256, so a cache full of 8 KiB tokens stays small.
        self._verified: TtlCache[bytes, Principal] = TtlCache(cache_ttl_s, cache_max_entries, clock)
        # Authentication failures in the log, one line a minute per key id.
        self.failures = FailureLog(clock)
        # Called after a change made through this object (the gateway tells other gateways).
        self.on_change: Callable[[], None] | None = None

    # Authentication -----------------------------------------------------

    async def authenticate(self, token: str) -> Principal:
        """The principal a bearer token proves; Unauthorized (with a reason) if it proves none."""
        token = token.strip()
        if not token:
            raise Unauthorized("missing bearer token")
        if len(token) > MAX_TOKEN_CHARS:
            raise Unauthorized("bearer token too long")
        digest = hashlib.sha256(token.encode()).digest()
        hit, principal = self._verified.get(digest)
        if hit and principal is not None and not self._expired(principal):
            return principal
        # A change in this process meanwhile (a revocation, say) clears the verified tokens:
        # this verification may predate it, and must not be cached after it.
        verified_since = self._verified.generation
        try:
            if is_api_key(token):
                principal, trusted_until = await self._authenticate_api_key(token)
            else:
                principal, trusted_until = await self._authenticate_jwt(token)
        except Unauthorized as exc:
            # JWTs share one line a minute: their key ids would come from the unverified token.
            self.failures.note(key_id_of(token) or ("api-key" if is_api_key(token) else "jwt"), exc.detail)
            raise
        # Never cached past the records it was verified with: a token first seen late in the
        # life of a cached key record must not outlive a change made elsewhere by more than
        # cache_ttl_s (docs/auth.md: "within 5 seconds").
        ttl = trusted_until - self._clock()
        if principal.expires_at is not None:
            ttl = min(ttl, self._seconds_left(principal.expires_at))
        self._verified.put(digest, principal, ttl, since=verified_since)
        return principal

    def _seconds_left(self, expires_at: float) -> float:
        # As PyJWT counts: expired once int(exp) <= now - leeway.
        return int(expires_at) + self.leeway_s - self._wall_clock()

    def _expired(self, principal: Principal) -> bool:
        return principal.expires_at is not None and self._seconds_left(principal.expires_at) <= 0

    # Each step below returns what it verified with and until when (this process's clock)
    # that may be trusted: the expiry of the cached record, or a full TTL for a fresh read.

    async def _authenticate_api_key(self, token: str) -> tuple[Principal, float]:
        key_id = key_id_of(token)
        if key_id is None:
            raise Unauthorized("malformed API key")
        key, trusted_until = await self._active_api_key(key_id)
        if not key.matches(token):
            raise Unauthorized("invalid API key")
        return Principal(key.tenant, key.scopes, key.key_id, via="api_key", key_id=key.key_id), trusted_until

    async def authenticate_aws(self, access_key_id: str) -> tuple[Principal, str] | None:
        """The principal and SigV4 secret of AWS credentials, or None if the access key id is unknown.

        The credentials act as their API key: a revoked key is Unauthorized; the caller checks
        the signature with the secret (``gateway/sqs/sigv4.py``) before acting as the principal.
        """
        found = await self.aws_keys.get(access_key_id)
        if found is None:
            return None
        key_id, secret = found
        key, _ = await self._active_api_key(key_id)
        return Principal(key.tenant, key.scopes, key.key_id, via="api_key", key_id=key.key_id), secret

    async def _active_api_key(self, key_id: str) -> tuple[ApiKey, float]:
        # Unknown ids are not cached: they would let anyone fill the cache.
        key, trusted_until = await self._api_key_cache.load(
            key_id, lambda: self.api_keys.get(key_id), keep=_found
        )
        if key is None:
            raise Unauthorized("invalid API key")
        if key.revoked_at is not None:
            raise Unauthorized("API key revoked")
        return key, trusted_until

    async def _authenticate_jwt(self, token: str) -> tuple[Principal, float]:
        header = read_header(token)
        key, verifier, trusted_until = await self._jwt_key(header.tenant, header.kid)
        claims = verify_claims(
            token, key, verifier, audience=self.audience, leeway_s=self.leeway_s, header=header
        )
        key_id = None
        if key.kid == MINTING_KID:
            key_id, api_key_until = await self._check_minting_key_active(claims, key.tenant)
            trusted_until = min(trusted_until, api_key_until)
        return replace(principal_from_claims(claims), kid=key.kid, key_id=key_id), trusted_until

    async def _jwt_key(self, tenant: str, kid: str) -> tuple[JwtKey, VerificationKey, float]:
        unknown = Unauthorized(f"unknown JWT key: tenant {tenant!r} has no kid {kid!r}")
        # Both come from the unverified token: names no stored key can have (a "/" that
        # would splice tenant and kid, a NUL the store refuses) never reach the store.
        if not (is_valid_tenant_name(tenant) and is_valid_kid(kid)):
            raise unknown

        async def read() -> tuple[JwtKey, VerificationKey] | None:
            found = await self.jwt_keys.get(tenant, kid)
            return None if found is None else (found, load_verification_key(found.alg, found.material))

        loaded, trusted_until = await self._jwt_key_cache.load((tenant, kid), read, keep=_found)
        if loaded is None:
            raise unknown
        return loaded[0], loaded[1], trusted_until

    async def _check_minting_key_active(self, claims: dict[str, Any], tenant: TenantId) -> tuple[str, float]:
        # A minted token dies with the API key it was minted from.
        key_id = claims.get("key_id")
        if not isinstance(key_id, str):
            raise Unauthorized("minted JWT lacks its key_id claim")
        key, trusted_until = await self._active_api_key(key_id)
        if key.tenant != tenant:
            raise Unauthorized("minted JWT tenant does not match its API key")
        return key_id, trusted_until

    async def recheck(self, principals: Collection[Principal]) -> dict[Principal, Principal | PushgateError]:
        """Check open connections' credentials again, straight from the store.

        For each principal: Unauthorized if its API key was revoked or its JWT signing key
        removed, else the principal as its key now stands (scopes included). Each record
        is read once however many principals share it, and the caches are refreshed, so
        HTTP requests see a revocation at the same moment as open connections.
        """
        keys: dict[str, ApiKey | None] = {}
        jwt_keys: dict[tuple[str, str], bool] = {}
        out: dict[Principal, Principal | PushgateError] = {}
        for principal in principals:
            try:
                current = principal
                if principal.key_id is not None:
                    if principal.key_id not in keys:
                        keys[principal.key_id] = await self.api_keys.get(principal.key_id)
                    key = keys[principal.key_id]
                    if key is None or key.revoked_at is not None or key.tenant != principal.tenant:
                        raise Unauthorized("API key revoked")
                    if principal.via == "api_key":
                        current = replace(principal, scopes=key.scopes)
                if principal.kid is not None:
                    ref = (principal.tenant, principal.kid)
                    if ref not in jwt_keys:
                        jwt_keys[ref] = await self.jwt_keys.get(*ref) is not None
                    if not jwt_keys[ref]:
                        raise Unauthorized(f"JWT signing key {principal.kid!r} was removed")
                out[principal] = current
            except PushgateError as exc:
                out[principal] = exc
        if any(isinstance(result, PushgateError) for result in out.values()):
            self.invalidate()
        return out

    # Minting ------------------------------------------------------------

    async def mint_token(
        self, principal: Principal, scope: str | None = None, ttl_s: float | None = None
    ) -> tuple[str, float]:
        """``POST /v1/tokens``: a JWT for ``scope`` (default: all the key's scopes) valid ``ttl_s``
        seconds (1..86400, default 900). Returns the token and its ``expires_at`` (epoch seconds).

        Forbidden unless ``principal`` came from an API key and holds every requested scope
        (see :func:`scopes.pattern_within` for how globs compare).
        """
        if principal.via != "api_key":
            raise Forbidden("tokens can be minted only with an API key")
        ttl = DEFAULT_TOKEN_TTL_S if ttl_s is None else ttl_s
        if (
            isinstance(ttl, bool)
            or not isinstance(ttl, int | float)
            or not math.isfinite(ttl)
            or not MIN_TOKEN_TTL_S <= ttl <= MAX_TOKEN_TTL_S
        ):
            raise InvalidRequest(f"ttl_s must be between {MIN_TOKEN_TTL_S:g} and {MAX_TOKEN_TTL_S:g}")
        requested = principal.scopes if scope is None else parse_scopes(scope)
        beyond = scopes_beyond(requested, principal.scopes)
        if beyond:
            raise Forbidden(f"requested scope is wider than the API key's: {' '.join(beyond)}")
        signing = await self.jwt_keys.minting_key(principal.tenant)
        now = self._wall_clock()
        expires_at = float(math.floor(now + ttl))
        claims: dict[str, Any] = {
            "sub": principal.subject,
            "tenant": principal.tenant,
            "scope": format_scopes(requested),
            "key_id": principal.subject,
            "iat": math.floor(now),
            "exp": int(expires_at),
            "jti": secrets.token_hex(8),
        }
        if self.audience is not None:
            claims["aud"] = self.audience
        token = jwt.encode(claims, signing.material, algorithm="HS256", headers={"kid": MINTING_KID})
        return token, expires_at

    # Tenants and origins -----------------------------------------------

    async def tenant(self, name: str) -> Tenant | None:
        """A tenant record (cached)."""
        tenant, _ = await self._tenant_cache.load(name, lambda: self.tenants.get(name))
        return tenant

    async def allowed_origins(self, tenant: str) -> list[str]:
        """The browser origins a tenant allows (``scheme://host[:port]``); empty: none."""
        record = await self.tenant(tenant)
        return [] if record is None else list(record.origins)

    async def origin_allowed(self, tenant: str, origin: str) -> bool:
        """Whether a browser's ``Origin`` header value is one the tenant allows."""
        try:
            normalized = normalize_origin(origin)
        except InvalidRequest:
            return False
        return normalized in await self.allowed_origins(tenant)

    # Cache invalidation ---------------------------------------------------

    def invalidate(self) -> None:
        """Forget every cached record (e.g. after a change made by another process)."""
        self._verified.clear()
        self._api_key_cache.clear()
        self._jwt_key_cache.clear()
        self._tenant_cache.clear()

    # Which cached tokens a change affects is not worth tracking: changes are rare,
    # so any change forgets every verified token.

    def _api_key_changed(self, key_id: str) -> None:
        self._verified.clear()
        self._api_key_cache.pop(key_id)
        self._changed()

    def _jwt_key_changed(self, tenant: TenantId, kid: str) -> None:
        self._verified.clear()
        self._jwt_key_cache.pop((tenant, kid))
        self._changed()

    def _tenant_changed(self, tenant: TenantId) -> None:
        self._tenant_cache.pop(tenant)
        self._changed()

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()


def _found(value: object) -> bool:
    return value is not None
