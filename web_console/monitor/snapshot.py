"""Immutable samples: one per queue, one per cluster node, and the snapshot holding them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from backend_store.types import QueueInfo, StorageUsage


@dataclass(frozen=True, slots=True)
class QueueSample:
    """A queue's stats at one moment, with rates since the sample before (per second)."""

    tenant: str
    name: str
    visible: int
    in_flight: int
    delayed: int
    oldest_age_s: float | None
    consumers: int
    sent_total: int
    acked_total: int
    dead_lettered_total: int
    dead_letter_queue: str | None
    attributes: Mapping[str, Any]
    send_rate: float = 0.0
    ack_rate: float = 0.0

    @property
    def key(self) -> tuple[str, str]:
        return (self.tenant, self.name)

    @property
    def depth(self) -> int:
        """Every message the queue holds (visible, in flight and delayed)."""
        return self.visible + self.in_flight + self.delayed

    @classmethod
    def of(cls, info: QueueInfo, consumers: int) -> QueueSample:
        s = info.stats
        return cls(
            tenant=info.tenant,
            name=info.name,
            visible=s.visible,
            in_flight=s.in_flight,
            delayed=s.delayed,
            oldest_age_s=s.oldest_age_s,
            consumers=consumers,
            sent_total=s.sent_total,
            acked_total=s.acked_total,
            dead_lettered_total=s.dead_lettered_total,
            dead_letter_queue=info.attributes.dead_letter_queue,
            attributes=info.attributes.to_dict(),
        )


@dataclass(frozen=True, slots=True)
class NodeSample:
    """A cluster node as ``GET /v1/cluster`` shows it, with what it leads."""

    id: str
    address: str
    state: str
    lag: int
    role: str  # "leader" of at least one partition, else "follower"
    partitions_led: int
    epoch: int | None
    lsn: int | None
    # What the node published of its storage (None: nothing yet, or a node that is down).
    storage: NodeStorageSample | None = None

    @property
    def healthy(self) -> bool:
        return self.state in ("up", "alive", "healthy", "ok")


@dataclass(frozen=True, slots=True)
class NodeStorageSample:
    """A node's ``storage`` in API.md's ``GET /v1/cluster`` document (bytes)."""

    used_bytes: int  # pages in use over its partition environments
    map_size: int
    map_used_ratio: float  # its fullest environment's use of its maximum map (0..1)
    disk_free_bytes: int
    disk_total_bytes: int

    @property
    def disk_used_ratio(self) -> float:
        """Of the file system under the node's data directory (0..1; 0 if unknown)."""
        total = self.disk_total_bytes
        return (total - self.disk_free_bytes) / total if total > 0 else 0.0

    @classmethod
    def of(cls, doc: Any) -> NodeStorageSample | None:
        if not isinstance(doc, Mapping):
            return None
        try:
            return cls(
                used_bytes=int(doc["used_bytes"]),
                map_size=int(doc.get("map_size") or 0),
                map_used_ratio=float(doc.get("map_used_ratio") or 0.0),
                disk_free_bytes=int(doc.get("disk_free_bytes") or 0),
                disk_total_bytes=int(doc.get("disk_total_bytes") or 0),
            )
        except (KeyError, TypeError, ValueError):
            return None


def nodes_from_cluster(doc: Mapping[str, Any] | None) -> tuple[NodeSample, ...]:
    """Nodes from API.md's ``GET /v1/cluster`` document (None: no cluster, no nodes)."""
    if not doc:
        return ()
    led: dict[str, list[Mapping[str, Any]]] = {}
    for part in doc.get("partitions", []):
        led.setdefault(str(part.get("leader")), []).append(part)
    out = []
    for node in doc.get("nodes", []):
        node_id = str(node["id"])
        parts = led.get(node_id, [])
        out.append(
            NodeSample(
                id=node_id,
                address=str(node.get("address", "")),
                state=str(node.get("state", "unknown")),
                lag=int(node.get("lag") or 0),
                role="leader" if parts else "follower",
                partitions_led=len(parts),
                epoch=max((int(p.get("epoch", 0)) for p in parts), default=None),
                lsn=max((int(p.get("lsn", 0)) for p in parts), default=None),
                storage=NodeStorageSample.of(node.get("storage")),
            )
        )
    return tuple(out)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything sampled at ``at`` (Unix seconds). ``nodes`` is empty without a cluster."""

    at: float
    queues: tuple[QueueSample, ...] = ()
    storage: StorageUsage | None = None
    nodes: tuple[NodeSample, ...] = ()
    cluster: bool = False
    _index: dict[tuple[str, str], QueueSample] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        self._index.update((q.key, q) for q in self.queues)

    def queue(self, tenant: str, name: str) -> QueueSample | None:
        return self._index.get((tenant, name))

    def for_tenant(self, tenant: str) -> list[QueueSample]:
        return [q for q in self.queues if q.tenant == tenant]
