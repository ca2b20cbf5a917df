"""A copy of ``node/node.py``'s loop on the simulated network, etcd and disk: what the
simulation ran before it ran the production :class:`Node` (:mod:`.sim_node`), kept only
as the default (``Config.production_node`` False) until the seeds the ablation tests pin
are found again on the production node (issue 49; docs/testing.md, "Simulation"). A fix
made to the node is not made here: the production node is what the new seeds test.

The same tasks as the production node, in the same order: four watches (partitions,
leaders, nodes, queues) through the coordinator; a main loop that opens an etcd session,
registers, then reconciles on every change and every ``tick_s`` until the session is lost
(then steps down everywhere and starts over); publishing the replicas' positions; serving
gateways' requests and the replication links of other nodes' leaders on one listener.

Every decision is production code (reconcile.py, leadership.py, node_identity.py); this module does the
I/O each decision asks for. Time is the node's own clock (``proc.clock``), which clock-skew
faults make run fast or slow.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

from backend_store.cluster.coordination.coordinator import CoordinatorUnavailable, PrefixState
from backend_store.cluster.coordination.identity import (
    IdentityVerdict,
    refusing_nodes,
)
from backend_store.cluster.coordination.layout import (
    Layout,
    LeaderRecord,
    NodeRecord,
    ReplicaPosition,
    Tombstone,
    parse_ids,
    read_partition_map,
)
from backend_store.cluster.coordination.timeline import KeysSeen, RecordMark
from backend_store.cluster.coordination.watched_prefix import changed_keys
from backend_store.cluster.node.etcd_records import (
    leaders_moved,
    read_leaders,
    read_nodes,
    read_tombstones,
    tombstone_stands,
)
from backend_store.cluster.node.leadership import NodeLeadership
from backend_store.cluster.node.node_identity import NodeIdentity
from backend_store.cluster.node.pool_queues import QueueRecords, note_changes
from backend_store.cluster.node.publication import Publication, node_record
from backend_store.cluster.node.receipts import KeptReceipt, remade
from backend_store.cluster.node.reconcile import Decision, HostedReplica, MapView, ReplicaLabel, decide
from backend_store.cluster.node.remembered_records import worth_keeping
from backend_store.cluster.node.served_sets import ServedSets
from backend_store.cluster.protocol import ops
from backend_store.cluster.protocol.connection import Closed, Connection, ConnectionClosedError, Event
from backend_store.cluster.protocol.stream import NodeStream
from backend_store.cluster.protocol.wire import Hello, Request
from backend_store.errors import PushgateError, Unavailable
from backend_store.types import Epoch

from .copied_partition import CopiedPartitionHost
from .kernel import Process
from .network import Network
from .oracle import Oracle
from .sim_coordinator import SimCoordinator, SimSession
from .sim_store import NodeDisk

TTL_S = 2.0
TICK_S = 0.2
PUBLISH_EVERY_S = 0.5
REQUEST_TIMEOUT_S = 5.0
HANDOVER_TIMEOUT_S = 2.0  # node.py's default
# ``ReplicaRounds``: the timeline is settled before a replica opened in a round is served
# (issue 48); the ablation ``settle-before-serving`` puts it back after serving decisions.
SETTLE_BEFORE_SERVING = True


class KeptOnDisk:
    """``node_identity.ClusterIdFile`` on the model disk (``DATA/cluster-id``)."""

    def __init__(self, proc: Process, disk: NodeDisk) -> None:
        self.proc = proc
        self.disk = disk
        self.where = f"{disk.node}:DATA/cluster-id"

    async def read(self) -> str | None:
        return self.disk.cluster_id

    async def keep(self, cluster_id: str) -> None:
        await self.proc.awake()
        self.disk.cluster_id = cluster_id


class CopiedNode:
    def __init__(
        self,
        proc: Process,
        node_id: str,
        disk: NodeDisk,
        network: Network,
        coordinator: SimCoordinator,
        oracle: Oracle,
        *,
        layout: Layout,
        store_clock: Callable[[], float],
        window_entries: int,
    ) -> None:
        self.proc = proc
        self.node_id = node_id
        self.disk = disk
        self.served_sets = ServedSets(disk.served_sets)  # DATA/sets/, kept on the disk
        self.network = network
        self.coordinator = coordinator
        self.oracle = oracle
        self.layout = layout
        self.store_clock = store_clock
        # node/node_identity.py's, the cluster id kept on the model disk; a cluster it founds
        # gets an id from the node's name and the virtual time (production: a uuid4).
        self.identity = NodeIdentity(
            node_id,
            KeptOnDisk(proc, disk),
            coordinator,
            layout,
            new_cluster_id=lambda: f"c-{node_id}-{asyncio.get_running_loop().time():.6f}",
            wall_clock=proc.clock,
        )
        self.identity.watch.add_listener(self._cluster_changed)
        self.address = f"{node_id}:7000"
        self.quorum_window_s = TTL_S  # node.py's default: one lease TTL
        self.handover_timeout_s = HANDOVER_TIMEOUT_S
        self.window_entries = window_entries  # its leaders' shipping window
        self.hosts: dict[int, CopiedPartitionHost] = {}
        self.session: SimSession | None = None
        self._changed = asyncio.Event()
        self._partitions: MapView | None = None
        self._tombstones: dict[int, Tombstone] = {}
        self._keys_seen = KeysSeen()  # Node._keys_seen: leader keys and this node's record
        self._on_disk: set[int] | None = None  # replicas found on disk at start (first decision)
        self._stray_ranks: dict[int, tuple[int, int]] = {}  # Node._stray_ranks
        self.strays: dict[int, str] = {}
        self._leaders: dict[int, tuple[LeaderRecord, Epoch]] = {}
        self._nodes: dict[str, NodeRecord] = {}
        self._nodes_read = False
        self._lost_sessions: list[SimSession] = []
        # ``Node._queues``: kept by the keys each state changed (``WatchedPrefix`` names them).
        self._queues = QueueRecords()
        self._queue_state = PrefixState(layout.queues, 0)
        self.publication = Publication(PUBLISH_EVERY_S)
        # node/leadership.py's shell, on this node's clock, etcd and replicas.
        self.leadership = NodeLeadership(
            coordinator,
            layout,
            node_id,
            lambda: self.address,
            quorum_window_s=self.quorum_window_s,
            handover_timeout_s=self.handover_timeout_s,
            publish_soon=self._publish_soon,
            identity=self.identity,
            clock=proc.clock,
        )

    def note(self, text: str) -> None:
        self.network.trace.add(asyncio.get_running_loop().time(), self.node_id, text)

    # Life cycle ----------------------------------------------------------------------------

    def start(self) -> None:
        self.network.listen(self.proc, "node", self._accept)
        for prefix, handler in (
            (self.layout.partitions, self._on_partitions),
            (self.layout.leaders, self._on_leaders),
            (self.layout.nodes, self._on_nodes),
            (self.layout.queues, self._on_queues),
            (self.layout.tombstones, self._on_tombstones),
        ):
            self.proc.spawn(self._watch(prefix, handler), f"watch {prefix}")
        self.proc.spawn(self._begin_cluster_watch(), "watch cluster")
        self.proc.spawn(self._run(), "main loop")

    async def _watch(self, prefix: str, handler: Callable[[PrefixState], None]) -> None:
        while True:
            try:
                states: AsyncIterator[PrefixState] = self.coordinator.watch_prefix(prefix, reread_every_s=2.0)
                async for state in states:
                    await self.proc.awake()
                    handler(state)
                    self.identity.observe(state)
                    self._changed.set()
            except (CoordinatorUnavailable, PushgateError):
                await self.proc.sleep(0.5)

    def _on_partitions(self, state: PrefixState) -> None:
        before = self._partitions.records if self._partitions is not None else {}
        read = read_partition_map(state.values(), before)
        self._partitions = MapView(read.records, read.unknown, read.values, parse_ids(state.mod_revisions()))

    def _on_tombstones(self, state: PrefixState) -> None:
        self._tombstones = read_tombstones(self.layout, self.node_id, state)

    async def _begin_cluster_watch(self) -> None:
        self.identity.watch.begin()  # from the node's task: its tasks are the node's

    def _cluster_changed(self, state: PrefixState, _keys: set[str]) -> None:
        self.identity.observe(state)
        self._changed.set()

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
        """``Node._check_keys``."""
        incarnation, timeline = self.identity.incarnation, self.identity.timeline
        was_suspect = timeline.suspect
        rewound = timeline.check_keys(self._keys_seen, mod_revisions, incarnation)
        if rewound and not was_suspect:
            self.note(f"etcd holds {rewound} older than seen in incarnation {incarnation}: it went back")

    def _on_queues(self, state: PrefixState) -> None:
        keys = changed_keys(self._queue_state, state)
        self._queue_state = state
        note_changes(self._queues, state, keys, self.hosts)

    # The main loop ------------------------------------------------------------------------------

    async def _run(self) -> None:
        proc = self.proc
        while True:
            try:
                await self._open_session()
            except CoordinatorUnavailable:
                await proc.sleep(0.5)
                continue
            session = self.session
            assert session is not None
            while session.valid():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(proc.local_to_real(TICK_S)):
                        await self._changed.wait()
                await proc.awake()
                self._changed.clear()
                if not session.valid():
                    break
                try:
                    await self._reconcile(session)
                except CoordinatorUnavailable:
                    pass
                except PushgateError as exc:  # a store error: log it, keep the node alive, retry
                    self.note(f"reconciling failed: {exc.code}: {exc.detail}")
                    await proc.sleep(TICK_S)
            await self._step_down_all("etcd session lost")
            self.session = None
            self._lost_sessions.append(session)

    async def _open_session(self) -> None:
        session = await self.coordinator.open_session(TTL_S)
        self.session = session
        for pid in self.disk.partitions.keys() - self.hosts.keys():  # ``Node._open_session``
            self.strays.setdefault(pid, "found on disk, not examined yet")
        await self.identity.judge(
            holds_replicas=bool(self.disk.partitions or self.hosts),
            etcd_has_map=False,
            refusing=self._others_refusing,
        )
        self.leadership.claims.clear()
        self.publication.ask()
        await self._publish(session)
        self.note(f"registered (lease {session.lease_id:x})")
        lost, self._lost_sessions = self._lost_sessions, []  # ``Node._open_session``
        for old in lost:
            self.proc.spawn(revoke_lost(old), f"revoke lease {old.lease_id:x}")

    async def _others_refusing(self) -> list[str]:
        """``Node._others_refusing``."""
        nodes = self._nodes
        if not self._nodes_read:
            nodes = read_nodes(await self.coordinator.read_prefix(self.layout.nodes))
        return refusing_nodes(nodes, self.node_id)

    async def _step_down_all(self, why: str) -> None:
        for host in list(self.hosts.values()):
            if host.leader is not None:
                await host.step_down(why)

    async def _reconcile(self, session: SimSession) -> None:
        """``Node._reconcile``: judge etcd, decide (``node/reconcile.py``), act."""
        if self._on_disk is None and self._partitions is not None:
            # The first decision also sees the replicas left on disk from before this start.
            self._on_disk = set(self.disk.partitions)
        known = self._on_disk or set()
        verdict = await self.identity.judge(
            holds_replicas=bool(known or self.hosts),
            etcd_has_map=bool(self._partitions is not None and self._partitions.records),
            refusing=self._others_refusing,
        )
        decision = self._decide(verdict, {})
        opened: dict[int, CopiedPartitionHost] = {}
        try:
            if decision.refused is None:
                # New replicas are opened aside and their labels read before anything serves them.
                for pid in [p for p in decision.serve if p not in self.hosts]:
                    host = CopiedPartitionHost(self, pid)
                    await host.open()
                    opened[pid] = host
                if opened:
                    decision = self._decide(verdict, opened)
                if SETTLE_BEFORE_SERVING:
                    await self._settle_timeline(opened.values())
            for pid in [p for p in opened if p in decision.serve]:
                self.hosts[pid] = opened.pop(pid)
                known.add(pid)
        finally:
            for host in opened.values():  # not served, or the round failed
                await host.close()
        await self._keep_strays(decision.strays)
        self._rank_strays()
        deletions = {
            pid: why
            for pid, why in decision.delete.items()
            if await tombstone_stands(
                self.coordinator, self.layout, self.node_id, pid, self._tombstones.get(pid)
            )
        }
        refusal = await self.identity.refusal_now() if deletions else None
        if refusal is not None:
            self.note(f"deleting nothing now: {refusal}")
        else:
            for pid, why in deletions.items():
                await self._delete_replica(pid, why)
                known.discard(pid)
        self._on_disk = known
        if decision.refused is not None:
            await self._publish(session)
            return
        if not SETTLE_BEFORE_SERVING:
            await self._settle_timeline(())
        addresses = {n: rec.address for n, rec in self._nodes.items()}
        for pid, record in decision.serve.items():
            serving = self.hosts.get(pid)
            if serving is None:
                continue  # ``node.py``: named by a map that changed meanwhile, opened next round
            data = self.disk.partitions.get(pid)
            if data is not None and data.label is None and verdict.cluster_id is not None:
                data.label = ReplicaLabel(
                    verdict.cluster_id, pid, record.tenant, record.queue, record.index, record.queue_revision
                )
            if pid in decision.serve_values:
                revision = self._partitions.mod_revisions.get(pid) if self._partitions else None
                mark = (
                    RecordMark(self.identity.incarnation, revision) if revision is not None else None
                )  # Node._mark_now
                kept, kept_mark = self.disk.remembered.get(pid), self.disk.marks.get(pid)
                if worth_keeping(record, mark, kept, kept_mark) and not self.identity.timeline.suspect:
                    self.disk.remembered[pid] = record
                    if mark is not None:
                        self.disk.marks[pid] = mark
                last_epoch, last_lsn = serving.last_entry()
                served = self.served_sets.served(
                    pid, record.replicas, self.identity.incarnation, last_epoch, last_lsn
                )
                if served is not None:
                    self.served_sets.keep(pid, served)
            await self.leadership.reconcile(
                session,
                serving,
                record,
                addresses,
                self._leaders,
                self._nodes,
                self._queues,
                decision.serve_values.get(pid),
            )
        await self._publish(session)

    def _decide(self, verdict: IdentityVerdict, opened: dict[int, CopiedPartitionHost]) -> Decision:
        hosted = {
            pid: HostedReplica(
                pid, open=False, last_lsn=rank[1] if (rank := self._stray_ranks.get(pid)) else None
            )
            for pid in self._on_disk or ()
        }
        for pid, host in [*self.hosts.items(), *opened.items()]:
            data = self.disk.partitions.get(pid)
            hosted[pid] = HostedReplica(
                pid, True, data.label if data is not None else None, host.store.last_lsn
            )
        return decide(self.node_id, hosted, self._partitions, self._tombstones, verdict)

    def _rank_strays(self) -> None:
        """``Node._rank_strays``: the position of each stray never held open, from the disk."""
        for pid in [p for p in self.strays if p not in self._stray_ranks and p not in self.hosts]:
            data = self.disk.partitions.get(pid)
            if data is not None:
                self._stray_ranks[pid] = (data.entries[-1].epoch if data.entries else 0, data.last_lsn)
                self.publication.ask()

    async def _settle_timeline(self, opened: Iterable[CopiedPartitionHost]) -> None:
        """``ReplicaRounds._settle_timeline``: settle whether etcd went back in time, raising
        the incarnation if it did; before a replica opened now is served (issue 48)."""
        incarnation, timeline = self.identity.incarnation, self.identity.timeline
        for host in [*self.hosts.values(), *opened]:
            timeline.remember(host.store.epoch)
        if self._partitions is not None:  # ReplicaRounds._check_marks
            timeline.check_marks(self.disk.marks, self._partitions.mod_revisions, incarnation)
        await self.identity.settle_timeline()

    async def _keep_strays(self, strays: dict[int, str]) -> None:
        """Stop serving replicas that became strays (their data stays), and note each once."""
        for pid, why in strays.items():
            host = self.hosts.pop(pid, None)
            if host is not None:
                self._stray_ranks[pid] = host.last_entry()
                await self.leadership.resign_key(host.partition)
                await host.close()
            if self.strays.get(pid) != why:
                self.note(f"keeping p{pid} as a stray, not served: {why}")
                self.publication.ask()
        if strays.keys() != self.strays.keys():
            self.publication.ask()
        self.strays = dict(strays)

    async def _delete_replica(self, pid: int, why: str) -> None:
        host = self.hosts.pop(pid, None)
        self.note(f"deleting the replica of p{pid} ({why})")
        tombstone, found = self._tombstones.get(pid), self.disk.partitions.get(pid)
        if tombstone is not None and tombstone.receipt is not None and found is not None and found.label:
            self.disk.receipts[pid] = KeptReceipt(found.label, tombstone.receipt)  # before the copy goes
        if host is not None:
            await self.leadership.resign_key(host.partition)
            await host.destroy(why)
        else:
            self.disk.delete(pid, why)
        self._stray_ranks.pop(pid, None)
        self.disk.remembered.pop(pid, None)
        self.disk.marks.pop(pid, None)
        self.served_sets.forget(pid)
        with contextlib.suppress(CoordinatorUnavailable):
            await self.coordinator.delete(self.layout.tombstone(pid, self.node_id))

    def _publish_soon(self) -> None:
        self.publication.ask()

    async def _publish(self, session: SimSession) -> None:
        now = self.proc.clock()
        if not self.publication.due(now, self.identity.incarnation):
            return
        replicas: dict[int, ReplicaPosition] = {}
        for pid, host in list(self.hosts.items()):
            claim = self._leaders.get(pid)
            position = await host.position(claim[1] if claim is not None else 0)
            data = self.disk.partitions.get(pid)
            label = data.label if data is not None else None
            replicas[pid] = remade(self.disk.receipts.get(pid), label, position)
        record = node_record(
            self.address,
            replicas,
            None,
            refusal=self.identity.verdict.refusal,
            strays=self.strays,
            stray_ranks=self._stray_ranks,
            partitions=self._partitions,
            remembered=self.disk.remembered,
            receipts=self.disk.receipts,
            served_sets=self.served_sets,
            incarnation=self.identity.incarnation,
        )
        if self.publication.wanted(record):
            key = self.layout.node(self.node_id)
            before = self._keys_seen.marks.get(key)
            held = await self.coordinator.register(session, key, record.pack())
            self.publication.written(record, now)
            if self.identity.timeline.check_write(
                before, held, self.identity.incarnation
            ):  # ``Node._publish``
                self.note(
                    f"etcd held {key} at revision {held}, older than seen in incarnation {self.identity.incarnation}"
                )

    # Serving -------------------------------------------------------------------------------------

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: str) -> None:
        stream = NodeStream(Connection(self.node_id), reader, writer)
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
                await stream.close()
                return
            await host.follower.serve_stream(stream, events)
            return
        await self._serve_client(stream, events)

    async def _serve_client(self, stream: NodeStream, events: AsyncIterator[Event]) -> None:
        running: list[asyncio.Task[None]] = []  # a list, not a set: cancelled in a fixed order
        try:
            async for event in events:
                if isinstance(event, Request):
                    running = [t for t in running if not t.done()]
                    running.append(self.proc.spawn(self._answer(stream, event), "answer"))
                elif isinstance(event, Closed):
                    break
        finally:
            for task in running:
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
                leader = self.address
            with contextlib.suppress(ConnectionClosedError, ValueError):
                conn.error(request.id, exc.code, exc.detail, epoch=epoch, leader=leader)
                stream.flush_soon()
            return
        with contextlib.suppress(ConnectionClosedError, ValueError):
            conn.reply(request.id, result)
            stream.flush_soon()

    async def _dispatch(self, request: Request) -> Any:
        await self.proc.awake()
        host = self.hosts.get(request.partition)
        session = self.session
        if host is None or session is None or not session.valid():
            raise ops.NotLeader(f"node {self.node_id} does not lead partition {request.partition}")
        result = await host.handle(request.op, request.epoch, request.args, timeout_s=REQUEST_TIMEOUT_S)
        await self.proc.awake()
        if self.session is not session or not session.valid():
            if ops.OPS[request.op].writes:
                raise Unavailable(
                    f"node {self.node_id} lost its etcd session; the write may have been applied"
                )
            raise ops.NotLeader(f"node {self.node_id} lost its etcd session")
        if request.op == "send" and host.leader is not None:
            self.oracle.replied(self.node_id, request.partition, result, host.store.data, host.leader.epoch)
        return result

    def _leader_hint(self, partition: int) -> tuple[Epoch, str | None]:
        claim = self._leaders.get(partition)
        if claim is None:
            return Epoch(0), None
        return claim[1], claim[0].address


async def revoke_lost(session: SimSession) -> None:
    """``node.revoke_lost``."""
    with contextlib.suppress(CoordinatorUnavailable):
        await session.close()
