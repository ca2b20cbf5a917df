"""What a node does with the partition replicas it holds: one pure decision, no I/O.

The node (:mod:`.node`) gathers what it knows and acts on what :func:`decide` answers; a
deterministic simulation (``tests/simulation/``) drives the same function. Its signature is
kept stable::

    decide(node_id, hosted, partitions, tombstones, identity) -> Decision

- ``node_id``: this node's id, as the partition map names it.
- ``hosted``: every replica this node holds, by partition id: open ones (a
  :class:`~.partition_host.PartitionHost` serves them) and, on the first decision after a
  start, the directories found on disk (``open=False``). Each may carry its
  :class:`ReplicaLabel` (what the replica says it is) and its last LSN.
- ``partitions``: the partition map as read from etcd (:class:`MapView`: the records that
  could be read, and the ids whose records could not), or None while it was not read yet.
- ``tombstones``: the deletions the manager (or an operator) wrote for this node's replicas,
  by partition id (:class:`~..coordination.layout.Tombstone`).
- ``identity``: whether etcd holds this node's cluster (:class:`IdentityVerdict`).

The :class:`Decision` says which partitions to serve (open if needed, then reconcile their
role with the record), which replicas to delete and why, which to keep unserved as strays
and why, and, when the identity check refused etcd, that one-line reason.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from ..coordination.identity import IdentityVerdict
from ..coordination.layout import PartitionRecord, Tombstone

__all__ = ["Decision", "HostedReplica", "IdentityVerdict", "MapView", "ReplicaLabel", "decide"]


@dataclass(frozen=True, slots=True)
class ReplicaLabel:
    """What a replica's store says it is (kept in the store, outside the replicated log)."""

    cluster_id: str
    partition: int
    tenant: str
    queue: str
    index: int
    queue_revision: int | None = None


@dataclass(frozen=True, slots=True)
class HostedReplica:
    """A replica this node holds."""

    partition: int
    # Served by an open PartitionHost (False: a directory on disk, not opened).
    open: bool
    label: ReplicaLabel | None = None  # None: unlabelled (made before labels) or not read
    last_lsn: int | None = None  # None: not known (not opened)
    # Why this node cannot serve it now (it cannot open it: a damaged or unreadable file; or
    # cannot keep on disk first what serving it needs): kept and reported, never served;
    # None: it can, or was not tried.
    unservable: str | None = None


@dataclass(frozen=True, slots=True)
class MapView:
    """The partition map as this node read it."""

    records: Mapping[int, PartitionRecord]
    # Ids under ``partitions/`` whose records could not be parsed: unknown, not absent.
    unreadable: frozenset[int] = frozenset()
    # The bytes each record was read from (none for one kept from before, unreadable now):
    # a campaign claims its key only while etcd still holds them (leadership.py).
    values: Mapping[int, bytes] = field(default_factory=dict)
    # The revision that last changed each record read now (coordination/timeline.py's marks).
    mod_revisions: Mapping[int, int] = field(default_factory=dict)

    def kept(
        self, served: Iterable[int], remembered: Mapping[int, PartitionRecord] | None = None
    ) -> dict[int, PartitionRecord]:
        """The records ``served`` replicas are served on while etcd holds them unreadable
        (read before, kept), and for an unreadable one never read here, the one this node
        ``remembered`` on its disk (remembered_records.py): published, so that a manager that
        never read one can rebuild it (manager/recovery.py)."""
        out = {pid: self.records[pid] for pid in served if pid in self.records and pid not in self.values}
        for pid, record in (remembered or {}).items():
            if pid in self.unreadable and pid not in self.records:
                out[pid] = record
        return out


@dataclass(frozen=True, slots=True)
class Decision:
    # Named here by the map: open (created if absent), then serve in the role the record says.
    serve: dict[int, PartitionRecord] = field(default_factory=dict)
    # The bytes each served record was read from (``MapView.values``), when it has them.
    serve_values: dict[int, bytes] = field(default_factory=dict)
    # Replicas to delete (open or on disk), with the reason logged.
    delete: dict[int, str] = field(default_factory=dict)
    # Replicas kept but not served (open ones are closed), with the reason reported.
    strays: dict[int, str] = field(default_factory=dict)
    # Set when etcd is not trusted: nothing is served or deleted.
    refused: str | None = None


def decide(
    node_id: str,
    hosted: Mapping[int, HostedReplica],
    partitions: MapView | None,
    tombstones: Mapping[int, Tombstone],
    identity: IdentityVerdict,
) -> Decision:
    """What to do with ``hosted`` given the map (see the module's docstring).

    Never deletes on absence: a replica the map does not name here is a stray, kept and
    reported, unless a tombstone names it (and the replica holds nothing past the
    tombstone's LSN, when it has one: a replica whose last LSN is not read yet is kept). A
    record that cannot be parsed is unknown, not absent. A replica labelled for another
    cluster, or for another queue than the map's record of its partition (an id reused after
    an etcd restore), is never served or deleted. One named here that this node cannot serve
    (it cannot open it, or keep on disk what serving it needs) is a stray too: kept,
    reported with why, never served.
    """
    if identity.refusal is not None:
        why = f"not served: {identity.refusal}"
        return Decision(strays={pid: why for pid in hosted}, refused=identity.refusal)
    if partitions is None:
        return Decision()  # the map was not read yet: change nothing
    out = Decision()
    for pid, record in partitions.records.items():
        if node_id not in record.members:  # a voter or a learner
            continue
        found = hosted.get(pid)
        conflict = _conflict(found.label, record, identity) if found is not None else None
        if found is not None and found.unservable is not None:
            out.strays[pid] = found.unservable
        elif conflict is None:
            out.serve[pid] = record
            if pid in partitions.values:
                out.serve_values[pid] = partitions.values[pid]
        else:
            out.strays[pid] = conflict
    for pid, replica in hosted.items():
        if pid in out.serve or pid in out.strays:
            continue
        out_of_cluster = _foreign(replica.label, identity)
        if out_of_cluster is not None:
            out.strays[pid] = out_of_cluster
        elif pid in partitions.unreadable:
            out.strays[pid] = "its partition record cannot be read; kept until it can"
        elif (tombstone := tombstones.get(pid)) is not None:
            refused = _tombstone_refused(replica, tombstone)
            if refused is None:
                out.delete[pid] = f"tombstone: {tombstone.reason}"
            else:
                out.strays[pid] = refused
        elif pid in partitions.records:
            named = ", ".join(partitions.records[pid].members)
            out.strays[pid] = f"the map places this partition on {named}, not here; no tombstone"
        else:
            out.strays[pid] = "the map does not name this partition; no tombstone"
    return out


def _foreign(label: ReplicaLabel | None, identity: IdentityVerdict) -> str | None:
    if label is None or identity.cluster_id is None or label.cluster_id == identity.cluster_id:
        return None
    return f"this replica belongs to cluster {label.cluster_id}, not {identity.cluster_id}"


def _conflict(label: ReplicaLabel | None, record: PartitionRecord, identity: IdentityVerdict) -> str | None:
    foreign = _foreign(label, identity)
    if foreign is not None or label is None:
        return foreign
    same_revision = (
        label.queue_revision is None
        or record.queue_revision is None
        or label.queue_revision == record.queue_revision
    )
    if (label.tenant, label.queue, label.index) == (
        record.tenant,
        record.queue,
        record.index,
    ) and same_revision:
        return None
    return (
        f"the map names partition {label.partition} for {record.tenant}/{record.queue}"
        f" #{record.index} but this replica holds {label.tenant}/{label.queue} #{label.index}"
    )


def _tombstone_refused(replica: HostedReplica, tombstone: Tombstone) -> str | None:
    """Why the tombstone does not apply to this replica (None: it does)."""
    label = replica.label
    named = (tombstone.tenant, tombstone.queue)
    if label is not None and None not in named and (label.tenant, label.queue) != named:
        return (
            f"a tombstone names {tombstone.tenant}/{tombstone.queue} but this replica holds"
            f" {label.tenant}/{label.queue}"
        )
    if tombstone.lsn is None:
        return None
    if replica.last_lsn is None:
        # Found on disk at start and not read yet: a bound it cannot check is not met
        # (simulation seed ``all`` 291729, session 37: n2, restarted, deleted a copy holding
        # LSN 153 on a tombstone covering LSN 1 that its previous process had refused).
        return f"a tombstone covers LSN {tombstone.lsn} but this replica's last LSN is not read yet; kept"
    if replica.last_lsn > tombstone.lsn:
        return f"a tombstone covers LSN {tombstone.lsn} but this replica holds LSN {replica.last_lsn}; kept"
    return None
