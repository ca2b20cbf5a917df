"""API keys: ``pgk_<key_id>_<secret>`` tokens, stored as a SHA-256 hash and shown once.

The secret is 256 random bits, so a plain SHA-256 is the right hash: a slow password
hash protects guessable secrets, and these are not guessable. The ``key_id`` is not
secret; it names the key in lists, logs, revocation and per-key rate limits.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

import orjson

from backend_store.backend import MetadataStore
from backend_store.errors import NotFound
from backend_store.types import TenantId

from . import tenants
from .scopes import parse_scopes

NAMESPACE = "api_keys"
PREFIX = "pgk_"
_TOKEN = re.compile(r"pgk_([0-9a-f]{16})_([A-Za-z0-9_-]{43})")


def is_api_key(token: str) -> bool:
    """Whether a bearer token looks like an API key (rather than a JWT)."""
    return token.startswith(PREFIX)


def key_id_of(token: str) -> str | None:
    """The key id of a well-formed API key token, else None."""
    match = _TOKEN.fullmatch(token)
    return match.group(1) if match else None


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class ApiKey:
    """A stored key: everything but the secret."""

    key_id: str
    tenant: TenantId
    scopes: frozenset[str]
    token_hash: str
    created_at: float
    revoked_at: float | None = None

    def matches(self, token: str) -> bool:
        """Whether ``token`` is this key's token (constant time)."""
        return hmac.compare_digest(self.token_hash, hash_token(token))

    def public_dict(self) -> dict[str, Any]:
        """What ``key list`` shows: no secret, no hash."""
        return {
            "key_id": self.key_id,
            "tenant": self.tenant,
            "scopes": sorted(self.scopes),
            "created_at": self.created_at,
            "revoked_at": self.revoked_at,
        }

    def to_bytes(self) -> bytes:
        return orjson.dumps({**self.public_dict(), "token_hash": self.token_hash})

    @classmethod
    def from_bytes(cls, raw: bytes) -> ApiKey:
        doc = orjson.loads(raw)
        return cls(
            key_id=doc["key_id"],
            tenant=TenantId(doc["tenant"]),
            scopes=frozenset(doc["scopes"]),
            token_hash=doc["token_hash"],
            created_at=float(doc["created_at"]),
            revoked_at=None if doc.get("revoked_at") is None else float(doc["revoked_at"]),
        )


class ApiKeyStore:
    """Create, look up, list and revoke keys. ``on_change(key_id)`` runs after every change."""

    def __init__(self, backend: MetadataStore, on_change: Callable[[str], None] | None = None) -> None:
        self._backend = backend
        self._on_change = on_change

    async def create(self, tenant: str, scopes: str | Iterable[str]) -> tuple[ApiKey, str]:
        """Create a key for an existing tenant; return it and its token (the only time it exists)."""
        parsed = parse_scopes(scopes)
        if await self._backend.meta_get(tenants.NAMESPACE, tenant) is None:
            raise NotFound(f"tenant {tenant!r} not found")
        while True:
            key_id = secrets.token_hex(8)
            token = f"{PREFIX}{key_id}_{secrets.token_urlsafe(32)}"
            key = ApiKey(key_id, TenantId(tenant), parsed, hash_token(token), time.time())
            # A 64-bit id collides about never; only_if_absent makes "never" certain.
            if await self._backend.meta_put(NAMESPACE, key_id, key.to_bytes(), only_if_absent=True):
                return key, token

    async def get(self, key_id: str) -> ApiKey | None:
        raw = await self._backend.meta_get(NAMESPACE, key_id)
        return None if raw is None else ApiKey.from_bytes(raw)

    async def list_for_tenant(self, tenant: str) -> list[ApiKey]:
        """A tenant's keys, revoked ones included, sorted by creation time."""
        keys = [ApiKey.from_bytes(raw) for _, raw in await self._backend.meta_list(NAMESPACE)]
        return sorted((k for k in keys if k.tenant == tenant), key=lambda k: (k.created_at, k.key_id))

    async def revoke(self, key_id: str) -> ApiKey:
        """Mark a key revoked (kept for audit); revoking twice is fine. NotFound if unknown."""
        key = await self.get(key_id)
        if key is None:
            raise NotFound(f"API key {key_id!r} not found")
        if key.revoked_at is None:
            key = replace(key, revoked_at=time.time())
            await self._backend.meta_put(NAMESPACE, key_id, key.to_bytes())
        if self._on_change is not None:
            self._on_change(key_id)
        return key
