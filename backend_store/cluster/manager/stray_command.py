"""``pushgate manager --delete-stray NODE:PARTITION``: an operator deletes a stray on purpose.

A node never deletes a replica the map does not name (docs/cluster.md, "Never delete on
absence"): it keeps it as a stray and reports it (``GET /v1/cluster``, its ``nodes/``
record). This writes the tombstone that lets the node delete it, refusing while the map
places the partition on that node. The node deletes the replica when it next reconciles
(at once if it is up, else when it starts) and then removes the tombstone.
"""

from __future__ import annotations

from ...errors import InvalidRequest
from ..coordination.etcd_tls import EtcdTls
from ..coordination.layout import Layout, PartitionRecord, Tombstone


def parse_target(spec: str) -> tuple[str, int]:
    node, sep, pid = spec.rpartition(":")
    if not sep or not node or not pid.isdigit():
        raise InvalidRequest(f"expected NODE:PARTITION, got {spec!r}")
    return node, int(pid)


async def delete_stray(
    etcd: str, node: str, partition: int, *, prefix: str | None = None, etcd_tls: EtcdTls | None = None
) -> str:
    """Write the operator's tombstone for ``node``'s replica of ``partition``; return what
    was done, in one line (raises ``InvalidRequest`` while the map places it there)."""
    from ..coordination.etcd_coordinator import EtcdCoordinator

    layout = Layout(prefix) if prefix else Layout()
    async with EtcdCoordinator(etcd, tls=etcd_tls) as coordinator:
        entry = await coordinator.get(layout.partition(partition))
        if entry is not None and node in PartitionRecord.unpack(entry.value).replicas:
            raise InvalidRequest(
                f"partition {partition} is placed on {node}: not a stray (drain or move it first)"
            )
        await coordinator.put(
            layout.tombstone(partition, node), Tombstone(partition, node, "operator").pack()
        )
    return f"tombstone written: {node} deletes its replica of partition {partition} when it next reconciles"
