"""Whether an etcd holds this cluster: the rules every node, manager and gateway applies.

Kafka keeps ``cluster.id`` in each broker's ``meta.properties`` and a broker refuses to start
when the cluster's differs. Pushgate does the same with etcd's ``cluster`` record
(:class:`~.layout.ClusterIdentity`) and the id a node keeps in ``DATA/cluster-id`` and in
each replica's store:

- etcd holds id X, the node keeps X: trusted. The node keeps none: it adopts X.
- etcd holds X, the node keeps Y: refused (another cluster's etcd, or a wrong ``--prefix``).
- etcd holds none, the node keeps Y: refused (etcd was wiped or replaced, or the prefix is
  wrong): only restoring etcd (docs/cluster.md, "Backup and restore") brings the node back.
- etcd holds none, the node keeps none and holds no replica: a brand-new cluster; the node
  creates the id (the first to do so wins; the others adopt it), unless other nodes are
  registered in etcd: they belong to a cluster this etcd lost, and a node added while etcd
  is empty must not found a second one, which would refuse the restored etcd for good
  (:func:`founding_refusal`; simulation seed ``all`` 452512). A node holding replicas but
  no id (data from before cluster ids) creates it only if etcd holds a partition map, which a
  wiped etcd does not; otherwise it is refused.
- the record cannot be read: refused.

A refused node serves nothing and deletes nothing, and says why in one line (its log, its
``nodes/`` record, ``GET /v1/cluster``). Gateways and managers keep no id on disk: a gateway
is not ready while etcd holds no readable cluster record, or holds another id than the one
it first saw; a manager plans nothing while etcd holds no readable record.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from ...errors import PushgateError
from .layout import ClusterIdentity, Layout, NodeRecord

RESTORE_HINT = "restore etcd from a backup (docs/cluster.md, Backup and restore)"


@dataclass(frozen=True, slots=True)
class IdentityVerdict:
    """Whether etcd holds this process's cluster."""

    cluster_id: str | None = None  # the id both agree on (None: not known)
    refusal: str | None = None  # why etcd is not trusted, in one line (None: trusted)

    @property
    def trusted(self) -> bool:
        return self.refusal is None and self.cluster_id is not None


@dataclass(frozen=True, slots=True)
class ClusterRecord:
    """The ``cluster`` key as read: absent, unreadable, or an identity."""

    identity: ClusterIdentity | None = None
    unreadable: str | None = None  # why it could not be parsed

    @classmethod
    def parse(cls, value: bytes | None) -> ClusterRecord:
        if value is None:
            return cls()
        try:
            return cls(ClusterIdentity.unpack(value))
        except PushgateError as exc:
            return cls(unreadable=str(exc.detail))


@dataclass(frozen=True, slots=True)
class NodeJudgement:
    verdict: IdentityVerdict
    create: bool = False  # make a new cluster id in etcd (then judge again)
    adopt: str | None = None  # keep this id in the data directory


def judge_node(
    record: ClusterRecord, kept: str | None, *, holds_replicas: bool, etcd_has_map: bool, layout: Layout
) -> NodeJudgement:
    """The module's rules for a node keeping ``kept`` (None: no ``DATA/cluster-id``)."""
    where = f"etcd key {layout.cluster}"
    if record.unreadable is not None:
        return NodeJudgement(IdentityVerdict(kept, f"cannot read {where}: {record.unreadable}"))
    found = record.identity
    if found is not None:
        if kept is None:
            return NodeJudgement(IdentityVerdict(found.cluster_id), adopt=found.cluster_id)
        if kept == found.cluster_id:
            return NodeJudgement(IdentityVerdict(kept))
        return NodeJudgement(
            IdentityVerdict(
                kept,
                f"{where} holds cluster {found.cluster_id} but this node belongs to cluster {kept}"
                " (wrong --etcd or --prefix?); refusing to serve or delete anything",
            )
        )
    if kept is not None:
        return NodeJudgement(
            IdentityVerdict(
                kept,
                f"{where} holds no cluster id but this node belongs to cluster {kept}: etcd was"
                f" wiped or replaced, or --etcd/--prefix is wrong; {RESTORE_HINT}; refusing to"
                " serve or delete anything",
            )
        )
    if not holds_replicas or etcd_has_map:
        return NodeJudgement(IdentityVerdict(), create=True)
    return NodeJudgement(
        IdentityVerdict(
            None,
            f"{where} holds no cluster id and no partition map, and this node holds replicas but"
            f" no cluster id: etcd may have been wiped; {RESTORE_HINT}; refusing to serve or"
            " delete anything",
        )
    )


def refusing_nodes(nodes: Mapping[str, NodeRecord], node_id: str) -> list[str]:
    """The nodes other than ``node_id`` registered as refusing etcd (what
    :func:`founding_refusal` counts)."""
    return [node for node, record in nodes.items() if node != node_id and record.state == "refused"]


def founding_refusal(refusing: Collection[str], layout: Layout) -> str | None:
    """Why a node that :func:`judge_node` would let create a cluster id must not (None: it
    may): ``refusing`` are the other nodes registered under the prefix as refusing this
    etcd. After etcd was wiped, the cluster's nodes register so while they wait for the
    restore. At a first start none does: a node refuses only what it has judged, and the
    first judged finds no other node refusing; nor do nodes of a version before cluster ids
    (registered up, in an etcd whose map lets them create the id)."""
    if not refusing:
        return None
    names = ", ".join(sorted(refusing))
    return (
        f"etcd key {layout.cluster} holds no cluster id, but nodes {names} are registered refusing"
        f" it: they belong to a cluster this etcd lost (wiped or replaced); {RESTORE_HINT}; this"
        " node will not found a second cluster; refusing to serve or delete anything"
    )


def judge_stateless(record: ClusterRecord, first_seen: str | None, layout: Layout) -> IdentityVerdict:
    """The verdict of a process that keeps no id on disk (a gateway, a manager):
    ``first_seen`` is the id it trusted first in this process (None: any)."""
    where = f"etcd key {layout.cluster}"
    if record.unreadable is not None:
        return IdentityVerdict(first_seen, f"cannot read {where}: {record.unreadable}")
    found = record.identity
    if found is None:
        return IdentityVerdict(
            first_seen, f"{where} holds no cluster id: etcd is empty, wiped or of another --prefix"
        )
    if first_seen is not None and found.cluster_id != first_seen:
        return IdentityVerdict(
            first_seen, f"{where} holds cluster {found.cluster_id}, not {first_seen} as before"
        )
    return IdentityVerdict(found.cluster_id)
