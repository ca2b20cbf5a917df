"""The front-end cache of queue metadata.

Hot requests need a queue's attributes (a receive's default long-poll wait) but not
its stats, so they read them from here instead of the store. This gateway invalidates
an entry whenever it changes the queue; a short TTL bounds how long a change made
elsewhere (another gateway, ``pushgate admin delete-queue``) goes unseen.
"""

from __future__ import annotations

import time

from backend_store.backend import Backend
from backend_store.types import QueueInfo, QueueName, TenantId

_Key = tuple[TenantId, QueueName]


class QueueCache:
    def __init__(self, backend: Backend, ttl_s: float = 5.0, max_entries: int = 10_000) -> None:
        self._backend = backend
        self._ttl = ttl_s
        self._max = max_entries
        self._entries: dict[_Key, tuple[float, QueueInfo]] = {}

    async def get(self, tenant: TenantId, name: QueueName) -> QueueInfo:
        """The queue's metadata, perhaps up to the TTL old; raises ``QueueNotFound``."""
        key = (tenant, name)
        now = time.monotonic()
        entry = self._entries.get(key)
        if entry is not None and entry[0] > now:
            return entry[1]
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
