"""The queue operations of ``QueueStore`` on the cluster (create, read, list, change, delete,
purge): the queue's record is etcd's (:mod:`.metadata`), its counts the sum of its partitions'.
A part of :class:`~.cluster_backend.ClusterBackend`, which provides the attributes below."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from ...errors import PushgateError
from ...types import QueueInfo, QueueName, QueueStats, TenantId
from ..coordination.queue_record import store_attributes
from .cluster_settings import ClusterSettings
from .metadata import ClusterMetadata, QueueRecord
from .partition_calls import PartitionCalls
from .partition_map import ClusterView
from .queue_parts import QueueParts

log = logging.getLogger("pushgate.cluster")


class QueueOperations:
    settings: ClusterSettings
    metadata: ClusterMetadata
    view: ClusterView
    calls: PartitionCalls
    queue_parts: QueueParts

    async def create_queue(
        self, tenant: TenantId, name: QueueName, attributes: Mapping[str, Any]
    ) -> tuple[QueueInfo, bool]:
        if "replication_factor" not in attributes:
            attributes = {**attributes, "replication_factor": self.settings.replication_factor}
        record, created = await self.metadata.create_queue(tenant, name, attributes)
        # The queue is usable once the manager placed its partitions and each has a leader
        # holding it; until then sends would only wait for that anyway.
        count, revision = record.attributes.partitions, record.create_revision
        placed = await self.view.wait_for(
            lambda m: m.complete(tenant, name, count, revision), self.settings.placement_wait_s
        )
        if placed:
            # The first answer from each leader says its store holds the queue.
            return await self._with_stats(record), created
        log.warning(
            "queue %s/%s: partitions not placed within %.0fs", tenant, name, self.settings.placement_wait_s
        )
        return QueueInfo(tenant, name, record.created_at, record.attributes), created

    async def get_queue(self, tenant: TenantId, name: QueueName) -> QueueInfo:
        return await self._with_stats(await self.metadata.queue(tenant, name))

    async def list_queues(self, tenant: TenantId) -> list[QueueInfo]:
        records = await self.metadata.list_queues(tenant)
        return list(await asyncio.gather(*(self._with_stats(r) for r in records)))

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
        # Its partitions before the record goes: the manager drops them as soon as it sees
        # that, and our map may lose them before the next line runs. Unplaced ones hold nothing.
        # A dead-letter queue also has a copy in each partition of the queues feeding it
        # (_holders): deleted there too, or their poison messages would keep moving into a
        # queue nobody can read any more (the embedded store keeps them in the source).
        placed = [p for p in self.queue_parts.holders(record) if p.id >= 0]
        await self.metadata.delete_queue(tenant, name)
        # The manager drops the partitions; deleting the queue in them now makes its
        # receipts stop working at once. Best effort: a partition being dropped anyway
        # answers queue_not_found (_check_still_placed), at once.
        results = await asyncio.gather(
            *(self.calls.call(p, "delete_queue", retry_unknown=True, name=name) for p in placed),
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
        stats = _sum_stats([i.stats for i in infos])
        return QueueInfo(record.tenant, record.name, record.created_at, record.attributes, stats)


def _sum_stats(parts: Sequence[QueueStats]) -> QueueStats:
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
