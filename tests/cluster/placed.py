"""Where a queue's partitions are, for tests that look at them (docs/cluster.md, "Shared
partitions"): a queue made through a gateway lives on pool partitions (its placement), one
written into etcd as before pools on partitions of its own."""

from __future__ import annotations

from collections.abc import Sequence

from backend_store.cluster.client.cluster_backend import ClusterBackend
from backend_store.cluster.client.partition_map import PartitionInfo
from backend_store.cluster.node.node import Node
from backend_store.cluster.node.partition_host import PartitionHost
from backend_store.types import QueueName, TenantId


def queue_partitions(backend: ClusterBackend, tenant: TenantId, queue: QueueName) -> list[PartitionInfo]:
    """The queue's partitions by index as ``backend`` routes to them (those in its map)."""
    record = backend.metadata.cached_queue(tenant, queue)
    if record is None:
        return []
    return [p for p in backend.queue_parts.parts(record) if p.id in backend.view.map.partitions]


def leading_hosts(
    nodes: list[Node], tenant: str, queue: str, placement: Sequence[int] | None
) -> dict[int, tuple[Node, PartitionHost]]:
    """The hosts of these in-process ``nodes`` leading the queue's partitions, by index: its
    ``placement`` (pool partitions), or with None its own (a queue made before pools)."""
    out: dict[int, tuple[Node, PartitionHost]] = {}
    for node in nodes:
        for host in node.hosts.values():
            record = host.record
            if not host.leading or record is None:
                continue
            if placement is not None and host.partition in placement:
                out[list(placement).index(host.partition)] = (node, host)
            elif (
                placement is None and record.pool is None and (record.tenant, record.queue) == (tenant, queue)
            ):
                out[record.index] = (node, host)
    return out
