"""A backend node (``pushgate node``: :mod:`.local_ports`).

One port (its :class:`~.ports.NodeListener`: TCP for a process) serves both gateways (Backend
operations for the partitions this node leads, wake-ups) and the replication links of other
nodes' leaders (routed by the partition in their hello). The node keeps one store per partition
replica (:class:`~.partition_host.PartitionHost`s from its :class:`~.ports.ReplicaStores`: LMDB
environments under ``DIR/partitions/<id>/`` for a process).

Coordination, all through etcd (see :mod:`.layout`):

- It registers ``nodes/{id}`` under its session's lease and republishes its replicas'
  positions (role, fence, last LSN, last entry's epoch) when they change, at most every
  ``publish_every_s`` (:mod:`.publication`: at once after the incarnation was raised).
- It watches the partition map, the leader keys, the other nodes, queue attributes, the
  cluster's identity record and its tombstones (one :class:`.WatchedPrefix` each), and
  reconciles on every change (and every ``tick_s``) as :func:`.reconcile.decide` says: opens
  the environments of partitions listing it; keeps those the map does not name as strays
  (closed, reported); deletes one only on a tombstone; serves and deletes nothing while etcd
  does not hold its cluster (:mod:`.node_identity`); campaigns for ``leaders/{id}``
  where the map designates it; leads at the campaign's epoch; steps down (resigning the key)
  when it is no longer designated or a follower's fence showed a newer term.
- When its session is lost (etcd unreachable for a TTL, or the process frozen past it) it
  stops leading at once, before anything else, then opens a new session and registers again.
- Check-quorum (:mod:`.quorum`): a leader that has heard from no majority of its replica set
  for ``quorum_window_s`` (while the other replicas registered in etcd are a majority by
  themselves) resigns: it stops
  serving, deletes its leader key, publishes the position its term vouches for as role
  ``resigned``, and does not campaign again for a window, so the manager can promote a
  follower on the majority's fresh positions.

The node is built from its settings (:class:`~.node_config.NodeConfig`) and its ports
(:mod:`.ports`: the coordinator, the listener, the replicas' stores, the clock), so that the
same code runs as a process (:mod:`.local_ports`) and elsewhere. This module holds its life
cycle, watches, main loop and publication; :mod:`.replica_rounds` the reconcile round over
its replicas; :mod:`.node_serving` what it serves on its port.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from ...types import Epoch
from ..coordination.coordinator import Coordinator, CoordinatorUnavailable, PrefixState, Session
from ..coordination.layout import (
    LeaderRecord,
    NodeRecord,
    PartitionRecord,
    ReplicaPosition,
    Tombstone,
    parse_ids,
    read_partition_map,
)
from ..coordination.timeline import KeysSeen, RecordMark
from ..coordination.watched_prefix import StateListener, WatchedPrefix
from ..protocol.stream import NodeStream
from .demands import NodeDemands
from .etcd_records import leaders_moved, read_leaders, read_nodes, read_tombstones
from .events import NodeEvents
from .leadership import NodeLeadership
from .node_config import NodeConfig
from .node_identity import NodeIdentity
from .partition_host import PartitionHost
from .pool_queues import QueueRecords, note_changes
from .ports import NodeClock, NodeFiles, NodeListener, ReplicaStores
from .publication import Publication, node_record
from .receipts import KeptReceipt, remade
from .reconcile import MapView, ReplicaLabel
from .registrations import Registrations
from .replica_rounds import ReplicaRounds
from .served_sets import ServedSets

log = logging.getLogger("pushgate.cluster")
# How long a leader waits after its watch brings changed queue records before its pass
# applies them: the records of the creates of the moment share one pass, whose writes go
# together (a create is a record write since session 73; ``PoolQueues.apply``), and a
# request naming a new queue meanwhile makes it itself (``PoolQueues.apply_named``; a
# gateway of an earlier release sends ``create_queue``: ``PoolQueues.claim_create``). Other
# changes wait this long too (their gateway applies them itself on each partition; another
# gateway sees them within its watch's delay).
QUEUE_APPLY_DELAY_S = 0.1


class Node(ReplicaRounds):
    def __init__(
        self,
        config: NodeConfig,
        coordinator: Coordinator,
        listener: NodeListener,
        replicas: ReplicaStores,
        clock: NodeClock,
        files: NodeFiles,
    ) -> None:
        self.config = config
        self.node_id = config.node_id
        self.layout = config.layout
        self.coordinator = coordinator
        self.listener = listener
        self.replicas = replicas
        self.clock = clock
        self.files = files
        self.hosts: dict[int, PartitionHost] = {}
        # Gateways' standing receives on the partitions this node leads.
        self.demands = NodeDemands(self.hosts, timeout_s=config.request_timeout_s)
        # Which gateway reports each partition's dead-letter moves and expiries.
        self.events = NodeEvents(self.hosts)
        self.session: Session | None = None
        # Gateway connections, in the order they came (a dict: woken in a fixed order).
        self._clients: dict[NodeStream, None] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._lost_sessions: list[Session] = []  # revoked once a new session has registered
        self._watched: list[WatchedPrefix] = []
        self._queue_watch: WatchedPrefix | None = None  # queues/ (node_serving.py waits on it)
        self._changed = asyncio.Event()
        self._stopping = asyncio.Event()
        # What etcd says, from the watches (None: not read yet).
        self._partitions: MapView | None = None
        self._leaders: dict[int, tuple[LeaderRecord, Epoch]] = {}
        self._nodes: dict[str, NodeRecord] = {}
        self._nodes_read = False
        # Whose records were written since this node registered (registrations.py).
        self.registrations = Registrations(self.node_id)
        # Queue records, kept by the keys that change (pool_queues.py).
        self._queues = QueueRecords()
        self._tombstones: dict[int, Tombstone] = {}
        self.publication = Publication(config.publish_every_s)
        # The cluster's identity: what this node keeps, what etcd holds (node_identity.py).
        self.identity = NodeIdentity(
            self.node_id,
            files.cluster_id,
            coordinator,
            self.layout,
            new_cluster_id=files.new_cluster_id,
            wall_clock=clock.wall,
        )
        # When, why and how this node's replicas lead (leadership.py).
        self.leadership = NodeLeadership(
            coordinator,
            self.layout,
            self.node_id,
            lambda: self.address,
            quorum_window_s=config.quorum_window,
            handover_timeout_s=config.handover_timeout_s,
            publish_soon=self._publish_soon,
            identity=self.identity,
            clock=clock.now,
        )
        # Replicas on disk (None: not listed yet), their labels, and those kept as strays
        # (with the last LSN they held when closed).
        self._on_disk: set[int] | None = None
        self._labels: dict[int, ReplicaLabel | None] = {}
        self.strays: dict[int, str] = {}
        # (last_epoch, lsn) of each stray (published: a restored etcd's promotion compares
        # them); read when it stops being served, or once at start (``_rank_strays``).
        self._stray_ranks: dict[int, tuple[int, int]] = {}
        # Replicas this node could not serve (why, and when to try again): strays meanwhile.
        self._unservable: dict[int, tuple[str, float]] = {}
        # Why each partition's steps failed at their last try (``_partition_step``).
        self._failing: dict[tuple[int, str], str] = {}
        # What this node deleted on moves' tombstones (receipts.py), the record each
        # replica was last served on (remembered_records.py) and the voting set, by
        # incarnation (served_sets.py): all read at start.
        self._receipts: dict[int, KeptReceipt] = {}
        self._remembered: dict[int, PartitionRecord] = {}
        self._marks: dict[int, RecordMark] = {}
        self._served_sets = ServedSets({})
        # The newest mod revision of each leader key and of this node's own record seen in
        # this process: one held older shows a restore the records' marks cannot see.
        self._keys_seen = KeysSeen()

    # Life cycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Listen, and start coordinating (returns at once; the node keeps working in tasks)."""
        self._receipts = await self.files.read_receipts()
        self._remembered = await self.files.read_remembered()
        self._marks = await self.files.read_marks()
        self._served_sets = ServedSets(await self.files.read_served_sets())
        await self.listener.listen(self._accept)
        for prefix, handler in (
            (self.layout.partitions, self._on_partitions),
            (self.layout.leaders, self._on_leaders),
            (self.layout.nodes, self._on_nodes),
            (self.layout.queues, self._on_queues),
            (self.layout.cluster, None),  # the identity's own watch (node_identity.py)
            (self.layout.tombstones, self._on_tombstones),
        ):
            if handler is None:
                watched = self.identity.watch
            else:
                watched = WatchedPrefix(self.coordinator, prefix, reread_every_s=2.0)
                if prefix == self.layout.queues:
                    self._queue_watch = watched
            # A queue record concerns only the replicas that hold the queue, which
            # ``_on_queues`` tells; a reconcile of every replica per watch response ran ~35
            # times a second creating queues (issue 49, 8% of a node's samples).
            watched.add_listener(self._listener(handler, reconcile=prefix != self.layout.queues))
            watched.begin()
            self._watched.append(watched)
        self._tasks.append(asyncio.create_task(self._run(), name=f"node {self.node_id}"))

    async def stop(self) -> None:
        self._stopping.set()
        self._changed.set()
        self.listener.close()
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks)
        for watched in self._watched:
            await watched.close()
        for stream in list(self._clients):
            await stream.close()
        await self.demands.close()
        for host in list(self.hosts.values()):
            await host.close()
        self.hosts.clear()
        if self.session is not None:
            with contextlib.suppress(CoordinatorUnavailable):
                await self.session.close()

    # Watches ----------------------------------------------------------------------------------

    def _listener(
        self, handler: Callable[[PrefixState, set[str]], None] | None, *, reconcile: bool = True
    ) -> StateListener:
        def listen(state: PrefixState, keys: set[str]) -> None:
            if handler is not None:
                handler(state, keys)
            self.identity.observe(state)
            if reconcile:
                self._changed.set()

        return listen

    def _on_partitions(self, state: PrefixState, _keys: set[str]) -> None:
        before = self._partitions.records if self._partitions is not None else {}
        read = read_partition_map(state.values(), before)
        self._partitions = MapView(read.records, read.unknown, read.values, parse_ids(state.mod_revisions()))

    def _on_tombstones(self, state: PrefixState, _keys: set[str]) -> None:
        self._tombstones = read_tombstones(self.layout, self.node_id, state)

    def _on_leaders(self, state: PrefixState, _keys: set[str]) -> None:
        self._check_keys({key: entry.mod_revision for key, entry in state.entries.items()})
        leaders = read_leaders(self.layout, state)
        for _, epoch in leaders.values():
            self.identity.timeline.remember(epoch)
        if leaders_moved(self._leaders, leaders, self.hosts):
            self.publication.ask()
        self._leaders = leaders

    def _on_nodes(self, state: PrefixState, _keys: set[str]) -> None:
        own = state.entries.get(self.layout.node(self.node_id))
        if own is not None:
            self._check_keys({own.key: own.mod_revision})
        self._nodes = read_nodes(state)
        self._nodes_read = True
        if self.registrations.observe(state):
            self.publication.ask()  # another node registered: let it hear this one

    def _check_keys(self, mod_revisions: dict[str, int]) -> None:
        """Whether etcd holds a leader key or this node's record at an older mod revision
        than this node saw it at: it went back in time, even when every record this node
        marked is unchanged (a bumped restore to a snapshot taken after their last change;
        coordination/timeline.py, ``KeysSeen``)."""
        incarnation, timeline = self.identity.incarnation, self.identity.timeline
        was_suspect, was_high = timeline.suspect, timeline.high_water
        rewound = timeline.check_keys(self._keys_seen, mod_revisions, incarnation)
        # Once, not at every state until the raise; but also when etcd was suspect already
        # for another reason (a state behind a remembered epoch, which logs nothing): this
        # evidence is new when it raised the high-water mark.
        if rewound and (not was_suspect or timeline.high_water > was_high):
            self._log_keys_rewound(rewound, incarnation, "as its watch shows them")

    def _log_keys_rewound(self, keys: list[str], incarnation: int, evidence: str) -> None:
        """The one line a node logs when a key it watches shows etcd went back, whichever
        check found it (its watch, or etcd's answer to a write of its record): operators and
        tests look for this line (issue 48: a CI run found the write check's own wording
        and no line of this one, though the incarnation had been raised)."""
        log.warning(
            "node %s: etcd holds %s older than this node saw them in incarnation %d (%s): etcd"
            " went back in time (restored from a snapshot?)",
            self.node_id,
            keys,
            incarnation,
            evidence,
        )

    def _on_queues(self, state: PrefixState, keys: set[str]) -> None:
        """Only the records of ``keys`` are read again, and only the pool partitions they
        concern apply them (at ten thousand queues, a create must not cost a pass over
        every queue of every partition): those this node leads and serves, after
        :data:`QUEUE_APPLY_DELAY_S`; the others when their term begins, from the tick."""
        session = self.session
        serving = session is not None and session.valid()
        for pid in sorted(note_changes(self._queues, state, keys, self.hosts)):  # replayable
            host = self.hosts[pid]
            if serving and host.leading and host.handing_over_to is None:
                host.apply_queue_attributes_soon(self._queues, after_s=QUEUE_APPLY_DELAY_S)

    # The main loop ---------------------------------------------------------------------------

    async def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                await self._open_session()
            except CoordinatorUnavailable as exc:
                log.warning("node %s: cannot open an etcd session: %s", self.node_id, exc)
                await self.clock.sleep(0.5)
                continue
            session = self.session
            assert session is not None
            while not self._stopping.is_set() and not session.lost.is_set():
                await self.clock.wait(self._changed, self.config.tick_s)
                self._changed.clear()
                if not session.valid():
                    # In doubt (past its deadline: this loop was held, or etcd answers late):
                    # nothing is acknowledged meanwhile (node_serving), and the keep-alive
                    # either renews it, its keys ours all along, or finds it lost.
                    continue
                try:
                    await self._reconcile(session)
                    await self._publish(session)
                except CoordinatorUnavailable as exc:
                    log.info("node %s: etcd unavailable while reconciling: %s", self.node_id, exc)
                except Exception:  # a store error or a bug: log it, keep the node alive, retry
                    log.exception("node %s: reconciling failed", self.node_id)
                    await self.clock.sleep(self.config.tick_s)
            # The session is lost: nothing claimed under it is ours any more.
            await self._step_down_all("etcd session lost")
            self.session = None
            self._lost_sessions.append(session)

    async def _open_session(self) -> None:
        session = await self.coordinator.open_session(self.config.ttl_s)
        self.session = session
        # Registered as refused, not up, until etcd is known to hold this node's cluster.
        on_disk = await self.replicas.on_disk()
        # A copy on disk is reported from the first record on (a stray until examined): a
        # record without it tells the manager the copy is gone, and the manager then drops
        # its tombstone before this node, which reads each tombstone again before deleting,
        # acts on it (tests/cluster/test_failover.py, a replica down while its queue was
        # deleted, session 34).
        for pid in on_disk - self.hosts.keys():
            self.strays.setdefault(pid, "found on disk, not examined yet")
        await self.identity.judge(
            holds_replicas=bool(on_disk or self.hosts),
            etcd_has_map=False,
            refusing=self._others_refusing,
        )
        self.leadership.claims.clear()
        self.publication.ask()
        self.registrations.registered(None)  # until this session's first write
        await self._publish(session)
        log.info(
            "node %s: registered at %s (lease %x, %g s)",
            self.node_id,
            self.address,
            session.lease_id,
            session.ttl_s,
        )
        # A session this node gave up may live on in etcd: the node counts its TTL from when
        # it sent a renewal, and a renewal a cut held can reach etcd after that. Its keys,
        # this node's leader keys among them, would keep every claim out, this node's own
        # included, until etcd expired it (tests/cluster/test_random_faults.py seed 8,
        # session 41: a 1.39 s cut cost sends 2.87-4.41 s). Revoked only now that the record
        # stands under the new lease: revoked before, the record would vanish for a moment
        # and the manager act on a node it saw gone (session 41's try, simulation all 451585).
        lost, self._lost_sessions = self._lost_sessions, []
        if lost:
            self._tasks = [task for task in self._tasks if not task.done()]
        for old in lost:
            self._tasks.append(asyncio.create_task(revoke_lost(old), name=f"revoke lease {old.lease_id:x}"))

    async def _step_down_all(self, why: str) -> None:
        for host in self.hosts.values():
            if host.leader is not None:
                await host.step_down(why)

    def _publish_soon(self) -> None:
        self.publication.ask()

    async def _publish(self, session: Session) -> None:
        now = self.clock.now()
        if not self.publication.due(now, self.identity.incarnation):
            return  # the next tick publishes what changed meanwhile
        replicas: dict[int, ReplicaPosition] = {}
        for pid, host in self.hosts.items():
            claim = self._leaders.get(pid)
            position = await host.position(claim[1] if claim is not None else 0)
            replicas[pid] = remade(self._receipts.get(pid), self._labels.get(pid), position)
        storage = await self.files.storage(h.store for h in list(self.hosts.values()))
        record = node_record(
            self.address,
            replicas,
            storage,
            refusal=self.identity.verdict.refusal,
            strays=self.strays,
            stray_ranks=self._stray_ranks,
            partitions=self._partitions,
            remembered=self._remembered,
            receipts=self._receipts,
            served_sets=self._served_sets,
            incarnation=self.identity.incarnation,
        )
        if self.publication.wanted(record):
            key = self.layout.node(self.node_id)
            before = self._keys_seen.marks.get(key)
            written = await self.coordinator.register(session, key, record.pack())
            held = written.before
            self.publication.written(record, now)
            if self.registrations.own_revision is None:
                self.registrations.registered(written.revision)
            # What etcd held before this write is evidence too: a node that writes its record
            # (a position or its storage changed) before its watch shows the restored one
            # buries it under a newer mod revision (a CI run of session 42, load average 7:
            # no node of test_etcd_loss.py's late restore noticed it).
            if self.identity.timeline.check_write(before, held, self.identity.incarnation):
                evidence = f"etcd's answer to a write of it: held at revision {held}"
                self._log_keys_rewound([key], self.identity.incarnation, evidence)


async def revoke_lost(session: Session) -> None:
    """Revoke a lost session's lease if etcd still holds it (best effort: etcd may be out of
    reach, and the lease then expires on its own)."""
    with contextlib.suppress(CoordinatorUnavailable):
        await session.close()
