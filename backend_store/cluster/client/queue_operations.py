"""The queue operations of ``QueueStore`` on the cluster (create, read, list, change, delete,
purge): the queue's record is etcd's (:mod:`.metadata`), its counts the sum of its partitions'.
A part of :class:`~.cluster_backend.ClusterBackend`, which provides the attributes below."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from ...attributes import check_queue_name, parse_attributes
from ...errors import PushgateError, QueueNotFound, Unavailable
from ...types import QueueInfo, QueueName, TenantId
from ..coordination.queue_record import store_attributes
from .cluster_settings import ClusterSettings
from .metadata import ClusterMetadata, QueueRecord
from .partition_calls import PartitionCalls
from .partition_map import ClusterView, PartitionInfo
from .pool_slots import PoolSlots
from .queue_parts import QueueParts, sum_stats

log = logging.getLogger("pushgate.cluster")

# Rounds of create (or delete) against a record another gateway keeps changing.
_CREATE_ATTEMPTS = 5


class QueueOperations:
    settings: ClusterSettings
    metadata: ClusterMetadata
    view: ClusterView
    calls: PartitionCalls
    queue_parts: QueueParts
    pool_slots: PoolSlots

    async def create_queue(
        self, tenant: TenantId, name: QueueName, attributes: Mapping[str, Any]
    ) -> tuple[QueueInfo, bool]:
        if "replication_factor" not in attributes:
            attributes = {**attributes, "replication_factor": self.settings.replication_factor}
        check_queue_name(name)
        attrs = parse_attributes(attributes)
        # Placed before the record exists, so record and placement are one write. An
        # existing queue keeps its own placement (the placement is no attribute).
        placement = await self.pool_slots.place(tenant, name, attrs)
        for _ in range(_CREATE_ATTEMPTS):
            record, created = await self.metadata.create_queue(tenant, name, attributes, placement=placement)
            if not record.deleting:
                break
            # A deletion a gateway left half-way: finish it, then create the queue anew.
            await self._finish_deletion(record)
        else:
            raise Unavailable(f"queue {name!r} is being deleted and created again elsewhere; retry")
        if record.placement is None:
            # A queue made before pools: usable once the manager placed its partitions and
            # each has a leader holding it; until then sends would only wait for that anyway.
            count, revision = record.attributes.partitions, record.create_revision
            placed = await self.view.wait_for(
                lambda m: m.complete(tenant, name, count, revision), self.settings.placement_wait_s
            )
            if not placed:
                log.warning(
                    "queue %s/%s: partitions not placed within %.0fs",
                    tenant,
                    name,
                    self.settings.placement_wait_s,
                )
                return QueueInfo(tenant, name, record.created_at, record.attributes), created
        if created and record.placement is not None:
            # A metadata write: its record is the queue. Each leader of its placement makes
            # it in its store when its watch brings the record, in one group commit with the
            # other queues new since its last pass (pool_queues.py), or sooner, when a
            # request names it first (the leader waits for its watch to bring the record:
            # PartitionCalls.call). Asking each leader to make it here, a request and a
            # replicated write each, cost each node twice its CPU a create: the cluster made
            # 0.49x the embedded store's creates a second, 0.55-0.65x since (issue 49,
            # bench/README.md, "Session 73"). A new queue holds nothing: no counts to ask for.
            return QueueInfo(record.tenant, record.name, record.created_at, record.attributes), created
        # The first answer from each leader says its store holds the queue (a leader that has
        # yet to apply the record answers not_leader, which the call retries).
        return await self._with_stats(record), created

    async def get_queue(self, tenant: TenantId, name: QueueName) -> QueueInfo:
        """The record from the watched copy, as sends and receives route by it (etcd only for
        a queue this gateway has not seen yet), and the counts from each partition holding
        its messages: one request per partition, where a linearizable etcd read came first
        (issue 49: a GET's p50 15 ms at 10,000 queues). Another gateway's change shows within
        the watch's delay; this gateway's own at once (read your writes)."""
        return await self._with_stats(await self.queue_parts.record(tenant, name))

    async def list_queues(
        self, tenant: TenantId, *, after: str = "", limit: int | None = None, prefix: str = ""
    ) -> list[QueueInfo]:
        records = self.metadata.page(tenant, after=after, limit=limit, prefix=prefix)
        return await self.queue_parts.stats_of(records)

    async def update_queue(self, tenant: TenantId, name: QueueName, changes: Mapping[str, Any]) -> QueueInfo:
        record = await self.metadata.update_queue(tenant, name, changes)
        # Partition leaders apply etcd's attributes to their stores when the watch tells
        # them; telling them now as well means the change holds when this call returns.
        plain = store_attributes(changes)
        if plain:
            await self.queue_parts.each_partition(
                record, "update_queue", retry_unknown=True, name=name, changes=plain
            )
        return await self._with_stats(record)

    async def delete_queue(self, tenant: TenantId, name: QueueName) -> None:
        record = await self.metadata.queue(tenant, name)
        if record.placement is not None:
            for _ in range(_CREATE_ATTEMPTS):
                marked = await self.metadata.mark_deleting(record)
                if marked is not None:
                    await self._finish_deletion(marked)
                    return
                record = await self.metadata.queue(tenant, name)  # changed meanwhile
            raise Unavailable(f"queue {name!r} changed too often to delete it; retry")
        # A queue on partitions of its own: its partitions before the record goes (the
        # manager drops them as soon as it sees that, and our map may lose them before the
        # next line runs). Unplaced ones hold nothing.
        holders = [p for p in self.queue_parts.holders(record) if p.id >= 0]
        await self.metadata.delete_queue(tenant, name)
        # Deleting the queue in them now makes its receipts stop working at once. Best
        # effort: a partition being dropped anyway answers queue_not_found
        # (_check_still_placed), at once.
        await self._delete_in(holders, name)

    async def _finish_deletion(self, marked: QueueRecord) -> None:
        """Delete a queue whose record is marked ``deleting``: in every partition holding it
        (its placement; for a dead-letter queue, the partitions of the queues feeding it,
        whose stores keep its dead letters: left there, poison messages would keep moving
        into a queue nobody can read), then its record. The placement's leaders also
        delete it on the mark alone, should this gateway stop half-way."""
        await self._delete_in(self.queue_parts.holders(marked), marked.name)
        with contextlib.suppress(QueueNotFound):  # another gateway finished it first
            await self.metadata.delete_queue(marked.tenant, marked.name, marked.mod_revision)

    async def _delete_in(self, holders: Sequence[PartitionInfo], name: QueueName) -> None:
        results = await asyncio.gather(
            *(self.calls.call(p, "delete_queue", retry_unknown=True, name=name) for p in holders),
            return_exceptions=True,
        )
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, PushgateError):
                raise result

    async def purge_queue(self, tenant: TenantId, name: QueueName) -> int:
        record = await self.queue_parts.record(tenant, name)
        counts = await self.queue_parts.each_holder(record, "purge_queue", name=name)
        return sum(int(c) for c in counts)

    async def _with_stats(self, record: QueueRecord) -> QueueInfo:
        infos = await self.queue_parts.each_holder(record, "get_queue", retry_unknown=True, name=record.name)
        stats = sum_stats([i.stats for i in infos])
        return QueueInfo(record.tenant, record.name, record.created_at, record.attributes, stats)
