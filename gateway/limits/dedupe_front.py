"""The dedupe front: a shared cache of recent ``dedupe_id`` results in front of the store.

A producer that retries a send (through any gateway) with the same ``dedupe_id`` inside
the queue's ``dedupe_window_s`` gets the original ``id`` and ``seq`` with
``duplicate: true`` from the cache, without a store commit. The store's durable dedupe
index stays the truth: a miss (or Redis down) goes to the store, which deduplicates
anyway, so the front can only save work, never change an answer. Only explicit
``dedupe_id``s (and ``Idempotency-Key``) are cached, not ``content_dedupe`` hashes.

Keys carry the queue's ``created_at``, so a queue deleted and created again does not
inherit the old queue's entries.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import orjson

from backend_store.backend import QueueStore
from backend_store.errors import PushgateError
from backend_store.types import MessageId, NewMessage, QueueName, SendResult, TenantId
from throttling import SharedCache

from ..queue_cache import QueueCache


class DedupeFront:
    """The send path's store call (push/send_path.py ``StoreSend``) for every transport."""

    def __init__(
        self,
        cache: SharedCache,
        queues: QueueCache,
        backend: QueueStore,
        on_hits: Callable[[int], None] | None = None,
    ) -> None:
        self.cache = cache
        self.queues = queues
        self._backend = backend
        self._on_hits = on_hits

    async def send(
        self, tenant: TenantId, queue: QueueName, entries: Sequence[NewMessage]
    ) -> list[SendResult | PushgateError]:
        """``Backend.send`` with the front: cached duplicates are answered here, in order."""
        backend = self._backend
        keyed = [i for i, e in enumerate(entries) if e.dedupe_id is not None]
        if not keyed:
            return await backend.send(tenant, queue, entries)
        info = await self.queues.get(tenant, queue)
        window = info.attributes.dedupe_window_s
        if window <= 0:
            return await backend.send(tenant, queue, entries)
        prefix = f"{tenant}\0{queue}\0{info.created_at!r}\0"
        keys = {i: prefix + str(entries[i].dedupe_id) for i in keyed}
        cached = await self.cache.get_many(list(keys.values()))
        hits: dict[int, SendResult] = {}
        for i, raw in zip(keyed, cached, strict=True):
            if raw is not None:
                message_id, seq = orjson.loads(raw)
                hits[i] = SendResult(MessageId(message_id), seq, duplicate=True)
        if hits and self._on_hits is not None:
            self._on_hits(len(hits))
        rest = [e for i, e in enumerate(entries) if i not in hits]
        stored = iter(await backend.send(tenant, queue, rest) if rest else [])
        results: list[SendResult | PushgateError] = []
        remember = []
        for i in range(len(entries)):
            result = hits.get(i) or next(stored)
            results.append(result)
            if i in keys and i not in hits and isinstance(result, SendResult) and not result.duplicate:
                remember.append(self.cache.put(keys[i], orjson.dumps([result.id, result.seq]), window))
        await asyncio.gather(*remember)
        return results
