"""The backend node process (``pushgate node``).

One TCP port serves both gateways (Backend operations for the partitions this node leads,
wake-ups) and the replication links of other nodes' leaders (routed by the partition in their
hello). The node keeps one LMDB environment per partition replica under
``DIR/partitions/<id>/`` (:class:`~.partition_host.PartitionHost`).

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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from pathlib import Path
from typing import Any

from ...encryption import Keyring
from ...errors import PushgateError, Unavailable
from ...options import StoreOptions
from ...private_files import warning_lines
from ...tls_reload import RELOAD_EVERY_S, TlsReloader
from ...types import Epoch
from ..coordination.coordinator import Coordinator, CoordinatorUnavailable, PrefixState, Session
from ..coordination.etcd_tls import EtcdTls
from ..coordination.identity import refusing_nodes
from ..coordination.layout import (
    Layout,
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
from ..protocol import ops
from ..protocol.connection import Closed, Connection, ConnectionClosedError, Event
from ..protocol.stream import NodeStream
from ..protocol.tls import NodeTls, TlsFiles, node_tls_loader, serve_node_protocol
from ..protocol.wire import Demand, Hello, Request, Withdraw
from .demands import NodeDemands
from .etcd_records import (
    leaders_moved,
    read_leaders,
    read_nodes,
    read_queues,
    read_tombstones,
    tombstone_stands,
)
from .events import NodeEvents
from .leadership import NodeLeadership
from .node_identity import NodeIdentity, pack_label, read_label
from .partition_host import PartitionHost
from .publication import Publication, node_record
from .receipts import KeptReceipt, keep_receipt, read_receipts, remade
from .reconcile import Decision, HostedReplica, IdentityVerdict, MapView, ReplicaLabel, decide
from .remembered_records import forget, read_marks, read_remembered, remember, worth_keeping
from .served_sets import ServedSets, forget_served_set, keep_served_set, read_served_sets
from .storage_gauge import StorageGauge

log = logging.getLogger("pushgate.cluster")
# A replica this node could not serve (it would not open, or what serving it needs could not
# be kept on disk) is tried again this long after: a stray meanwhile.
_RETRY_AFTER_S = 30.0
_DELETING = "deleting its copy"  # the step's name, in its failures' reasons


class Node:
    def __init__(
        self,
        node_id: str,
        data_dir: Path,
        coordinator: Coordinator,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        advertise: str | None = None,
        ttl_s: float = 2.0,
        tick_s: float = 0.2,
        publish_every_s: float = 0.5,
        request_timeout_s: float = 5.0,
        log_keep: int = 10000,
        sweep_every_s: float = 5.0,
        quorum_window_s: float | None = None,
        handover_timeout_s: float = 2.0,
        keyring: Keyring | None = None,
        layout: Layout | None = None,
        tls: NodeTls | None = None,
        clock: Callable[[], float] | None = None,
        disk_reserve_bytes: int | None = None,
    ) -> None:
        """``quorum_window_s``: check-quorum's window (default one lease TTL; 0: off).
        ``handover_timeout_s``: how long a hand-over may refuse writes waiting for its
        successor to catch up before this leader serves again (leadership.py).
        ``keyring``: bodies are sealed at rest in every partition store (the same keys on
        every node: a follower promoted must open what its leader sealed).
        ``tls``: the port serves mutual TLS only, and leader links dial with it (tls.py).
        ``disk_reserve_bytes``: room on each replica's disk that sends may not use
        (docs/store.md, "Full disk or map"; None: 2% of the disk, 1 MiB to 1 GiB).
        ``clock``: the stores' time (message timestamps, visibility, retention, dedupe
        windows); None: ``time.time``. An embedding that holds its clock still (the contract
        suite's in-process cluster) calls ``PartitionHost.sweep_soon`` when it moves it."""
        self.tls = tls
        self.layout = layout or Layout()
        self.node_id = node_id
        self.data_dir = data_dir
        self.coordinator = coordinator
        self.host = host
        self.port = port
        self.advertise = advertise
        self.ttl_s = ttl_s
        self.tick_s = tick_s
        self.request_timeout_s = request_timeout_s
        # One TTL: a leader cut from its followers costs what a leader cut from etcd costs
        # (its lease), issue 24's "no minority fault costs more than its lease" (two TTLs,
        # before, cost 4.2 s per cut). Four 0.5 s heartbeats: a loaded machine's stall
        # that long would cost the etcd session (same TTL) anyway.
        self.quorum_window_s = ttl_s if quorum_window_s is None else quorum_window_s
        # When, why and how this node's replicas lead (leadership.py).
        # No sweeper in the stores: a follower's store changes only through the leader's log;
        # the leader sweeps (PartitionHost) and its deletions replicate like any write.
        self.options = StoreOptions(
            replication_log_keep=log_keep,
            sweep_interval_s=0,
            keyring=keyring,
            clock=clock,
            disk_reserve_bytes=disk_reserve_bytes,
        )
        self.sweep_every_s = sweep_every_s
        self.hosts: dict[int, PartitionHost] = {}
        # Gateways' standing receives on the partitions this node leads.
        self.demands = NodeDemands(self.hosts, timeout_s=request_timeout_s)
        # Which gateway reports each partition's dead-letter moves and expiries.
        self.events = NodeEvents(self.hosts)
        # Disk and map use, published with the positions (node_storage.py).
        self.storage = StorageGauge(self.data_dir)
        self.session: Session | None = None
        self._server: asyncio.Server | None = None
        self._clients: set[NodeStream] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self._lost_sessions: list[Session] = []  # revoked once a new session has registered
        self._watched: list[WatchedPrefix] = []
        self._changed = asyncio.Event()
        self._stopping = asyncio.Event()
        # What etcd says, from the watches (None: not read yet).
        self._partitions: MapView | None = None
        self._leaders: dict[int, tuple[LeaderRecord, Epoch]] = {}
        self._nodes: dict[str, NodeRecord] = {}
        self._nodes_read = False
        self._queues: dict[tuple[str, str], dict[str, Any]] = {}
        self.publication = Publication(publish_every_s)
        # The cluster's identity: what this node keeps, what etcd holds (node_identity.py).
        self.identity = NodeIdentity(node_id, data_dir, coordinator, self.layout)
        self.leadership = NodeLeadership(
            coordinator,
            self.layout,
            node_id,
            lambda: self.address,
            quorum_window_s=self.quorum_window_s,
            handover_timeout_s=handover_timeout_s,
            publish_soon=self._publish_soon,
            identity=self.identity,
        )
        self._tombstones: dict[int, Tombstone] = {}
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

    @property
    def address(self) -> str:
        return self.advertise or f"{self.host}:{self.port}"

    # Life cycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Listen, and start coordinating (returns at once; the node keeps working in tasks)."""
        self._receipts = await asyncio.to_thread(read_receipts, self.data_dir)
        self._remembered = await asyncio.to_thread(read_remembered, self.data_dir)
        self._marks = await asyncio.to_thread(read_marks, self.data_dir)
        self._served_sets = ServedSets(await asyncio.to_thread(read_served_sets, self.data_dir))
        server_tls = self.tls.server if self.tls is not None else None
        self._server = await serve_node_protocol(self._accept, self.host, self.port, server_tls)
        self.port = self._server.sockets[0].getsockname()[1]
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
            watched.add_listener(self._listener(handler))
            watched.begin()
            self._watched.append(watched)
        self._tasks.append(asyncio.create_task(self._run(), name=f"node {self.node_id}"))

    async def stop(self) -> None:
        self._stopping.set()
        self._changed.set()
        if self._server is not None:
            self._server.close()
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

    def _listener(self, handler: Callable[[PrefixState], None] | None) -> StateListener:
        def listen(state: PrefixState, _keys: set[str]) -> None:
            if handler is not None:
                handler(state)
            self.identity.observe(state)
            self._changed.set()

        return listen

    def _on_partitions(self, state: PrefixState) -> None:
        before = self._partitions.records if self._partitions is not None else {}
        read = read_partition_map(state.values(), before)
        self._partitions = MapView(read.records, read.unknown, read.values, parse_ids(state.mod_revisions()))

    def _on_tombstones(self, state: PrefixState) -> None:
        self._tombstones = read_tombstones(self.layout, self.node_id, state)

    def _on_leaders(self, state: PrefixState) -> None:
        self._check_keys({key: entry.mod_revision for key, entry in state.entries.items()})
        leaders = read_leaders(self.layout, state)
        for _, epoch in leaders.values():
            self.identity.timeline.remember(epoch)
        if leaders_moved(self._leaders, leaders, self.hosts):
            self.publication.ask()
        self._leaders = leaders

    def _on_nodes(self, state: PrefixState) -> None:
        own = state.entries.get(self.layout.node(self.node_id))
        if own is not None:
            self._check_keys({own.key: own.mod_revision})
        self._nodes = read_nodes(state)
        self._nodes_read = True

    def _check_keys(self, mod_revisions: dict[str, int]) -> None:
        """Whether etcd holds a leader key or this node's record at an older mod revision
        than this node saw it at: it went back in time, even when every record this node
        marked is unchanged (a bumped restore to a snapshot taken after their last change;
        coordination/timeline.py, ``KeysSeen``)."""
        incarnation, timeline = self.identity.incarnation, self.identity.timeline
        was_suspect = timeline.suspect
        rewound = timeline.check_keys(self._keys_seen, mod_revisions, incarnation)
        if rewound and not was_suspect:  # once, not at every state until the raise
            log.warning(
                "node %s: etcd holds %s older than this node saw them in incarnation %d: etcd"
                " went back in time (restored from a snapshot?)",
                self.node_id,
                rewound,
                incarnation,
            )

    async def _others_refusing(self) -> list[str]:
        """The other nodes registered in etcd as refusing it: from the watch, or read now
        if the watch has not delivered yet (asked only before founding a cluster)."""
        nodes = self._nodes
        if not self._nodes_read:
            nodes = read_nodes(await self.coordinator.read_prefix(self.layout.nodes))
        return refusing_nodes(nodes, self.node_id)

    def _on_queues(self, state: PrefixState) -> None:
        self._queues = read_queues(state)

    # The main loop ---------------------------------------------------------------------------

    async def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                await self._open_session()
            except CoordinatorUnavailable as exc:
                log.warning("node %s: cannot open an etcd session: %s", self.node_id, exc)
                await asyncio.sleep(0.5)
                continue
            session = self.session
            assert session is not None
            while not self._stopping.is_set() and session.valid():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.tick_s):
                        await self._changed.wait()
                self._changed.clear()
                if not session.valid():
                    break
                try:
                    await self._reconcile(session)
                except CoordinatorUnavailable as exc:
                    log.info("node %s: etcd unavailable while reconciling: %s", self.node_id, exc)
                except Exception:  # a store error or a bug: log it, keep the node alive, retry
                    log.exception("node %s: reconciling failed", self.node_id)
                    await asyncio.sleep(self.tick_s)
            # The session is lost: nothing claimed under it is ours any more.
            await self._step_down_all("etcd session lost")
            self.session = None
            self._lost_sessions.append(session)

    async def _open_session(self) -> None:
        session = await self.coordinator.open_session(self.ttl_s)
        self.session = session
        # Registered as refused, not up, until etcd is known to hold this node's cluster.
        on_disk = await asyncio.to_thread(self._replicas_on_disk)
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
        await self._publish(session)
        log.info("node %s: registered at %s (lease %x)", self.node_id, self.address, session.lease_id)
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

    async def _reconcile(self, session: Session) -> None:
        if self._on_disk is None and self._partitions is not None:
            # The first decision also sees the replicas left on disk from before this start.
            self._on_disk = await asyncio.to_thread(self._replicas_on_disk)
        known = self._on_disk or set()
        verdict = await self.identity.judge(
            holds_replicas=bool(known or self.hosts),
            etcd_has_map=bool(self._partitions is not None and self._partitions.records),
            refusing=self._others_refusing,
        )
        decision = self._decide(verdict, {})
        opened: dict[int, PartitionHost] = {}
        try:
            if decision.refused is None:
                # New replicas are opened aside and their labels read before anything serves
                # them: a replica of another cluster or queue is never served, not even once.
                tried = [p for p in decision.serve if p not in self.hosts]
                for pid in tried:
                    if (host := await self._try_open(pid)) is not None:
                        opened[pid] = host
                if tried:
                    decision = self._decide(verdict, opened)
            for pid in [p for p in opened if p in decision.serve]:
                self.hosts[pid] = opened.pop(pid)
                known.add(pid)
        finally:
            # Not served (a stray now), or the round failed: never left open unrecorded (a
            # second open of it in this process would fail for good).
            for host in opened.values():
                await host.close()
        # A copy its tombstone could not delete yet is a stray meanwhile.
        undeleted = self._undeleted(decision.delete)
        await self._keep_strays({**decision.strays, **undeleted})
        await self._rank_strays()
        # Each tombstone read again directly, then the cluster record: never delete on what a
        # watch shows alone.
        deletions = {
            pid: why
            for pid, why in decision.delete.items()
            if await tombstone_stands(
                self.coordinator, self.layout, self.node_id, pid, self._tombstones.get(pid)
            )
        }
        refusal = await self.identity.refusal_now() if deletions else None
        if refusal is not None:
            log.warning("node %s: deleting nothing now: %s", self.node_id, refusal)
        else:
            for pid, why in deletions.items():
                if await self._partition_step(pid, _DELETING, self._delete_replica(pid, why)) is None:
                    known.discard(pid)
            if (now := self._undeleted(decision.delete)) != undeleted:
                self.strays = {p: w for p, w in self.strays.items() if p not in undeleted} | now
                self.publication.ask()
        self._on_disk = known
        if decision.refused is not None:
            await self._publish(session)
            return
        for host in self.hosts.values():
            self.identity.timeline.remember(host.store.epoch)
        self._check_marks()
        # Before any campaign: settle whether etcd went back in time (coordination/timeline.py).
        await self.identity.settle_timeline()
        addresses = {n: rec.address for n, rec in self._nodes.items()}
        for pid, record in decision.serve.items():
            serving = self.hosts.get(pid)
            if serving is None:
                # Named by the map as it changed while other replicas were being opened (the
                # second decision above): opened on the next round, 0.2 s on.
                continue
            value = decision.serve_values.get(pid)
            kept = await self._partition_step(
                pid,
                "keeping on disk what serving it needs",
                self._keep_first(serving, record, value, verdict),
            )
            if kept is not None:
                await self._set_aside(pid, kept)
                continue
            await self._partition_step(
                pid,
                "serving it",
                self.leadership.reconcile(
                    session, serving, record, addresses, self._leaders, self._nodes, self._queues, value
                ),
            )
        await self._publish(session)

    def _undeleted(self, delete: Collection[int]) -> dict[int, str]:
        """The copies of ``delete`` whose deletion failed at its last try, with why: strays
        meanwhile (not served, reported: the manager keeps a tombstone while a node reports
        the copy)."""
        return {pid: why for (pid, step), why in self._failing.items() if step == _DELETING and pid in delete}

    async def _partition_step(self, pid: int, what: str, step: Awaitable[None]) -> str | None:
        """Await one partition's ``step`` of a round: None once done, else why it failed.

        A failure costs that partition alone, this round: logged (once per reason, with its
        traceback) and tried again next round, while the node goes on with its other
        partitions and publishes its record. A round was all or nothing: one partition whose
        step kept failing (a small file that a full disk will not take) stopped the node's
        record and every other partition's role changes for good
        (tests/cluster/test_failing_partition_steps.py). etcd unavailable is no partition's
        failure: it ends the round (``_run``)."""
        try:
            await step
        except CoordinatorUnavailable:
            raise
        except Exception as exc:  # a store's or a file's error, or a bug: this partition's alone
            why = f"{what} failed: {exc}"
            if self._failing.get((pid, what)) != why:
                log.error("node %s: partition %d: %s", self.node_id, pid, why, exc_info=exc)
            self._failing[pid, what] = why
            return why
        if self._failing.pop((pid, what), None) is not None:
            log.warning("node %s: partition %d: %s works again", self.node_id, pid, what)
        return None

    async def _keep_first(
        self,
        host: PartitionHost,
        record: PartitionRecord,
        record_value: bytes | None,
        verdict: IdentityVerdict,
    ) -> None:
        """Keep what serving ``host`` on ``record`` needs on disk first: the replica's label,
        the record (remembered_records.py) and the voting set (served_sets.py)."""
        pid = host.partition
        await self._label(host, record, verdict)
        if record_value is None:
            return
        # Marked when it changes, or first seen by a version that marks. Not while etcd is
        # suspect: the record may be one a restore brought back, and its mark would bury the
        # evidence.
        mark = self._mark_now(pid)
        kept, kept_mark = self._remembered.get(pid), self._marks.get(pid)
        if worth_keeping(record, mark, kept, kept_mark) and not self.identity.timeline.suspect:
            await asyncio.to_thread(remember, self.data_dir, pid, record, mark)
            self._remembered[pid] = record
            if mark is not None:
                self._marks[pid] = mark
        await self._keep_served_set(pid, record, host)

    async def _set_aside(self, pid: int, why: str) -> None:
        """Stop serving a replica whose needs could not be kept (a full disk): a stray with
        why, tried again after ``_RETRY_AFTER_S``. Left serving, it would hold a role it may
        not: as a designated leader that never campaigns, its partition had no leader."""
        self._unservable[pid] = (why, time.monotonic() + _RETRY_AFTER_S)
        await self._keep_strays({**self.strays, pid: why})

    def _check_marks(self) -> None:
        """Whether etcd holds a record this node marked at an older mod revision: it went
        back in time, even when its revision did not (coordination/timeline.py)."""
        if self._partitions is None or not self._marks:
            return
        incarnation, timeline = self.identity.incarnation, self.identity.timeline
        was_suspect = timeline.suspect
        rewound = timeline.check_marks(self._marks, self._partitions.mod_revisions, incarnation)
        if rewound and not was_suspect:  # once, not at every tick until the raise
            log.warning(
                "node %s: etcd holds the records of partitions %s older than this node saw them"
                " in incarnation %d: etcd went back in time (restored from a snapshot?)",
                self.node_id,
                rewound,
                incarnation,
            )

    def _mark_now(self, pid: int) -> RecordMark | None:
        """The mark of ``pid``'s record as this node holds it now (None: not read now)."""
        if self._partitions is None or pid not in self._partitions.mod_revisions:
            return None
        return RecordMark(self.identity.incarnation, self._partitions.mod_revisions[pid])

    async def _keep_served_set(self, pid: int, record: PartitionRecord, host: PartitionHost) -> None:
        """Keep the voting set ``host``'s copy is served on (served_sets.py)."""
        last_epoch, last_lsn = host.last_entry()
        served = self._served_sets.served(
            pid, record.replicas, self.identity.incarnation, last_epoch, last_lsn
        )
        if served is not None:
            await asyncio.to_thread(keep_served_set, self.data_dir, pid, served)
            self._served_sets.keep(pid, served)

    def _decide(self, verdict: IdentityVerdict, opened: dict[int, PartitionHost]) -> Decision:
        hosted = {
            pid: HostedReplica(
                pid, open=False, last_lsn=rank[1] if (rank := self._stray_ranks.get(pid)) else None
            )
            for pid in self._on_disk or ()
        }
        now = time.monotonic()
        for pid, (why, retry_at) in self._unservable.items():
            if now < retry_at:
                hosted[pid] = HostedReplica(pid, open=False, unservable=why)
        for pid, host in [*self.hosts.items(), *opened.items()]:
            hosted[pid] = HostedReplica(pid, True, self._labels.get(pid), host.store.last_lsn)
        return decide(self.node_id, hosted, self._partitions, self._tombstones, verdict)

    async def _try_open(self, pid: int) -> PartitionHost | None:
        """Open a replica (to serve it, or to read a stray's position); None if it cannot be
        opened. Then it is kept as a stray, reported with why, and tried again after
        ``_RETRY_AFTER_S``: one damaged replica must not stop the node serving the others
        (it stopped every partition of the node, and kept its healthy replicas open
        unrecorded: tests/cluster/test_unopenable_replica.py)."""
        try:
            host = await self._open_host(pid)
        except Exception as exc:  # whatever a damaged or unreadable replica raises: its failure alone
            why = f"cannot be opened here: {exc}"
            if (before := self._unservable.get(pid)) is None or before[0] != why:
                log.error("node %s: partition %d %s", self.node_id, pid, why, exc_info=exc)
            self._unservable[pid] = (why, time.monotonic() + _RETRY_AFTER_S)
            return None
        if self._unservable.pop(pid, None) is not None:
            log.warning("node %s: partition %d opens again; serving it is tried again", self.node_id, pid)
        return host

    async def _open_host(self, pid: int) -> PartitionHost:
        host = PartitionHost(
            pid,
            self._replica_path(pid),
            self.node_id,
            self.options,
            self._notify,
            sweep_every_s=self.sweep_every_s,
            tls=self.tls.client if self.tls is not None else None,
        )
        await host.open()
        try:
            self._labels[pid] = await read_label(host.store)
        except BaseException:
            await host.close()
            raise
        return host

    async def _label(self, host: PartitionHost, record: PartitionRecord, verdict: IdentityVerdict) -> None:
        """Label a served replica that carries no label yet (new, or from before labels)."""
        pid = host.partition
        if self._labels.get(pid) is not None or verdict.cluster_id is None:
            return
        label = ReplicaLabel(
            verdict.cluster_id, pid, record.tenant, record.queue, record.index, record.queue_revision
        )
        await host.store.set_replica_label(pack_label(label))
        self._labels[pid] = label

    async def _keep_strays(self, strays: dict[int, str]) -> None:
        """Stop serving replicas that became strays (their files stay), and report each once."""
        for pid, why in strays.items():
            host = self.hosts.pop(pid, None)
            if host is not None:
                self._stray_ranks[pid] = host.last_entry()
                self.events.forget_partition(pid)
                await self._partition_step(pid, "closing it", self._stop_serving(host))
            if self.strays.get(pid) != why:
                log.warning(
                    "node %s: keeping partition %d as a stray, not served: %s", self.node_id, pid, why
                )
                self.publication.ask()
        if strays.keys() != self.strays.keys():
            self.publication.ask()
        self.strays = dict(strays)

    async def _stop_serving(self, host: PartitionHost) -> None:
        await self.leadership.resign_key(host.partition)
        await host.close()

    async def _rank_strays(self) -> None:
        """Read the position of each stray this process never held open (found on disk at
        start): opened aside, read and closed, never served. Published, it lets a promotion
        after an etcd restore see a stray of a node restarted since it held the replica."""
        for pid in [p for p in self.strays if p not in self._stray_ranks and p not in self.hosts]:
            if not self._replica_path(pid).is_dir() or pid in self._unservable:
                continue  # a re-seed's leftovers, or a copy that cannot be read: no position
            host = await self._try_open(pid)
            if host is None:
                continue
            try:
                self._stray_ranks[pid] = host.last_entry()
            finally:
                await host.close()
            self.publication.ask()

    def _replica_path(self, partition: int) -> Path:
        return self.data_dir / "partitions" / str(partition)

    def _replicas_on_disk(self) -> set[int]:
        """Partition ids with a directory under ``partitions/`` (also ``<id>.incoming`` and
        ``<id>.retired``, a re-seed's leftovers)."""
        root = self.data_dir / "partitions"
        if not root.is_dir():
            return set()
        return {int(name) for path in root.iterdir() if (name := path.name.split(".")[0]).isdigit()}

    async def _delete_replica(self, pid: int, why: str) -> None:
        tombstone, label = self._tombstones.get(pid), self._labels.get(pid)
        if tombstone is not None and tombstone.receipt is not None and label is not None:
            kept = KeptReceipt(label, tombstone.receipt)
            # Before the copy goes; and before anything else, so that a receipt that cannot
            # be written (a full disk) leaves the copy as it was, to be tried again.
            await asyncio.to_thread(keep_receipt, self.data_dir, pid, kept)
            self._receipts[pid] = kept
        log.warning("node %s: deleting the replica of partition %d (%s)", self.node_id, pid, why)
        host = self.hosts.pop(pid, None)
        if host is not None:
            self.events.forget_partition(pid)
            await self.leadership.resign_key(host.partition)
            await host.destroy()
        await asyncio.to_thread(self._delete_directories, pid, why)
        self._labels.pop(pid, None)
        self._stray_ranks.pop(pid, None)
        self._unservable.pop(pid, None)
        self._marks.pop(pid, None)
        if self._remembered.pop(pid, None) is not None:
            await asyncio.to_thread(forget, self.data_dir, pid)
        if self._served_sets.forget(pid):
            await asyncio.to_thread(forget_served_set, self.data_dir, pid)
        # Done: the tombstone has served (a failure here leaves it; deleting again is a no-op).
        with contextlib.suppress(CoordinatorUnavailable):
            await self.coordinator.delete(self.layout.tombstone(pid, self.node_id))

    def _delete_directories(self, pid: int, why: str) -> None:
        root = self.data_dir / "partitions"
        if not root.is_dir():
            return
        for path in root.iterdir():
            if path.name.split(".")[0] == str(pid):
                log.info("node %s: deleting %s (%s)", self.node_id, path, why)
                shutil.rmtree(path, ignore_errors=True)

    def _publish_soon(self) -> None:
        self.publication.ask()

    async def _publish(self, session: Session) -> None:
        now = time.monotonic()
        if not self.publication.due(now, self.identity.incarnation):
            return  # the next tick publishes what changed meanwhile
        replicas: dict[int, ReplicaPosition] = {}
        for pid, host in self.hosts.items():
            claim = self._leaders.get(pid)
            position = await host.position(claim[1] if claim is not None else 0)
            replicas[pid] = remade(self._receipts.get(pid), self._labels.get(pid), position)
        storage = await self.storage.current(h.store for h in list(self.hosts.values()))
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
            held = await self.coordinator.register(session, key, record.pack())
            self.publication.written(record, now)
            # What etcd held before this write is evidence too: a node that writes its record
            # (a position or its storage changed) before its watch shows the restored one
            # buries it under a newer mod revision (a CI run of session 42, load average 7:
            # no node of test_etcd_loss.py's late restore noticed it).
            if self.identity.timeline.check_write(before, held, self.identity.incarnation):
                log.warning(
                    "node %s: etcd held %s at revision %s, older than this node saw it in"
                    " incarnation %d: etcd went back in time (restored from a snapshot?)",
                    self.node_id,
                    key,
                    held,
                    self.identity.incarnation,
                )

    # Serving -----------------------------------------------------------------------------------

    def _notify(self, partition: int, tenant: str, queue: str) -> None:
        for stream in list(self._clients):
            if self.demands.hold_notify(stream, partition, tenant, queue):
                continue  # a delivery to this gateway wakes it (node_demands.py)
            try:
                stream.connection.notify(partition, tenant, queue)
                stream.flush_soon()
            except ConnectionClosedError:
                self._clients.discard(stream)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        stream = NodeStream(Connection(self.node_id), reader, writer)
        try:
            await self._route(stream)
        except asyncio.CancelledError:
            # The node is stopping, or the replica the stream served went: end the connection
            # quietly (asyncio logs a connection callback that ends cancelled as an error),
            # even if cancelled again while closing (seen in a random-fault run, session 31:
            # a follower stream of a replica deleted by its tombstone).
            with contextlib.suppress(asyncio.CancelledError):
                await stream.close()

    async def _route(self, stream: NodeStream) -> None:
        events = stream.events()
        try:
            async with asyncio.timeout(10):
                first = await anext(events)
        except (TimeoutError, StopAsyncIteration):
            await stream.close()
            return
        if not isinstance(first, Hello):
            await stream.close()
            return
        if first.partition is not None:
            host = self.hosts.get(first.partition)
            if host is None or host.follower is None:
                await stream.close()  # not (yet) a replica here: the leader dials again
                return
            await host.follower.serve_stream(stream, events)
            return
        await self._serve_client(stream, events)

    async def _serve_client(self, stream: NodeStream, events: AsyncIterator[Event]) -> None:
        self._clients.add(stream)
        running: set[asyncio.Task[None]] = set()
        try:
            async for event in events:
                if isinstance(event, Request):
                    if event.op == "receive":
                        self.events.received(
                            stream, event.partition, event.args.get("tenant"), event.args.get("queue")
                        )
                    elif event.op == "send":
                        self.events.sent(
                            stream, event.partition, event.args.get("tenant"), event.args.get("queue")
                        )
                    elif event.op == "delete_queue":
                        self.events.forget_queue(
                            event.partition, event.args.get("tenant"), event.args.get("name")
                        )
                    task = asyncio.create_task(self._answer(stream, event))
                    running.add(task)
                    task.add_done_callback(running.discard)
                elif isinstance(event, Demand | Withdraw):
                    if isinstance(event, Demand):
                        self.events.received(stream, event.partition, event.tenant, event.queue)
                    self.demands.handle(stream, event)
                elif isinstance(event, Closed):
                    break
        finally:
            self._clients.discard(stream)
            self.demands.forget(stream)
            self.events.forget(stream)
            for task in list(running):
                task.cancel()
            await stream.close()

    async def _answer(self, stream: NodeStream, request: Request) -> None:
        conn = stream.connection
        try:
            result = await self._dispatch(request)
        except PushgateError as exc:
            epoch, leader = self._leader_hint(request.partition)
            if isinstance(exc, ops.NotLeader | ops.StaleLeader):
                epoch = Epoch(max(epoch, exc.epoch))
            if isinstance(exc, ops.StaleLeader):
                leader = self.address  # we lead, at a newer epoch than the sender knows
            with contextlib.suppress(ConnectionClosedError, ValueError):
                conn.error(request.id, exc.code, exc.detail, epoch=epoch, leader=leader)
                stream.flush_soon()
            return
        except Exception as exc:  # a bug: answer it, do not kill the connection
            log.exception("node %s: %s on partition %d failed", self.node_id, request.op, request.partition)
            with contextlib.suppress(ConnectionClosedError, ValueError):
                conn.error(request.id, "internal_error", type(exc).__name__)
                stream.flush_soon()
            return
        with contextlib.suppress(ConnectionClosedError, ValueError):
            conn.reply(request.id, result)
            stream.flush_soon()

    async def _dispatch(self, request: Request) -> Any:
        refusal = self.identity.verdict.refusal
        if refusal is not None:
            raise Unavailable(f"node {self.node_id} serves nothing: {refusal}")
        host = self.hosts.get(request.partition)
        session = self.session
        if host is None or session is None or not session.valid():
            raise ops.NotLeader(f"node {self.node_id} does not lead partition {request.partition}")
        result = await host.handle(request.op, request.epoch, request.args, timeout_s=self.request_timeout_s)
        # A reply is a promise: only while our claim is surely alive (a frozen leader that
        # woke up past its lease must not acknowledge; a successor may already exist).
        if self.session is not session or not session.valid():
            if ops.OPS[request.op].writes:
                # Applied here (and perhaps on a majority): the outcome is unknown, which
                # not_leader would deny.
                raise Unavailable(
                    f"node {self.node_id} lost its etcd session; the write may have been applied"
                )
            raise ops.NotLeader(f"node {self.node_id} lost its etcd session")
        return result

    def _leader_hint(self, partition: int) -> tuple[Epoch, str | None]:
        claim = self._leaders.get(partition)
        if claim is None:
            return Epoch(0), None
        return claim[1], claim[0].address


async def run_node(
    node_id: str,
    data_dir: Path,
    listen: str,
    etcd: str,
    *,
    advertise: str | None = None,
    ttl_s: float = 2.0,
    prefix: str | None = None,
    quorum_window_s: float | None = None,
    keyring: Keyring | None = None,
    tls: NodeTls | None = None,
    tls_files: TlsFiles | None = None,
    etcd_tls: EtcdTls | None = None,
    disk_reserve_bytes: int | None = None,
) -> None:
    """``pushgate node``: run until cancelled (SIGINT/SIGTERM). ``tls_files``: where ``tls``
    came from, looked at for renewals every 10 s and on SIGHUP (backend_store/tls_reload.py)."""
    from ..coordination.etcd_coordinator import EtcdCoordinator
    from ..protocol.address import split_address

    for line in warning_lines(data_dir):
        log.warning("%s", line)
    host, port = split_address(listen)
    coordinator = await EtcdCoordinator(etcd, tls=etcd_tls).connect()
    node = Node(
        node_id,
        data_dir,
        coordinator,
        host=host,
        port=port,
        advertise=advertise,
        ttl_s=ttl_s,
        quorum_window_s=quorum_window_s,
        keyring=keyring,
        layout=Layout(prefix) if prefix else None,
        tls=tls,
        disk_reserve_bytes=disk_reserve_bytes,
    )
    await node.start()
    secured = " (mutual TLS)" if tls is not None else ""
    print(f"pushgate node {node_id} listening on {node.address}{secured}", flush=True)
    reload: asyncio.Task[None] | None = None
    if tls is not None and tls_files is not None:
        reloader = TlsReloader(
            (tls_files.cert, tls_files.key, tls_files.ca), node_tls_loader(tls), RELOAD_EVERY_S
        )
        reload = asyncio.create_task(reloader.run())
        # Not restarting for a renewal keeps this node's partitions' leaders where they are.
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, reloader.check)
    try:
        await asyncio.Event().wait()
    finally:
        if reload is not None:
            reload.cancel()
        await node.stop()
        await coordinator.close()


async def revoke_lost(session: Session) -> None:
    """Revoke a lost session's lease if etcd still holds it (best effort: etcd may be out of
    reach, and the lease then expires on its own)."""
    with contextlib.suppress(CoordinatorUnavailable):
        await session.close()
