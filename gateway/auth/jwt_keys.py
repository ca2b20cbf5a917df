"""JWT verification keys, registered per tenant under a ``kid``.

HS256 keys are shared secrets (at least 32 bytes, RFC 7518 section 3.2); RS256, ES256
and EdDSA keys are PEM public keys, never private ones. Each key verifies tokens of
its own algorithm only. Kids starting with ``pushgate-`` are reserved: the gateway
keeps the HS256 secret it signs ``POST /v1/tokens`` tokens with under
:data:`MINTING_KID`.
"""

from __future__ import annotations

import base64
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, cast, get_args

import orjson
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa

from backend_store.backend import MetadataStore
from backend_store.errors import InvalidRequest, NotFound
from backend_store.types import TenantId

from . import tenants

NAMESPACE = "jwt_keys"
Algorithm = Literal["HS256", "RS256", "ES256", "EdDSA"]
ALGORITHMS: tuple[Algorithm, ...] = get_args(Algorithm)
RESERVED_PREFIX = "pushgate-"
MINTING_KID = "pushgate-minted"
MIN_HMAC_BYTES = 32
MIN_RSA_BITS = 2048
_KID = re.compile(r"[\x21-\x7e]{1,256}")  # printable ASCII, no spaces

PublicKey = rsa.RSAPublicKey | ec.EllipticCurvePublicKey | ed25519.Ed25519PublicKey | ed448.Ed448PublicKey
VerificationKey = bytes | PublicKey


@dataclass(frozen=True, slots=True)
class JwtKey:
    """A registered key. ``material`` is the HS256 secret, or the public key's PEM."""

    tenant: TenantId
    kid: str
    alg: Algorithm
    material: bytes
    created_at: float

    def public_dict(self) -> dict[str, Any]:
        """What lists show: never the HS256 secret."""
        return {"tenant": self.tenant, "kid": self.kid, "alg": self.alg, "created_at": self.created_at}

    def to_bytes(self) -> bytes:
        return orjson.dumps({**self.public_dict(), "material": base64.b64encode(self.material).decode()})

    @classmethod
    def from_bytes(cls, raw: bytes) -> JwtKey:
        doc = orjson.loads(raw)
        return cls(
            TenantId(doc["tenant"]),
            doc["kid"],
            doc["alg"],
            base64.b64decode(doc["material"]),
            float(doc["created_at"]),
        )


def load_verification_key(alg: str, material: bytes) -> VerificationKey:
    """Check that ``material`` is a usable key for ``alg`` and load it; InvalidRequest if not."""
    if alg not in ALGORITHMS:
        raise InvalidRequest(f"unsupported algorithm {alg!r}; expected one of {', '.join(ALGORITHMS)}")
    if alg == "HS256":
        if len(material) < MIN_HMAC_BYTES:
            raise InvalidRequest(f"an HS256 secret needs at least {MIN_HMAC_BYTES} bytes")
        if b"-----BEGIN" in material:
            raise InvalidRequest("an HS256 secret must not be a PEM key")
        return material
    try:
        key = serialization.load_pem_public_key(material)
    except ValueError as exc:
        raise InvalidRequest(f"{alg} needs a PEM public key (not a private key or certificate)") from exc
    if alg == "RS256" and isinstance(key, rsa.RSAPublicKey):
        if key.key_size < MIN_RSA_BITS:
            raise InvalidRequest(f"an RS256 key needs at least {MIN_RSA_BITS} bits")
        return key
    if alg == "ES256" and isinstance(key, ec.EllipticCurvePublicKey) and key.curve.name == "secp256r1":
        return key
    if alg == "EdDSA" and isinstance(key, ed25519.Ed25519PublicKey | ed448.Ed448PublicKey):
        return key
    expected = {"RS256": "an RSA", "ES256": "a P-256 EC", "EdDSA": "an Ed25519 or Ed448"}[alg]
    raise InvalidRequest(f"{alg} needs {expected} public key")


def is_valid_kid(kid: str) -> bool:
    return _KID.fullmatch(kid) is not None


def _storage_key(tenant: str, kid: str) -> str:
    # Tenant names never contain "/", so the prefix "<tenant>/" lists exactly one tenant.
    return f"{tenant}/{kid}"


class JwtKeyStore:
    """Register, look up, list and remove keys. ``on_change(tenant, kid)`` runs after every change."""

    def __init__(
        self, backend: MetadataStore, on_change: Callable[[TenantId, str], None] | None = None
    ) -> None:
        self._backend = backend
        self._on_change = on_change

    async def add(self, tenant: str, kid: str, alg: str, material: bytes) -> JwtKey:
        """Register a key; InvalidRequest if the kid is taken, reserved or the key is unusable."""
        if not is_valid_kid(kid):
            raise InvalidRequest("a kid is 1-256 printable ASCII characters without spaces")
        if kid.startswith(RESERVED_PREFIX):
            raise InvalidRequest(f"kids starting with {RESERVED_PREFIX!r} are reserved for the gateway")
        load_verification_key(alg, material)
        if await self._backend.meta_get(tenants.NAMESPACE, tenant) is None:
            raise NotFound(f"tenant {tenant!r} not found")
        key = JwtKey(TenantId(tenant), kid, cast(Algorithm, alg), material, time.time())
        if not await self._put_new(key):
            raise InvalidRequest(f"tenant {tenant!r} already has a key with kid {kid!r}")
        return key

    async def get(self, tenant: str, kid: str) -> JwtKey | None:
        raw = await self._backend.meta_get(NAMESPACE, _storage_key(tenant, kid))
        return None if raw is None else JwtKey.from_bytes(raw)

    async def list_for_tenant(self, tenant: str) -> list[JwtKey]:
        rows = await self._backend.meta_list(NAMESPACE, _storage_key(tenant, ""))
        return [JwtKey.from_bytes(raw) for _, raw in rows]

    async def remove(self, tenant: str, kid: str) -> None:
        """Remove a key; tokens it signed stop working. Removing :data:`MINTING_KID`
        invalidates every minted token of the tenant (a new secret is made on the next mint)."""
        if not await self._backend.meta_delete(NAMESPACE, _storage_key(tenant, kid)):
            raise NotFound(f"tenant {tenant!r} has no key with kid {kid!r}")
        self._changed(TenantId(tenant), kid)

    async def minting_key(self, tenant: TenantId) -> JwtKey:
        """The tenant's gateway-held HS256 signing key, made on first use."""
        key = await self.get(tenant, MINTING_KID)
        if key is not None:
            return key
        key = JwtKey(tenant, MINTING_KID, "HS256", secrets.token_bytes(32), time.time())
        if await self._put_new(key):
            return key
        # Another process made it first: use theirs, so both sign with the same secret.
        stored = await self.get(tenant, MINTING_KID)
        if stored is None:
            raise InvalidRequest("the minting key vanished while being created; retry")
        return stored

    async def _put_new(self, key: JwtKey) -> bool:
        stored = await self._backend.meta_put(
            NAMESPACE, _storage_key(key.tenant, key.kid), key.to_bytes(), only_if_absent=True
        )
        if stored:
            self._changed(key.tenant, key.kid)
        return stored

    def _changed(self, tenant: TenantId, kid: str) -> None:
        if self._on_change is not None:
            self._on_change(tenant, kid)
