"""AWS credentials for an API key: an access key id and a secret SigV4 can be checked with.

An API key is stored as a hash, which is enough to check a bearer token but not a SigV4
signature: that is an HMAC keyed by the secret itself, so the secret must be stored so it
can be read back. It is sealed under the encryption-at-rest keyring when one is configured
(AES-GCM, bound to its access key id), kept as is otherwise, and never logged or shown
again after ``pushgate admin key create --aws`` prints it. The credentials act as their API
key: same tenant, same scopes, revoked with it.
"""

from __future__ import annotations

import base64
import secrets

import orjson

from backend_store.backend import MetadataStore
from backend_store.encryption import Keyring

from .ttl_cache import TtlCache

NAMESPACE = "aws_keys"
# AWS access key ids are 20 upper-case characters; "PG" names Pushgate's, then the key id.
ACCESS_KEY_PREFIX = "AKPG"
# How long a gateway keeps a secret it read (an access key id's secret never changes; whether
# its API key still holds is asked on every request, through the API key cache).
SECRET_CACHE_TTL_S = 60.0


def access_key_id_for(key_id: str) -> str:
    """The access key id of an API key (its 16 hex digits, upper case, after AKPG)."""
    return ACCESS_KEY_PREFIX + key_id.upper()


class AwsKeyStore:
    """Create and read the AWS secret of an API key."""

    def __init__(self, backend: MetadataStore, keyring: Keyring | None = None) -> None:
        self._backend = backend
        self._keyring = keyring
        # Every SQS request needs the secret: a store read (a worker thread's hop) per request
        # was most of what SQS cost over /v1. Unknown ids are not cached (anyone could fill it).
        self._cache: TtlCache[str, tuple[str, str] | None] = TtlCache(SECRET_CACHE_TTL_S)

    async def create(self, key_id: str) -> tuple[str, str]:
        """Store a new secret for the API key ``key_id``; return its access key id and secret."""
        access_key_id = access_key_id_for(key_id)
        secret = secrets.token_urlsafe(30)
        doc: dict[str, str] = {"key_id": key_id}
        if self._keyring is not None:
            sealed = self._keyring.seal(secret.encode(), access_key_id.encode())
            doc["sealed_secret"] = base64.b64encode(sealed).decode()
        else:
            doc["secret"] = secret
        await self._backend.meta_put(NAMESPACE, access_key_id, orjson.dumps(doc))
        return access_key_id, secret

    async def any_stored(self) -> bool:
        """Whether the store holds any AWS credentials at all."""
        return bool(await self._backend.meta_list(NAMESPACE))

    async def get(self, access_key_id: str) -> tuple[str, str] | None:
        """The API key id and the secret behind an access key id, or None if it is unknown."""
        if not access_key_id.startswith(ACCESS_KEY_PREFIX) or len(access_key_id) > 64:
            return None
        found, _ = await self._cache.load(
            access_key_id, lambda: self._read(access_key_id), keep=lambda v: v is not None
        )
        return found

    async def _read(self, access_key_id: str) -> tuple[str, str] | None:
        raw = await self._backend.meta_get(NAMESPACE, access_key_id)
        if raw is None:
            return None
        doc = orjson.loads(raw)
        if "sealed_secret" in doc:
            if self._keyring is None:
                return None  # sealed by a gateway with keys this one was not given
            secret = self._keyring.open(
                base64.b64decode(doc["sealed_secret"]), access_key_id.encode()
            ).decode()
        else:
            secret = doc["secret"]
        return str(doc["key_id"]), secret
