"""A cluster as the monitor samples it: nodes, partitions and the cluster's identity.

Read from API.md's ``GET /v1/cluster`` document (what a store with the ``ClusterStatus``
capability reports), plus what the gateway's console source adds to it (each node's
``drain_requested``, each partition's ``replicas`` with their published LSNs: see
``gateway/cluster_operator.py``). Fields a document lacks are read as unknown, never as
an error, so a newer document (learners, voters, replacements due) is still shown, and
the console can show those once they are there (``extra`` keeps what it does not know).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


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


@dataclass(frozen=True, slots=True)
class StraySample:
    """A replica a node keeps but does not serve, and why (docs/cluster.md, section 11)."""

    partition: int
    reason: str


@dataclass(frozen=True, slots=True)
class NodeSample:
    """A cluster node as ``GET /v1/cluster`` shows it, with what it leads and holds."""

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
    # How many replicas it keeps but does not serve (docs/cluster.md, section 11).
    strays: int = 0
    stray_replicas: tuple[StraySample, ...] = ()
    refusal: str | None = None  # why it refuses etcd (state "refused")
    # Partitions the map places on it (as leader or follower): what a drain moves off.
    placed: int = 0
    # An operator asked the managers to move everything off it (``drain/{id}`` in etcd).
    drain_requested: bool = False

    @property
    def healthy(self) -> bool:
        return self.state in ("up", "alive", "healthy", "ok")

    @property
    def drain_status(self) -> str:
        """What a drain of this node has come to: the one place the console reads it.

        ``none`` (no drain asked), ``draining`` (asked; partitions still placed here),
        ``drained`` (asked, nothing placed here any more: safe to stop the node).
        """
        if not self.drain_requested and self.state != "draining":
            return "none"
        return "draining" if self.placed else "drained"


@dataclass(frozen=True, slots=True)
class ReplicaSample:
    """One replica of a partition: its node, the LSN it published and how far it is behind
    the leader's (None: not published yet, or its node is gone)."""

    node: str
    role: str  # "leader", "follower", or another role a newer document names ("learner")
    lsn: int | None
    lag: int | None


@dataclass(frozen=True, slots=True)
class PartitionSample:
    """A partition as ``GET /v1/cluster`` shows it."""

    id: int
    tenant: str
    queue: str
    index: int
    leader: str | None
    followers: tuple[str, ...]
    epoch: int
    lsn: int
    mode: str
    replicas: tuple[ReplicaSample, ...]
    # Fields of the document the console does not know yet (shown as they are).
    extra: tuple[tuple[str, str], ...] = ()

    @property
    def max_lag(self) -> int | None:
        """The furthest-behind replica's lag (None: no follower position is known)."""
        lags = [r.lag for r in self.replicas if r.role != "leader" and r.lag is not None]
        return max(lags, default=None)

    def replica(self, node: str) -> ReplicaSample | None:
        return next((r for r in self.replicas if r.node == node), None)


@dataclass(frozen=True, slots=True)
class ClusterIdentitySample:
    """The gateway's verdict on etcd's cluster record (``cluster`` in ``GET /v1/cluster``)."""

    id: str | None
    trusted: bool
    refusal: str | None


@dataclass(frozen=True, slots=True)
class ClusterSample:
    nodes: tuple[NodeSample, ...] = ()
    partitions: tuple[PartitionSample, ...] = ()
    identity: ClusterIdentitySample | None = None


_PARTITION_FIELDS = {
    "id",
    "tenant",
    "queue",
    "index",
    "leader",
    "followers",
    "epoch",
    "lsn",
    "mode",
    "replicas",
}


def cluster_from_doc(doc: Mapping[str, Any] | None) -> ClusterSample:
    """Nodes, partitions and identity from a ``GET /v1/cluster`` document (None: no cluster)."""
    if not doc:
        return ClusterSample()
    partitions = tuple(_partition(p) for p in doc.get("partitions", []))
    led: dict[str, list[PartitionSample]] = {}
    placed: dict[str, int] = {}
    for part in partitions:
        if part.leader is not None:
            led.setdefault(part.leader, []).append(part)
        for node in {r.node for r in part.replicas}:
            placed[node] = placed.get(node, 0) + 1
    nodes = []
    for node in doc.get("nodes", []):
        node_id = str(node["id"])
        parts = led.get(node_id, [])
        strays = tuple(
            StraySample(int(s.get("partition", 0)), str(s.get("reason", "")))
            for s in node.get("strays") or ()
            if isinstance(s, Mapping)
        )
        refusal = node.get("refusal")
        nodes.append(
            NodeSample(
                id=node_id,
                address=str(node.get("address", "")),
                state=str(node.get("state", "unknown")),
                lag=int(node.get("lag") or 0),
                role="leader" if parts else "follower",
                partitions_led=len(parts),
                epoch=max((p.epoch for p in parts), default=None),
                lsn=max((p.lsn for p in parts), default=None),
                storage=NodeStorageSample.of(node.get("storage")),
                strays=len(node.get("strays") or ()),
                stray_replicas=strays,
                refusal=None if refusal is None else str(refusal),
                placed=placed.get(node_id, 0),
                drain_requested=bool(node.get("drain_requested")),
            )
        )
    identity = None
    if isinstance(ident := doc.get("cluster"), Mapping):
        cluster_id = ident.get("id")
        refusal = ident.get("refusal")
        identity = ClusterIdentitySample(
            None if cluster_id is None else str(cluster_id),
            bool(ident.get("trusted")),
            None if refusal is None else str(refusal),
        )
    return ClusterSample(tuple(nodes), partitions, identity)


def _partition(doc: Mapping[str, Any]) -> PartitionSample:
    leader = doc.get("leader")
    followers = tuple(str(n) for n in doc.get("followers") or ())
    lsn = int(doc.get("lsn") or 0)
    positions = _positions(doc.get("replicas"))
    replicas = []
    if leader is not None:
        replicas.append(ReplicaSample(str(leader), "leader", lsn, 0))
    for node in followers:
        own = positions.get(node)
        replicas.append(ReplicaSample(node, "follower", own, None if own is None else max(0, lsn - own)))
    # Roles a newer document adds (learners, ...): any list of node ids under another key.
    # An empty one (no membership change under way: learners [], successor null) says nothing.
    extra = []
    for key, value in sorted(doc.items()):
        if key in _PARTITION_FIELDS or value is None or (isinstance(value, Sequence) and not value):
            continue
        if isinstance(value, Sequence) and not isinstance(value, str):
            names = [str(v) for v in value]
            role = key[:-1] if key.endswith("s") else key
            for node in names:
                if all(r.node != node for r in replicas):
                    own = positions.get(node)
                    replicas.append(
                        ReplicaSample(node, role, own, None if own is None else max(0, lsn - own))
                    )
            extra.append((key, ", ".join(names)))
        else:
            extra.append((key, str(value)))
    return PartitionSample(
        id=int(doc.get("id", 0)),
        tenant=str(doc.get("tenant", "")),
        queue=str(doc.get("queue", "")),
        index=int(doc.get("index", 0)),
        leader=None if leader is None else str(leader),
        followers=followers,
        epoch=int(doc.get("epoch") or 0),
        lsn=lsn,
        mode=str(doc.get("mode", "")),
        replicas=tuple(replicas),
        extra=tuple(extra),
    )


def _positions(raw: Any) -> dict[str, int]:
    """``replicas: [{"node", "lsn"}]`` as published positions by node (absent: unknown)."""
    out: dict[str, int] = {}
    for item in raw or ():
        if isinstance(item, Mapping) and item.get("lsn") is not None:
            try:
                out[str(item["node"])] = int(item["lsn"])
            except (KeyError, TypeError, ValueError):
                continue
    return out
