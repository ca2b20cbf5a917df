"""Where a queue's data is in the cluster: its record, its partitions and the partitions that
hold its messages, and the partition a receipt names. Shared by the queue, message and push
operations of :class:`~.cluster_backend.ClusterBackend`; reads only the watched metadata and
map (and etcd for a queue this gateway has not seen), and calls through :class:`.PartitionCalls`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from ...errors import Unavailable
from ...types import QueueInfo, QueueName, QueueStats, TenantId
from .metadata import ClusterMetadata, QueueRecord
from .partition_calls import PartitionCalls
from .partition_map import ClusterView, PartitionInfo, bind_to_queue
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
        """The queue's partitions by index, each bound to the queue (its tenant, name, index
        and incarnation: what calls carry). A placed queue's are its pool partitions
        (``placement``); a queue made before pools has its own, with a placeholder for each
        one not placed yet (its calls wait for the manager)."""
        revision = record.create_revision
        if record.placement == ():
            raise Unavailable(f"queue {record.name!r} has a placement this gateway cannot read")
        if record.placement is not None:
            return [self._placed(record, i, pid) for i, pid in enumerate(record.placement)]
        placed = {p.index: p for p in self.view.map.of_queue(record.tenant, record.name, revision)}
        return [
            placed.get(i)
            or PartitionInfo(-1, record.tenant, record.name, i, (), None, "sync", queue_revision=revision)
            for i in range(record.attributes.partitions)
        ]

    def _placed(self, record: QueueRecord, index: int, pid: int) -> PartitionInfo:
        """Pool partition ``pid``, the queue's partition ``index``, bound to the queue."""
        part = self.view.map.partitions.get(pid)
        return bind_to_queue(part, pid, record.tenant, record.name, index, record.create_revision)

    def own(self, record: QueueRecord) -> list[PartitionInfo]:
        """The queue's partitions, each once: :meth:`parts` less the indexes that share a
        pool partition with a lower one (a queue with more partitions than its pool). What
        asks each store of the queue once (its counts, a create, a purge) goes here."""
        parts = self.parts(record)
        if record.placement is None:
            return parts  # its own partitions (placeholders, id -1, for those not placed yet)
        distinct: dict[int, PartitionInfo] = {}
        for part in parts:
            distinct.setdefault(part.id, part)  # the lowest index's binding
        return list(distinct.values())

    def holders(self, record: QueueRecord) -> list[PartitionInfo]:
        """Partitions holding messages of the queue: its own, and (for a dead-letter queue)
        those of the queues that dead-letter into it or did before their ``dead_letter_queue``
        changed, whose stores keep their dead letters (bound to those queues; only those in
        the map; each partition once). O(sources): the metadata indexes who feeds whom."""
        parts = self.own(record)
        seen = {p.id for p in parts}
        for source in self.metadata.dead_letter_sources(record):
            if source.placement == ():
                continue  # unreadable: placed nowhere this gateway can reach
            for part in self.own(source):
                # A pool partition holds one copy of the dead-letter queue, however many of
                # its queues feed it (and it may be the queue's own): asked once.
                if part.id in self.view.map.partitions and part.id not in seen:
                    seen.add(part.id)
                    parts.append(part)
        return parts

    async def each_partition(
        self, record: QueueRecord, op: str, *, retry_unknown: bool = False, **kwargs: Any
    ) -> list[Any]:
        """``op`` on each of the queue's own partitions (:meth:`own`), together; their answers in order."""
        calls = (self.calls.call(p, op, retry_unknown=retry_unknown, **kwargs) for p in self.own(record))
        return list(await asyncio.gather(*calls))

    async def each_holder(
        self, record: QueueRecord, op: str, *, retry_unknown: bool = False, **kwargs: Any
    ) -> list[Any]:
        """``op`` on each partition holding the queue's messages (:meth:`holders`), together."""
        calls = (self.calls.call(p, op, retry_unknown=retry_unknown, **kwargs) for p in self.holders(record))
        return list(await asyncio.gather(*calls))

    async def stats_of(self, records: Sequence[QueueRecord]) -> list[QueueInfo]:
        """Each queue with its counts, summed over the partitions holding its messages. A
        pool partition is asked once for all the queues of ``records`` it holds
        (``queue_stats``); a queue's own partition (made before pools) gets ``get_queue``, as
        nodes of any version answer it. So a page of queues costs a request per partition,
        not per queue, and each pool partition is bound once per page: binding a partition
        to each queue of a page of 1,000 was most of the gateway's CPU for the page."""
        shared: dict[int, tuple[PartitionInfo, list[QueueName]]] = {}
        own: list[tuple[QueueName, PartitionInfo]] = []
        for record in records:
            if record.placement and not self.metadata.index.sources(record.tenant, record.name):
                # Its placement names every partition holding its messages (no queue
                # dead-letters into it): what :meth:`holders` gives, bound only where new.
                for index, pid in enumerate(record.placement):
                    entry = shared.get(pid)
                    if entry is None:
                        entry = shared[pid] = (self._placed(record, index, pid), [])
                    if not entry[1] or entry[1][-1] != record.name:  # once, however many indexes share it
                        entry[1].append(record.name)
                continue
            for part in self.holders(record):
                if part.placed:
                    shared.setdefault(part.id, (part, []))[1].append(record.name)
                else:
                    own.append((record.name, part))
        shared_calls = [
            self.calls.call(part, "queue_stats", retry_unknown=True, names=names)
            for part, names in shared.values()
        ]
        own_calls = [self.calls.call(part, "get_queue", retry_unknown=True, name=name) for name, part in own]
        answers = await asyncio.gather(*shared_calls, *own_calls)
        parts: dict[QueueName, list[QueueStats]] = {r.name: [] for r in records}
        for (_, names), answer in zip(shared.values(), answers[: len(shared_calls)], strict=True):
            for name in names:
                found = answer.get(name)
                if found is not None:
                    parts[name].append(found)
        for (name, _), info in zip(own, answers[len(shared_calls) :], strict=True):
            parts[name].append(info.stats)
        return [
            QueueInfo(r.tenant, r.name, r.created_at, r.attributes, sum_stats(parts[r.name])) for r in records
        ]

    def receipt_partition(
        self, tenant: TenantId, receipt: str, queue: QueueName | None
    ) -> tuple[PartitionInfo, str] | None:
        """(the partition, the node's receipt) of a receipt handed out for ``tenant``'s
        ``queue`` (or any of its queues); None if it is not one. A partition is one of the
        queue's if it is its own or in its placement, or holds its dead letters (it is one
        of the queues' feeding it); with no queue given, if a queue of the tenant is there.
        The partition comes bound to ``tenant`` (the call carries it)."""
        split = split_receipt(receipt)
        if split is None:
            return None
        pid, inner = split
        part = self.view.map.partitions.get(pid)
        if part is None:
            return None
        if part.pool is None:  # a queue's own partition (made before pools)
            if part.tenant != tenant:
                return None
            if queue is not None and part.queue != queue:
                # Dead letters of ``queue`` live in the partitions of the queues feeding it.
                source = self.metadata.cached_queue(tenant, part.queue)
                if source is None or source.attributes.dead_letter_queue != queue:
                    return None
            return part, inner
        if queue is None:
            if not self.metadata.index.tenant_on_partition(tenant, pid):
                return None
            return bind_to_queue(part, pid, tenant, QueueName(part.pool), part.index, None), inner
        record = self.metadata.cached_queue(tenant, queue)
        if record is None:
            return None
        for candidate in (record, *self.metadata.dead_letter_sources(record)):
            if candidate.placement is not None and pid in candidate.placement:
                index = candidate.placement.index(pid)
                return bind_to_queue(
                    part, pid, tenant, candidate.name, index, candidate.create_revision
                ), inner
        return None


def sum_stats(parts: Sequence[QueueStats]) -> QueueStats:
    """One queue's counts from those of the partitions holding its messages."""
    if len(parts) == 1:
        return parts[0]
    ages = [s.oldest_age_s for s in parts if s.oldest_age_s is not None]
    return QueueStats(
        visible=sum(s.visible for s in parts),
        in_flight=sum(s.in_flight for s in parts),
        delayed=sum(s.delayed for s in parts),
        oldest_age_s=max(ages) if ages else None,
        sent_total=sum(s.sent_total for s in parts),
        acked_total=sum(s.acked_total for s in parts),
        dead_lettered_total=sum(s.dead_lettered_total for s in parts),
    )
