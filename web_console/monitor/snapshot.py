"""Immutable samples: one per queue, and the snapshot holding them with the cluster's."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from backend_store.types import QueueInfo, StorageUsage

from .cluster_sample import ClusterIdentitySample, NodeSample, PartitionSample


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
    # Deliveries (pushes and receives) made by *this* gateway: the store counts none.
    delivered_total: int = 0
    delivered_rate: float = 0.0
    dead_letter_rate: float = 0.0

    @property
    def key(self) -> tuple[str, str]:
        return (self.tenant, self.name)

    @property
    def depth(self) -> int:
        """Every message the queue holds (visible, in flight and delayed)."""
        return self.visible + self.in_flight + self.delayed

    @classmethod
    def of(
        cls,
        info: QueueInfo,
        consumers: int,
        delivered: int = 0,
        attributes: Mapping[str, Any] | None = None,
        rates: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0),
    ) -> QueueSample:
        """The queue's sample; ``rates``: sends, acks, deliveries and dead-letterings a second."""
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
            attributes=info.attributes.to_dict() if attributes is None else attributes,
            delivered_total=delivered,
            send_rate=rates[0],
            ack_rate=rates[1],
            delivered_rate=rates[2],
            dead_letter_rate=rates[3],
        )


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything sampled at ``at`` (Unix seconds). ``nodes`` and ``partitions`` are empty
    without a cluster; ``tenants`` lists every tenant, with queues or not. ``changed`` holds
    the queues whose sample is not the one of the snapshot taken at ``previous_at`` (new, or
    anything about them changed): what the alert engine evaluates besides the queues it
    tracks; None (a snapshot made by hand) counts every queue as changed."""

    at: float
    queues: tuple[QueueSample, ...] = ()
    storage: StorageUsage | None = None
    nodes: tuple[NodeSample, ...] = ()
    cluster: bool = False
    partitions: tuple[PartitionSample, ...] = ()
    identity: ClusterIdentitySample | None = None
    tenants: tuple[str, ...] = ()
    changed: tuple[QueueSample, ...] | None = None
    previous_at: float = 0.0
    _index: dict[tuple[str, str], QueueSample] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        self._index.update((q.key, q) for q in self.queues)

    def queue(self, tenant: str, name: str) -> QueueSample | None:
        return self._index.get((tenant, name))

    def for_tenant(self, tenant: str) -> list[QueueSample]:
        return [q for q in self.queues if q.tenant == tenant]

    def node(self, node_id: str) -> NodeSample | None:
        return next((n for n in self.nodes if n.id == node_id), None)

    def partitions_of(self, tenant: str, queue: str) -> list[PartitionSample]:
        return sorted(
            (p for p in self.partitions if p.tenant == tenant and p.queue == queue), key=lambda p: p.index
        )

    def partitions_on(self, node_id: str) -> list[PartitionSample]:
        """The partitions the map places on a node (leader, follower or another role)."""
        return [p for p in self.partitions if p.replica(node_id) is not None]
