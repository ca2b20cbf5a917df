"""The gateway's cached, watched copy of the partition map: nodes, partitions, leaders.

Built from three watched prefixes (``nodes/``, ``partitions/``, ``leaders/``; docs/cluster.md
has their values). A :class:`PartitionMap` is one immutable picture; :class:`ClusterView`
holds the newest and lets callers wait for a condition on it (a leader for a partition, the
partitions of a new queue). A node answering ``not_leader`` or ``stale_epoch`` makes the
caller :meth:`ClusterView.refresh` rather than wait for the watch.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import msgpack

from ...types import Epoch, Lsn, QueueName, TenantId, make_epoch
from ..coordination import pools
from ..coordination.coordinator import Coordinator, Entry, PrefixState
from ..coordination.identity import ClusterRecord, IdentityVerdict, judge_stateless
from ..coordination.layout import Layout
from ..coordination.storage_record import NodeStorage
from ..coordination.watched_prefix import WatchedPrefix

log = logging.getLogger("pushgate.cluster")

PartitionId = int


@dataclass(frozen=True, slots=True)
class ReplicaPosition:
    """What a node publishes about one replica it holds."""

    role: str
    epoch: Epoch
    lsn: Lsn


@dataclass(frozen=True, slots=True)
class NodeInfo:
    id: str
    address: str
    state: str
    replicas: dict[PartitionId, ReplicaPosition] = field(default_factory=dict)
    storage: NodeStorage | None = None  # what it last published (node_storage.py)
    strays: dict[PartitionId, str] = field(default_factory=dict)  # kept, not served: why
    refusal: str | None = None  # why it refuses etcd (state "refused")


@dataclass(frozen=True, slots=True)
class LeaderClaim:
    """Who holds ``leaders/{id}``; the epoch is that key's create_revision behind the
    incarnation its record names (``LeaderRecord.epoch``)."""

    node: str
    address: str
    epoch: Epoch


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    id: PartitionId
    tenant: TenantId
    queue: QueueName
    index: int
    replicas: tuple[str, ...]
    designated: str | None
    mode: str
    leader: LeaderClaim | None = None
    # The create_revision of the queue record it was made for (None: not recorded).
    queue_revision: int | None = None
    # A membership change under way (docs/cluster.md, "Membership changes"): replicas
    # catching up without a vote, voters on their way out, a hand-over asked for.
    learners: tuple[str, ...] = ()
    leaving: tuple[str, ...] = ()
    successor: str | None = None
    # A pool partition seen by one of the queues placed on it (:func:`bind_to_queue`):
    # ``tenant``, ``queue``, ``index`` and ``queue_revision`` are that queue's, and the newest
    # map's copy is found by ``id`` (:meth:`PartitionMap.resolve`).
    placed: bool = False

    @property
    def pool(self) -> str | None:
        """The pool of a pool partition as the map has it (None: a queue's own partition, or
        one bound to a queue, ``placed``, whose tenant and name are the queue's)."""
        if self.placed:
            return None
        return self.queue if self.tenant == pools.POOL_TENANT else None

    def serves(self, queue_revision: int | None) -> bool:
        """Whether it belongs to that incarnation of its queue (not one deleted before)."""
        return self.queue_revision is None or queue_revision is None or self.queue_revision == queue_revision


def bind_to_queue(
    part: PartitionInfo | None,
    pid: PartitionId,
    tenant: TenantId,
    queue: QueueName,
    index: int,
    queue_revision: int | None,
) -> PartitionInfo:
    """Pool partition ``pid`` (``part``: the map's copy, None if the map has yet to show it)
    as the partition ``index`` of ``tenant``'s ``queue``: calls through it carry the queue's
    tenant, and follow the partition by its id."""
    if part is None:
        return PartitionInfo(
            pid, tenant, queue, index, (), None, "sync", queue_revision=queue_revision, placed=True
        )
    return replace(part, tenant=tenant, queue=queue, index=index, queue_revision=queue_revision, placed=True)


def _decode(entry: Entry) -> dict[Any, Any] | None:
    try:
        doc = msgpack.unpackb(entry.value, strict_map_key=False)
    except (ValueError, msgpack.UnpackException):
        log.warning("ignoring an unreadable value at %s", entry.key)
        return None
    return doc if isinstance(doc, dict) else None


def _node(node_id: str, entry: Entry) -> NodeInfo | None:
    doc = _decode(entry)
    if doc is None or not isinstance(doc.get("address"), str):
        return None
    replicas: dict[PartitionId, ReplicaPosition] = {}
    for pid, pos in (doc.get("replicas") or {}).items():
        try:
            replicas[int(pid)] = ReplicaPosition(
                str(pos.get("role", "")), Epoch(int(pos.get("epoch", 0))), Lsn(int(pos.get("lsn", 0)))
            )
        except (AttributeError, TypeError, ValueError):
            continue
    storage = NodeStorage.from_dict(doc.get("storage"))
    strays: dict[PartitionId, str] = {}
    for pid, why in (doc.get("strays") or {}).items():
        with contextlib.suppress(TypeError, ValueError):
            strays[int(pid)] = str(why)
    refusal = doc.get("refusal")
    return NodeInfo(
        node_id,
        doc["address"],
        str(doc.get("state", "up")),
        replicas,
        storage,
        strays,
        None if refusal is None else str(refusal),
    )


def _leader(entry: Entry) -> LeaderClaim | None:
    doc = _decode(entry)
    if doc is None or not isinstance(doc.get("node"), str):
        return None
    incarnation = doc.get("incarnation", 0)
    if not isinstance(incarnation, int) or incarnation < 0:
        log.warning("ignoring a leader record with a bad incarnation at %s", entry.key)
        return None
    return LeaderClaim(
        doc["node"], str(doc.get("address", "")), make_epoch(incarnation, entry.create_revision)
    )


def _partition(pid: PartitionId, entry: Entry, leader: LeaderClaim | None) -> PartitionInfo | None:
    doc = _decode(entry)
    if doc is None:
        return None
    try:
        return PartitionInfo(
            id=pid,
            tenant=TenantId(str(doc["tenant"])),
            queue=QueueName(str(doc["queue"])),
            index=int(doc.get("index", 0)),
            replicas=tuple(str(n) for n in doc.get("replicas") or ()),
            designated=None if doc.get("leader") is None else str(doc["leader"]),
            mode=str(doc.get("mode", "sync")),
            leader=leader,
            queue_revision=None if doc.get("queue_revision") is None else int(doc["queue_revision"]),
            learners=tuple(str(n) for n in doc.get("learners") or ()),
            leaving=tuple(str(n) for n in doc.get("leaving") or ()),
            successor=None if doc.get("successor") is None else str(doc["successor"]),
        )
    except (KeyError, TypeError, ValueError):
        log.warning("ignoring a malformed partition record at %s", entry.key)
        return None


def _ids(state: PrefixState) -> dict[str, Entry]:
    return {key[len(state.prefix) :]: entry for key, entry in state.entries.items()}


@dataclass(frozen=True, slots=True)
class PartitionMap:
    """One consistent-enough picture of the cluster (each prefix read at one revision)."""

    nodes: dict[str, NodeInfo] = field(default_factory=dict)
    partitions: dict[PartitionId, PartitionInfo] = field(default_factory=dict)
    by_queue: dict[tuple[TenantId, QueueName], tuple[PartitionInfo, ...]] = field(default_factory=dict)

    @classmethod
    def build(
        cls,
        nodes: PrefixState,
        partitions: PrefixState,
        leaders: PrefixState,
        before: PartitionMap | None = None,
    ) -> PartitionMap:
        """The map as read; a partition record that cannot be read keeps what ``before``
        held of it (as if the change had not arrived yet: coordination/layout.py's
        ``read_partition_map`` does the same for nodes and managers)."""
        node_map = {nid: n for nid, e in _ids(nodes).items() if (n := _node(nid, e)) is not None}
        claims: dict[PartitionId, LeaderClaim] = {}
        for key, entry in _ids(leaders).items():
            claim = _leader(entry)
            if claim is not None and key.isdigit():
                claims[int(key)] = claim
        parts: dict[PartitionId, PartitionInfo] = {}
        for key, entry in _ids(partitions).items():
            if key.isdigit():
                pid = int(key)
                part = _partition(pid, entry, claims.get(pid))
                if part is None and before is not None and pid in before.partitions:
                    part = replace(before.partitions[pid], leader=claims.get(pid))
                if part is not None:
                    parts[part.id] = part
        grouped: dict[tuple[TenantId, QueueName], list[PartitionInfo]] = {}
        for part in parts.values():
            grouped.setdefault((part.tenant, part.queue), []).append(part)
        by_queue = {k: tuple(sorted(v, key=lambda p: p.index)) for k, v in grouped.items()}
        return cls(node_map, parts, by_queue)

    def of_queue(
        self, tenant: TenantId, queue: QueueName, queue_revision: int | None = None
    ) -> tuple[PartitionInfo, ...]:
        """A queue's partitions by index (empty: the manager has not placed it yet)."""
        return tuple(p for p in self.by_queue.get((tenant, queue), ()) if p.serves(queue_revision))

    def partition(
        self, tenant: TenantId, queue: QueueName, index: int, queue_revision: int | None
    ) -> PartitionInfo | None:
        for part in self.of_queue(tenant, queue, queue_revision):
            if part.index == index:
                return part
        return None

    def resolve(self, part: PartitionInfo) -> PartitionInfo | None:
        """``part`` as this map has it (its leader may have moved); None if it is not here."""
        if part.placed:
            found = self.partitions.get(part.id)
            if found is None or found.pool is None:
                return None
            return bind_to_queue(found, part.id, part.tenant, part.queue, part.index, part.queue_revision)
        return self.partition(part.tenant, part.queue, part.index, part.queue_revision)

    def pool_slots(self, pool: str) -> tuple[PartitionInfo, ...]:
        """A pool's partitions by slot (empty: the manager has not made it yet)."""
        return self.by_queue.get((TenantId(pools.POOL_TENANT), QueueName(pool)), ())

    def complete(
        self, tenant: TenantId, queue: QueueName, count: int, queue_revision: int | None = None
    ) -> bool:
        """Whether the queue has all ``count`` partitions, each with a leader."""
        parts = self.of_queue(tenant, queue, queue_revision)
        return [p.index for p in parts] == list(range(count)) and all(p.leader for p in parts)

    def leaderless(self) -> list[PartitionInfo]:
        return sorted((p for p in self.partitions.values() if p.leader is None), key=lambda p: p.id)


class ClusterView:
    """The newest :class:`PartitionMap`, kept current by three watches."""

    def __init__(
        self,
        coordinator: Coordinator,
        paths: Layout,
        *,
        reread_every_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._clock = clock
        self.nodes = WatchedPrefix(coordinator, paths.nodes, reread_every_s=reread_every_s)
        self.partitions = WatchedPrefix(coordinator, paths.partitions, reread_every_s=reread_every_s)
        self.leaders = WatchedPrefix(coordinator, paths.leaders, reread_every_s=reread_every_s)
        # The cluster's identity (coordination/identity.py): while etcd holds no cluster id,
        # or another than the one first seen, the map is not to be trusted (not ready).
        self.cluster = WatchedPrefix(coordinator, paths.cluster, reread_every_s=reread_every_s)
        self.identity = IdentityVerdict(refusal="the cluster record was not read yet")
        self._paths = paths
        self.cluster.add_listener(self._judge)
        self.map = PartitionMap()
        self._changed = asyncio.Event()
        self._closed = False
        self._listeners: list[Callable[[PartitionMap], None]] = []
        for watched in (self.nodes, self.partitions, self.leaders):
            watched.add_listener(self._rebuild)

    def add_listener(self, listener: Callable[[PartitionMap], None]) -> None:
        """``listener(map)`` after each change (a leader moved, a partition appeared)."""
        self._listeners.append(listener)

    async def start(self) -> None:
        for watched in (self.cluster, self.nodes, self.partitions, self.leaders):
            await watched.start()
        self._rebuild(self.nodes.state, set())

    async def close(self) -> None:
        # Waiters give up at once: a closed view never changes again.
        self._closed = True
        self._changed.set()
        for watched in (self.leaders, self.partitions, self.nodes, self.cluster):
            await watched.close()

    async def refresh(self) -> None:
        """Re-read partitions and leaders now (a node said our picture is stale)."""
        await self.partitions.refresh()
        await self.leaders.refresh()

    def _judge(self, state: PrefixState, _keys: set[str]) -> None:
        entry = state.entries.get(self._paths.cluster)
        record = ClusterRecord.parse(entry.value if entry is not None else None)
        first_seen = self.identity.cluster_id
        verdict = judge_stateless(record, first_seen, self._paths)
        if verdict.refusal is not None and verdict.refusal != self.identity.refusal:
            log.error("cluster metadata not trusted: %s", verdict.refusal)
        elif verdict.refusal is None and self.identity.refusal is not None and first_seen is not None:
            log.warning("etcd holds cluster %s again; its metadata is trusted", verdict.cluster_id)
        self.identity = verdict

    def _rebuild(self, _state: PrefixState, _keys: set[str]) -> None:
        self.map = PartitionMap.build(self.nodes.state, self.partitions.state, self.leaders.state, self.map)
        self._changed.set()
        for listener in list(self._listeners):
            listener(self.map)

    async def wait_for(self, condition: Callable[[PartitionMap], bool], timeout_s: float) -> bool:
        """Wait until ``condition(map)`` holds; False if it did not within ``timeout_s``, or
        the view is closed."""
        deadline = self._clock() + timeout_s
        while not condition(self.map):
            if self._closed:
                return False
            remaining = deadline - self._clock()
            if remaining <= 0:
                return False
            self._changed.clear()
            try:
                async with asyncio.timeout(remaining):
                    await self._changed.wait()
            except TimeoutError:
                return condition(self.map)
        return True
