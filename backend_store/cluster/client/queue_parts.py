"""Where a queue's data is in the cluster: its record, its partitions and the partitions that
hold its messages, and the partition a receipt names. Shared by the queue, message and push
operations of :class:`~.cluster_backend.ClusterBackend`; reads only the watched metadata and
map (and etcd for a queue this gateway has not seen), and calls through :class:`.PartitionCalls`.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ...types import QueueName, TenantId
from .metadata import ClusterMetadata, QueueRecord
from .partition_calls import PartitionCalls
from .partition_map import ClusterView, PartitionInfo
from .routing import split_receipt


class QueueParts:
    def __init__(self, metadata: ClusterMetadata, view: ClusterView, calls: PartitionCalls) -> None:
        self.metadata = metadata
        self.view = view
        self.calls = calls

    async def record(self, tenant: TenantId, queue: QueueName) -> QueueRecord:
        """The queue's record: the watched copy, or etcd when this gateway has not seen it."""
        record = self.metadata.cached_queue(tenant, queue)
        if record is None:
            record = await self.metadata.queue(tenant, queue)
        return record

    def parts(self, record: QueueRecord) -> list[PartitionInfo]:
        """The queue's partitions by index; a placeholder for each one not placed yet (its
        calls wait for the manager)."""
        revision = record.create_revision
        placed = {p.index: p for p in self.view.map.of_queue(record.tenant, record.name, revision)}
        return [
            placed.get(i)
            or PartitionInfo(-1, record.tenant, record.name, i, (), None, "sync", queue_revision=revision)
            for i in range(record.attributes.partitions)
        ]

    def holders(self, record: QueueRecord) -> list[PartitionInfo]:
        """Partitions holding messages of the queue: its own, and (for a dead-letter queue)
        those of the queues that dead-letter into it or did before their ``dead_letter_queue``
        changed, whose stores keep their dead letters."""
        parts = self.parts(record)
        for source in self.metadata.cached_queues(record.tenant):
            if source.holds_dead_letters_of(record):
                parts.extend(self.view.map.of_queue(source.tenant, source.name, source.create_revision))
        return parts

    async def each_partition(
        self, record: QueueRecord, op: str, *, retry_unknown: bool = False, **kwargs: Any
    ) -> list[Any]:
        """``op`` on each of the queue's own partitions, together; their answers in order."""
        calls = (self.calls.call(p, op, retry_unknown=retry_unknown, **kwargs) for p in self.parts(record))
        return list(await asyncio.gather(*calls))

    async def each_holder(
        self, record: QueueRecord, op: str, *, retry_unknown: bool = False, **kwargs: Any
    ) -> list[Any]:
        """``op`` on each partition holding the queue's messages (:meth:`holders`), together."""
        calls = (self.calls.call(p, op, retry_unknown=retry_unknown, **kwargs) for p in self.holders(record))
        return list(await asyncio.gather(*calls))

    def receipt_partition(
        self, tenant: TenantId, receipt: str, queue: QueueName | None
    ) -> tuple[int, str] | None:
        """(partition id, the node's receipt) of a receipt handed out for ``tenant``'s
        ``queue`` (or any of its queues); None if it is not one."""
        split = split_receipt(receipt)
        if split is None:
            return None
        part = self.view.map.partitions.get(split[0])
        if part is None or part.tenant != tenant:
            return None
        if queue is not None and part.queue != queue:
            # Dead letters of ``queue`` live in the partitions of the queues feeding it.
            source = self.metadata.cached_queue(tenant, part.queue)
            if source is None or source.attributes.dead_letter_queue != queue:
                return None
        return split
