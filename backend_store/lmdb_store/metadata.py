"""The embedded store's metadata (:class:`~backend_store.backend.MetadataStore`): opaque
values per namespace in the ``meta`` database, under ``namespace \\0 key``; the store's own
records there begin with ``\\0sys\\0``, which no namespace can."""

from __future__ import annotations

from ..errors import InvalidRequest
from .environment import Db, View, Writes
from .store_core import StoreCore

_MAX_KEY_BYTES = 400


def _meta_key(namespace: str, key: str) -> bytes:
    if not namespace or "\0" in namespace or "\0" in key:
        raise InvalidRequest("metadata namespace must be non-empty and names free of NUL")
    try:
        raw = namespace.encode() + b"\0" + key.encode()
    except UnicodeEncodeError:
        raise InvalidRequest("metadata names must be valid Unicode") from None
    if len(raw) > _MAX_KEY_BYTES:
        raise InvalidRequest(f"metadata names must fit in {_MAX_KEY_BYTES} bytes")
    return raw


class MetadataRole(StoreCore):
    """Reads in a read transaction; writes, each one operation of the writer's next batch."""

    async def meta_get(self, namespace: str, key: str) -> bytes | None:
        meta_key = _meta_key(namespace, key)
        return await self._read(lambda v: v.get(Db.META, meta_key))

    async def meta_put(self, namespace: str, key: str, value: bytes, *, only_if_absent: bool = False) -> bool:
        meta_key = _meta_key(namespace, key)

        def put(w: Writes, now: float) -> bool:
            if only_if_absent and w.get(Db.META, meta_key) is not None:
                return False
            w.put(Db.META, meta_key, value)
            return True

        return await self._write(put)

    async def meta_delete(self, namespace: str, key: str) -> bool:
        meta_key = _meta_key(namespace, key)
        return await self._write(lambda w, now: w.delete(Db.META, meta_key))

    async def meta_list(self, namespace: str, prefix: str = "") -> list[tuple[str, bytes]]:
        start = _meta_key(namespace, prefix)
        skip = len(namespace.encode()) + 1

        def read(v: View) -> list[tuple[str, bytes]]:
            out: list[tuple[str, bytes]] = []
            cursor = v.cursor(Db.META)
            if cursor.set_range(start):
                for key, value in cursor:
                    if not key.startswith(start):
                        break
                    out.append((key[skip:].decode(), value))
            return out

        return await self._read(read)
