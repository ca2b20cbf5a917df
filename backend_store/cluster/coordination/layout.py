"""The cluster's keys in etcd and their values, in one place for nodes, the manager and gateways.

Everything lives under a prefix, ``/pushgate/`` by default (:class:`Layout`); values are msgpack maps (string keys only)::

    nodes/{node_id}        NodeRecord       a node, under its lease (vanishes when it dies)
    manager                manager id       the manager's campaign key: its epoch fences the map
    partitions/{id}        PartitionRecord  the partition map (written by the manager, fenced)
    leaders/{id}           LeaderRecord     a partition leader's campaign key; epoch = create_revision
    queues/{tenant}/{q}    attributes       a queue's attributes and placement (written by gateways)
    pools/{name}           PoolRequest      a pool of shared partitions gateways asked for (pools.py)
    meta/{namespace}/{key} raw bytes        the gateways' metadata: tenants, API keys, JWT keys
    drain/{node_id}        b""              an operator's drain request (pushgate manager --drain)
    counters/partition     int              the last partition id allocated
    cluster                ClusterIdentity  the cluster's id (made once) and incarnation
    tombstones/{id}/{node} Tombstone        a replica the node may delete (manager or operator)
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import msgpack

from ...errors import InvalidRequest, PushgateError, Unavailable
from ...types import Epoch, QueueName, TenantId, make_epoch
from ..coordination.storage_record import NodeStorage

_T = TypeVar("_T")

DEFAULT_PREFIX = "/pushgate/"
# The embedded store's limit on ``namespace \0 key`` (and on tenant + queue): the same here,
# so both stores refuse alike.
MAX_META_KEY_BYTES = 400


@dataclass(frozen=True, slots=True)
class Layout:
    """Key names under one prefix (tests and several clusters sharing an etcd use their own)."""

    prefix: str = DEFAULT_PREFIX

    @property
    def nodes(self) -> str:
        return self.prefix + "nodes/"

    @property
    def partitions(self) -> str:
        return self.prefix + "partitions/"

    @property
    def leaders(self) -> str:
        return self.prefix + "leaders/"

    @property
    def queues(self) -> str:
        return self.prefix + "queues/"

    @property
    def pools(self) -> str:
        """``pools/{name}``: a pool of shared partitions gateways asked for (:mod:`.pools`)."""
        return self.prefix + "pools/"

    def pool(self, name: str) -> str:
        return self.pools + name

    @property
    def drain(self) -> str:
        """``drain/{node_id}``: an operator asked the manager to move everything off the node."""
        return self.prefix + "drain/"

    @property
    def manager(self) -> str:
        return self.prefix + "manager"

    @property
    def partition_counter(self) -> str:
        return self.prefix + "counters/partition"

    @property
    def cluster(self) -> str:
        """The cluster's identity record (:class:`ClusterIdentity`)."""
        return self.prefix + "cluster"

    @property
    def tombstones(self) -> str:
        return self.prefix + "tombstones/"

    def tombstone(self, partition: int, node_id: str) -> str:
        return f"{self.tombstones}{partition}/{node_id}"

    def node_tombstones(self, node_id: str, entries: dict[str, bytes]) -> dict[int, bytes]:
        """``{partition: value}`` of one node's tombstones among ``tombstones/`` entries
        (keys relative to that prefix)."""
        out: dict[int, bytes] = {}
        for key, value in entries.items():
            pid, _, node = key.partition("/")
            if node == node_id and pid.isdigit():
                out[int(pid)] = value
        return out

    def node(self, node_id: str) -> str:
        return self.nodes + node_id

    def partition(self, partition: int) -> str:
        return f"{self.partitions}{partition}"

    def leader(self, partition: int) -> str:
        return f"{self.leaders}{partition}"

    @property
    def meta(self) -> str:
        return self.prefix + "meta/"

    def queue(self, tenant: str, name: str) -> str:
        """A queue's key; refuses names that could alias another key or that the store would refuse."""
        if not tenant or "/" in tenant + name or "\0" in tenant + name:
            raise InvalidRequest("tenant and queue names must not contain '/' or NUL")
        _check_size(tenant, name, "tenant and queue names")
        return f"{self.queues}{tenant}/{name}"

    def tenant_queues(self, tenant: str) -> str:
        if not tenant or "/" in tenant or "\0" in tenant:
            raise InvalidRequest("tenant names must not contain '/' or NUL")
        return f"{self.queues}{tenant}/"

    def split_queue_key(self, key: str) -> tuple[TenantId, QueueName] | None:
        """``(tenant, queue)`` of a full ``queues/`` key (None for a key of another shape)."""
        tenant, sep, name = key[len(self.queues) :].partition("/")
        if not sep or not tenant or not name or "/" in name:
            return None
        return TenantId(tenant), QueueName(name)

    def meta_key(self, namespace: str, key: str) -> str:
        """The key of a metadata value; refuses what the embedded store refuses."""
        if not namespace or "\0" in namespace or "\0" in key:
            raise InvalidRequest("metadata namespace must be non-empty and names free of NUL")
        if "/" in namespace:
            # A "/" would let namespace "a/b" and key "c" alias namespace "a" and key "b/c".
            raise InvalidRequest("metadata namespace must not contain '/'")
        _check_size(namespace, key, "metadata names")
        return f"{self.meta}{namespace}/{key}"

    def split_meta_key(self, key: str) -> tuple[str, str]:
        namespace, _, name = key[len(self.meta) :].partition("/")
        return namespace, name


def _check_size(first: str, second: str, what: str) -> None:
    try:
        size = len(first.encode()) + 1 + len(second.encode())
    except UnicodeEncodeError:
        raise InvalidRequest(f"{what} must be valid Unicode") from None
    if size > MAX_META_KEY_BYTES:
        raise InvalidRequest(f"{what} must fit in {MAX_META_KEY_BYTES} bytes")


def pack(value: Any) -> bytes:
    data: bytes = msgpack.packb(value, use_bin_type=True)
    return data


def unpack(data: bytes) -> Any:
    try:
        return msgpack.unpackb(data, raw=False)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise Unavailable(f"malformed cluster record: {type(exc).__name__}") from None


@dataclass(frozen=True, slots=True)
class MoveReceipt:
    """What a node keeps on its disk when it deletes a copy on a move's tombstone: the voting
    set that had committed past everything the copy held, that set's leader's epoch and the
    LSN it had committed (which order receipts: two moves under one leader share its
    epoch). A restore of etcd can undo the move; it cannot undo this."""

    voters: tuple[str, ...]
    epoch: int
    lsn: int = 0  # 0 in a receipt written before receipts carried it

    def to_doc(self) -> dict[str, Any]:
        return {"voters": list(self.voters), "epoch": self.epoch, "lsn": self.lsn}

    @classmethod
    def from_doc(cls, doc: Any) -> MoveReceipt | None:
        """The receipt a document holds (None: none; ``ValueError`` etc.: malformed)."""
        if doc is None:
            return None
        return cls(tuple(str(n) for n in doc["voters"]), int(doc["epoch"]), int(doc.get("lsn", 0)))

    def order(self) -> tuple[int, int]:
        """Newer receipts sort higher."""
        return self.epoch, self.lsn


@dataclass(frozen=True, slots=True)
class ServedSet:
    """The voting set a node's copy was last served on, and the cluster's incarnation then
    (node/served_sets.py)."""

    voters: tuple[str, ...]
    incarnation: int

    def to_doc(self) -> dict[str, Any]:
        return {"voters": list(self.voters), "incarnation": self.incarnation}

    @classmethod
    def from_doc(cls, doc: Any) -> ServedSet:
        return cls(tuple(str(n) for n in doc["voters"]), int(doc["incarnation"]))


@dataclass(frozen=True, slots=True)
class ReplicaPosition:
    """What a node publishes of one replica it hosts."""

    role: str  # "leader" | "follower" | "resigned"
    epoch: int  # the replica's fence (highest epoch seen)
    lsn: int  # its last LSN
    last_epoch: int  # the epoch of its last entry (promotion compares (last_epoch, lsn))
    # The epoch of the partition's leader key as this node sees it (0: no leader key). A
    # position published with 0 was taken after the node saw the leader's key vanish.
    leader_epoch: int = 0
    # A leader's only (docs/cluster.md, "Membership changes"; empty/0 for the others):
    # ``voters``: the voting set a majority of which holds every write it acknowledged (the
    # set it counts by, once a majority of it held everything written before it adopted it);
    # ``committed``: the highest LSN such a majority holds; ``in_sync``: the other replicas
    # (voters and learners) that acknowledged its whole log recently (Kafka's ISR).
    voters: tuple[str, ...] = ()
    committed: int = 0
    in_sync: tuple[str, ...] = ()
    # An empty copy this node made again after it deleted its earlier copy of the same
    # partition on a move's tombstone (a restored etcd named it again), with what that
    # tombstone said: the copy knows nothing of what was acknowledged, so a promotion does
    # not count it, and looks for the majority of the set that replaced it instead
    # (manager/election.py).
    remade: MoveReceipt | None = None
    # A resigned replica's only: the record's ``designation`` it resigned under. The manager
    # designates a resigned leader that is still the best anew only while the record holds
    # that designation (once per resignation; None, from a node of an earlier version: at
    # every plan, as those versions did).
    resigned_on: int | None = None


@dataclass(frozen=True, slots=True)
class NodeRecord:
    address: str
    # "up" | "draining" | "refused" (etcd does not hold this node's cluster: ``refusal``)
    state: str = "up"
    replicas: dict[int, ReplicaPosition] = field(default_factory=dict)
    # Disk and map use (None: not measured yet, or a node of a version that does not publish it).
    storage: NodeStorage | None = None
    # Replicas kept here but not served (the map does not name them here, or they conflict
    # with it), each with why: never deleted without a tombstone (docs/cluster.md).
    strays: dict[int, str] = field(default_factory=dict)
    refusal: str | None = None  # why the node refuses etcd (state "refused"), one line
    # ``(last_epoch, lsn)`` of each stray (one found on disk at start is opened aside once
    # to read it, never served). After etcd went back in time a stray
    # can hold acknowledged writes the restored replica set lacks (its membership change was
    # undone): promotion then compares strays too (manager/election.py).
    stray_ranks: dict[int, tuple[int, int]] = field(default_factory=dict)
    # The record this node still serves each replica on while etcd holds that record
    # unreadable (the last one it read): a manager that never read it rebuilds it from these
    # (manager/recovery.py) rather than leave the partition unserved for good.
    kept: dict[int, PartitionRecord] = field(default_factory=dict)
    # The receipt (node/receipts.py) of each partition the map names whose copy this node
    # deleted on a move and does not hold again: after etcd went back in time, the newest
    # receipt anywhere says which set held the partition last (manager/election.py).
    receipts: dict[int, MoveReceipt] = field(default_factory=dict)
    # The voting set each copy here was last served on, where that was in an incarnation
    # before the cluster's (node/served_sets.py): after etcd went back in time, a majority of
    # each must be heard before a promotion (manager/election.py).
    served_sets: dict[int, ServedSet] = field(default_factory=dict)

    def pack(self) -> bytes:
        doc: dict[str, Any] = {
            "address": self.address,
            "state": self.state,
            "replicas": {str(p): _position_doc(r) for p, r in self.replicas.items()},
        }
        if self.storage is not None:
            doc["storage"] = self.storage.to_dict()
        if self.strays:
            doc["strays"] = {str(p): why for p, why in self.strays.items()}
        if self.refusal is not None:
            doc["refusal"] = self.refusal
        if self.stray_ranks:
            doc["stray_ranks"] = {str(p): list(rank) for p, rank in self.stray_ranks.items()}
        if self.kept:
            doc["kept"] = {str(p): record.pack() for p, record in self.kept.items()}
        if self.receipts:
            doc["receipts"] = {str(p): receipt.to_doc() for p, receipt in self.receipts.items()}
        if self.served_sets:
            doc["served_sets"] = {str(p): served.to_doc() for p, served in self.served_sets.items()}
        return pack(doc)

    @classmethod
    def unpack(cls, data: bytes) -> NodeRecord:
        v = unpack(data)
        try:
            replicas = {
                int(p): ReplicaPosition(
                    r["role"],
                    r["epoch"],
                    r["lsn"],
                    r.get("last_epoch", 0),
                    r.get("leader_epoch", 0),
                    tuple(str(n) for n in r.get("voters", ())),
                    int(r.get("committed", 0)),
                    tuple(str(n) for n in r.get("in_sync", ())),
                    MoveReceipt.from_doc(r.get("remade")),
                    None if r.get("resigned_on") is None else int(r["resigned_on"]),
                )
                for p, r in v.get("replicas", {}).items()
            }
            storage = NodeStorage.from_dict(v.get("storage"))
            strays = {int(p): str(why) for p, why in (v.get("strays") or {}).items()}
            refusal = v.get("refusal")
            ranks = {int(p): (int(r[0]), int(r[1])) for p, r in (v.get("stray_ranks") or {}).items()}
            kept = _kept_records(v.get("kept") or {})
            receipts = {int(p): MoveReceipt.from_doc(r) for p, r in (v.get("receipts") or {}).items()}
            served_sets = {int(p): ServedSet.from_doc(s) for p, s in (v.get("served_sets") or {}).items()}
            return cls(
                v["address"],
                v.get("state", "up"),
                replicas,
                storage,
                strays,
                None if refusal is None else str(refusal),
                ranks,
                kept,
                {p: r for p, r in receipts.items() if r is not None},
                served_sets,
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise Unavailable(f"malformed node record: {exc}") from None


def _kept_records(doc: Mapping[Any, Any]) -> dict[int, PartitionRecord]:
    """A node record's ``kept`` records; one that cannot be read is left out (the others and
    the node's positions still count)."""
    out: dict[int, PartitionRecord] = {}
    for p, value in doc.items():
        with contextlib.suppress(PushgateError, TypeError, ValueError):
            out[int(p)] = PartitionRecord.unpack(bytes(value))
    return out


def _position_doc(r: ReplicaPosition) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "role": r.role,
        "epoch": r.epoch,
        "lsn": r.lsn,
        "last_epoch": r.last_epoch,
        "leader_epoch": r.leader_epoch,
    }
    if r.voters:  # a leader's fields only where a leader publishes them
        doc["voters"] = list(r.voters)
        doc["committed"] = r.committed
        doc["in_sync"] = list(r.in_sync)
    if r.remade is not None:
        doc["remade"] = r.remade.to_doc()
    if r.resigned_on is not None:
        doc["resigned_on"] = r.resigned_on
    return doc


@dataclass(frozen=True, slots=True)
class PartitionRecord:
    """A partition in the map (written by the manager only, fenced on its epoch).

    Membership changes one step at a time (docs/cluster.md, "Membership changes"): a new
    replica joins as a **learner** (hosted and shipped the log, never counted in a majority,
    never leader), becomes a voter once it caught up, and only then does a **leaving** voter
    leave ``replicas``; consecutive voting sets differ by one replica, so their majorities
    overlap. A **successor** asks the leader to hand leadership over: it stops taking
    writes, waits (bounded) until the successor holds its whole log, then gives its key up
    and the manager designates the successor."""

    tenant: str
    queue: str
    index: int
    replicas: tuple[str, ...]  # the voters
    leader: str | None
    mode: str = "sync"  # "sync" | "async"
    # The create_revision of the queue record it was made for: a queue deleted and created
    # again under the same name gets new partitions, never the old ones (None: not recorded).
    queue_revision: int | None = None
    learners: tuple[str, ...] = ()
    leaving: tuple[str, ...] = ()  # voters to remove once their replacement votes
    successor: str | None = None  # a hand-over the leader is asked to make
    # Bumped by the manager at every promotion, the same leader included: a replica that
    # learnt its designation may be stale waits for a newer one (node/leadership.py).
    designation: int = 0
    # The cluster's incarnation when the leader was designated: one made before etcd went
    # back in time (a restore raises the incarnation) may name a replica that lacks what a
    # majority acknowledged since, so nobody campaigns on it until the manager designates
    # anew on fresh positions (manager/election.py, node/leadership.py).
    designated_in: int = 0

    @property
    def pool(self) -> str | None:
        """The pool this partition is a slot of (``index``), or None: a queue's own partition
        (made before pools; coordination/pools.py)."""
        return self.queue if self.tenant == "" else None

    @property
    def members(self) -> tuple[str, ...]:
        """Every node that hosts a copy: the voters, then the learners."""
        return self.replicas + tuple(n for n in self.learners if n not in self.replicas)

    def pack(self) -> bytes:
        doc: dict[str, Any] = {
            "tenant": self.tenant,
            "queue": self.queue,
            "index": self.index,
            "replicas": list(self.replicas),
            "leader": self.leader,
            "mode": self.mode,
            "queue_revision": self.queue_revision,
        }
        # Written only when set, so a record without a change in progress reads the same to
        # a node of an earlier version.
        if self.learners:
            doc["learners"] = list(self.learners)
        if self.leaving:
            doc["leaving"] = list(self.leaving)
        if self.successor is not None:
            doc["successor"] = self.successor
        if self.designation:
            doc["designation"] = self.designation
        if self.designated_in:
            doc["designated_in"] = self.designated_in
        return pack(doc)

    @classmethod
    def unpack(cls, data: bytes) -> PartitionRecord:
        v = unpack(data)
        try:
            successor = v.get("successor")
            return cls(
                v["tenant"],
                v["queue"],
                v["index"],
                tuple(v["replicas"]),
                v.get("leader"),
                v.get("mode", "sync"),
                v.get("queue_revision"),
                tuple(str(n) for n in v.get("learners", ())),
                tuple(str(n) for n in v.get("leaving", ())),
                None if successor is None else str(successor),
                int(v.get("designation", 0)),
                int(v.get("designated_in", 0)),
            )
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise Unavailable(f"malformed partition record: {exc}") from None


@dataclass(frozen=True, slots=True)
class LeaderRecord:
    node: str
    address: str
    # The cluster's incarnation the campaign was made in (0: none recorded): the claim's
    # epoch is make_epoch(incarnation, the key's create_revision) (backend_store/types.py).
    incarnation: int = 0

    def pack(self) -> bytes:
        doc: dict[str, Any] = {"node": self.node, "address": self.address}
        if self.incarnation:
            doc["incarnation"] = self.incarnation
        return pack(doc)

    @classmethod
    def unpack(cls, data: bytes) -> LeaderRecord:
        v = unpack(data)
        try:
            return cls(v["node"], v["address"], int(v.get("incarnation", 0)))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise Unavailable(f"malformed leader record: {exc}") from None

    def epoch(self, create_revision: int) -> Epoch:
        """The epoch of this claim, held by a key created at ``create_revision``."""
        return make_epoch(self.incarnation, create_revision)


def parse_ids(entries: Mapping[str, _T]) -> dict[int, _T]:
    """``{"12": value}`` (keys relative to a prefix) as ``{12: value}``; other keys are skipped."""
    return {int(k): v for k, v in entries.items() if k.isdigit()}


@dataclass(frozen=True, slots=True)
class PartitionMapRead:
    """The partition map as one reader holds it after a read of ``partitions/``.

    ``records``: every partition whose record could be read now, and those whose record can
    no longer be read but was read before (``stale``): the last readable record stands, as
    if the change that broke it had not arrived yet (a watch may lag; every reader already
    copes with that). ``unknown``: ids whose record could not be read and was never read by
    this reader: neither absent nor known, so nothing may be placed or deleted on the
    strength of it. ``values``: the bytes each record read now was read from (a stale one
    has none), for a claim made only while etcd still holds them (``Coordinator.campaign``)."""

    records: dict[int, PartitionRecord]
    stale: frozenset[int] = frozenset()
    unknown: frozenset[int] = frozenset()
    values: dict[int, bytes] = field(default_factory=dict)


def read_partition_map(entries: dict[str, bytes], before: Mapping[int, PartitionRecord]) -> PartitionMapRead:
    """``partitions/``'s values (keys relative to the prefix) read against what the reader
    held ``before``: the one decoder of the map for nodes and managers."""
    records: dict[int, PartitionRecord] = {}
    values: dict[int, bytes] = {}
    stale: set[int] = set()
    unknown: set[int] = set()
    for pid, value in parse_ids(entries).items():
        try:
            records[pid] = PartitionRecord.unpack(value)
            values[pid] = value
        except PushgateError:
            known = before.get(pid)
            if known is None:
                unknown.add(pid)
            else:
                records[pid] = known
                stale.add(pid)
    return PartitionMapRead(records, frozenset(stale), frozenset(unknown), values)


# Cluster identity and deletions (docs/cluster.md, "Cluster identity" and "Never delete on
# absence"). Kept in their own section: other records above may gain fields independently.


@dataclass(frozen=True, slots=True)
class ClusterIdentity:
    """``cluster``: made once, by the first node that finds none in an etcd it may trust to
    be new (:mod:`.identity`); every node keeps the id in its data directory and in each
    replica. ``incarnation`` is raised when etcd is found to have gone back in time (a
    restore): epochs are ``(incarnation, revision)``, so they still only grow
    (:func:`backend_store.types.make_epoch`)."""

    cluster_id: str
    incarnation: int = 0
    created_at: float = 0.0

    def pack(self) -> bytes:
        return pack(
            {"cluster_id": self.cluster_id, "incarnation": self.incarnation, "created_at": self.created_at}
        )

    @classmethod
    def unpack(cls, data: bytes) -> ClusterIdentity:
        v = unpack(data)
        try:
            cluster_id = v["cluster_id"]
            if not isinstance(cluster_id, str) or not cluster_id:
                raise ValueError("no cluster id")
            return cls(cluster_id, int(v.get("incarnation", 0)), float(v.get("created_at", 0.0)))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise Unavailable(f"malformed cluster record: {exc}") from None


@dataclass(frozen=True, slots=True)
class Tombstone:
    """``tombstones/{partition}/{node}``: the one thing that lets a node delete a replica.

    Written by the manager in a commit fenced on its epoch (a replica moved off the node once
    the new replica set committed past what the old one held, or the partition's queue was
    deleted), or by an operator (``pushgate manager --delete-stray NODE:PARTITION``). A node
    deletes the replica only while the map does not name it there, and only if the replica
    holds nothing past ``lsn`` (None: whatever it holds, for a deleted queue or an operator).
    """

    partition: int
    node: str
    reason: str  # "moved" | "partition_deleted" | "operator"
    lsn: int | None = None
    # The partition's queue (None: not said): a replica labelled for another queue (a
    # partition id reused after an etcd restore) is never deleted by it.
    tenant: str | None = None
    queue: str | None = None
    # A move's only: the voting set that committed past ``lsn`` and its leader's epoch; the
    # node keeps them as its receipt (:class:`MoveReceipt`) when it deletes the copy.
    receipt: MoveReceipt | None = None

    def pack(self) -> bytes:
        doc: dict[str, Any] = {
            "partition": self.partition,
            "node": self.node,
            "reason": self.reason,
            "lsn": self.lsn,
            "tenant": self.tenant,
            "queue": self.queue,
        }
        if self.receipt is not None:
            doc["receipt"] = self.receipt.to_doc()
        return pack(doc)

    @classmethod
    def unpack(cls, data: bytes) -> Tombstone:
        v = unpack(data)
        try:
            lsn, tenant, queue = v.get("lsn"), v.get("tenant"), v.get("queue")
            return cls(
                int(v["partition"]),
                str(v["node"]),
                str(v["reason"]),
                None if lsn is None else int(lsn),
                None if tenant is None else str(tenant),
                None if queue is None else str(queue),
                MoveReceipt.from_doc(v.get("receipt")),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise Unavailable(f"malformed tombstone: {exc}") from None
