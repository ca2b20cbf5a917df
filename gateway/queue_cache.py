"""The front-end cache of queue metadata.

Hot requests need a queue's attributes (a receive's default long-poll wait, a send's dedupe
window) but not its stats, so they read them from here instead of the store. This gateway
invalidates an entry whenever it changes the queue; a short TTL bounds how long a change made
elsewhere (another gateway, ``pushgate admin delete-queue``) goes unseen.

On a backend that watches its metadata (``MetadataWatch``: the cluster), a miss is answered
from the watched queue record, with no request to any node (``get_queue`` there asks every
partition of the queue for its stats); the watch also drops an entry the moment another
gateway changes the queue. Only a queue the watch has not shown yet is read with
``get_queue``. Entries' stats are not for reading: they are empty on the cluster.
"""

from __future__ import annotations

import time

from backend_store.backend import MetadataWatch, QueueStore
from backend_store.types import QueueInfo, QueueName, TenantId

_Key = tuple[TenantId, QueueName]


class QueueCache:
    def __init__(self, backend: QueueStore, ttl_s: float = 5.0, max_entries: int = 10_000) -> None:
        self._backend = backend
        self._watched = backend if isinstance(backend, MetadataWatch) else None
        self._ttl = ttl_s
        self._max = max_entries
        self._entries: dict[_Key, tuple[float, QueueInfo]] = {}

    async def get(self, tenant: TenantId, name: QueueName) -> QueueInfo:
        """The queue's name, creation time and attributes, perhaps up to the TTL old; raises
        ``QueueNotFound``."""
        key = (tenant, name)
        now = time.monotonic()
        entry = self._entries.get(key)
        if entry is not None and entry[0] > now:
            return entry[1]
        info = None if self._watched is None else self._watched.watched_queue(tenant, name)
        if info is None:
            info = await self._backend.get_queue(tenant, name)
        self.put(info, now)
        return info

    def put(self, info: QueueInfo, now: float | None = None) -> None:
        if len(self._entries) >= self._max:
            # Crude but bounded: a full cache starts over rather than tracking recency per hit.
            self._entries.clear()
        expires = (time.monotonic() if now is None else now) + self._ttl
        self._entries[(info.tenant, info.name)] = (expires, info)

    def invalidate(self, tenant: TenantId, name: QueueName) -> None:
        self._entries.pop((tenant, name), None)

    def __len__(self) -> int:
        return len(self._entries)
