"""The backend node process (``pushgate node``).

One TCP port serves both gateways (Backend operations for the partitions this node leads,
wake-ups) and the replication links of other nodes' leaders (routed by the partition in their
hello). The node keeps one LMDB environment per partition replica under
``DIR/partitions/<id>/`` (:class:`~.partition_host.PartitionHost`).

Coordination, all through etcd (see :mod:`.layout`):

- It registers ``nodes/{id}`` under its session's lease and republishes its replicas'
  positions (role, fence, last LSN, last entry's epoch) when they change, at most every
  ``publish_every_s``.
- It watches the partition map, the leader keys, the other nodes and queue attributes, and
  reconciles on every change (and every ``tick_s``): opens the environments of partitions
  listing it and deletes those of partitions that left it; campaigns for ``leaders/{id}``
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
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from ..encryption import Keyring
from ..errors import PushgateError, StaleEpoch, Unavailable
from ..options import StoreOptions
from ..types import Epoch
from . import ops
from .clock_file import ClockFile
from .connection import Closed, Connection, ConnectionClosedError, Event
from .coordinator import Coordinator, CoordinatorUnavailable, PrefixState, Session
from .etcd_tls import EtcdTls
from .layout import (
    Layout,
    LeaderRecord,
    NodeRecord,
    PartitionRecord,
    ReplicaPosition,
    parse_ids,
    unpack,
)
from .node_demands import NodeDemands
from .node_events import NodeEvents
from .node_storage import StorageGauge
from .partition_host import PartitionHost
from .stream import NodeStream
from .tls import NodeTls, serve_node_protocol
from .wire import Demand, Hello, Request, Withdraw

log = logging.getLogger("pushgate.cluster")


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
        keyring: Keyring | None = None,
        layout: Layout | None = None,
        tls: NodeTls | None = None,
        clock: ClockFile | None = None,
    ) -> None:
        """``quorum_window_s``: check-quorum's window (default two lease TTLs; 0: off).
        ``keyring``: bodies are sealed at rest in every partition store (the same keys on
        every node: a follower promoted must open what its leader sealed).
        ``tls``: the port serves mutual TLS only, and leader links dial with it (tls.py).
        ``clock``: tests only (clock_file.py): the stores' time comes from a file a test
        moves, and leaders sweep whenever it moves; None (production): ``time.time``."""
        self.clock = clock
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
        self.publish_every_s = publish_every_s
        self.request_timeout_s = request_timeout_s
        # Two TTLs: well past the 0.5 s heartbeats and a loaded machine's fsync stalls (a
        # healthy leader must not resign: each resignation costs a failover), and longer
        # than a lease, so a blip that etcd itself would ride out costs no change of leader.
        self.quorum_window_s = 2 * ttl_s if quorum_window_s is None else quorum_window_s
        # No sweeper in the stores: a follower's store changes only through the leader's log;
        # the leader sweeps (PartitionHost) and its deletions replicate like any write.
        self.options = StoreOptions(
            replication_log_keep=log_keep, sweep_interval_s=0, keyring=keyring, clock=clock
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
        self._changed = asyncio.Event()
        self._stopping = asyncio.Event()
        # What etcd says, from the watches (None: not read yet).
        self._partitions: dict[int, PartitionRecord] | None = None
        self._leaders: dict[int, tuple[LeaderRecord, Epoch]] = {}
        self._nodes: dict[str, NodeRecord] = {}
        self._queues: dict[tuple[str, str], dict[str, Any]] = {}
        self._published: NodeRecord | None = None
        self._published_at = 0.0
        self._campaign_epochs: dict[int, Epoch] = {}
        self._publish_now = False
        self._swept = False

    @property
    def address(self) -> str:
        return self.advertise or f"{self.host}:{self.port}"

    # Life cycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Listen, and start coordinating (returns at once; the node keeps working in tasks)."""
        server_tls = self.tls.server if self.tls is not None else None
        self._server = await serve_node_protocol(self._accept, self.host, self.port, server_tls)
        self.port = self._server.sockets[0].getsockname()[1]
        for prefix, handler in (
            (self.layout.partitions, self._on_partitions),
            (self.layout.leaders, self._on_leaders),
            (self.layout.nodes, self._on_nodes),
            (self.layout.queues, self._on_queues),
        ):
            self._tasks.append(asyncio.create_task(self._watch(prefix, handler), name=f"watch {prefix}"))
        self._tasks.append(asyncio.create_task(self._run(), name=f"node {self.node_id}"))
        if self.clock is not None:
            self._tasks.append(asyncio.create_task(self._follow_clock(self.clock), name="test clock"))

    async def stop(self) -> None:
        self._stopping.set()
        self._changed.set()
        if self._server is not None:
            self._server.close()
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks)
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

    async def _watch(self, prefix: str, handler: Any) -> None:
        while True:
            try:
                states: AsyncIterator[PrefixState] = self.coordinator.watch_prefix(prefix, reread_every_s=2.0)
                async for state in states:
                    handler(state)
                    self._changed.set()
            except (CoordinatorUnavailable, PushgateError) as exc:
                log.warning("watch on %s failed: %s", prefix, exc)
                await asyncio.sleep(0.5)
            except Exception:
                log.exception("watch on %s failed", prefix)
                await asyncio.sleep(0.5)

    def _on_partitions(self, state: PrefixState) -> None:
        out: dict[int, PartitionRecord] = {}
        for pid, value in parse_ids(state.values()).items():
            with contextlib.suppress(PushgateError):
                out[pid] = PartitionRecord.unpack(value)
        self._partitions = out

    def _on_leaders(self, state: PrefixState) -> None:
        out: dict[int, tuple[LeaderRecord, Epoch]] = {}
        for key, entry in state.entries.items():
            suffix = key[len(self.layout.leaders) :]
            if suffix.isdigit():
                with contextlib.suppress(PushgateError):
                    out[int(suffix)] = (LeaderRecord.unpack(entry.value), Epoch(entry.create_revision))
        # A hosted partition's leader changed or vanished: publish our positions at once, so
        # the manager promotes on positions taken after the old leader's key was gone.
        before = self._leaders
        if any(before.get(p, (None, 0))[1] != out.get(p, (None, 0))[1] for p in self.hosts):
            self._publish_now = True
        self._leaders = out

    def _on_nodes(self, state: PrefixState) -> None:
        out: dict[str, NodeRecord] = {}
        for node_id, value in state.values().items():
            with contextlib.suppress(PushgateError):
                out[node_id] = NodeRecord.unpack(value)
        self._nodes = out

    def _on_queues(self, state: PrefixState) -> None:
        out: dict[tuple[str, str], dict[str, Any]] = {}
        for key, value in state.values().items():
            tenant, _, queue = key.partition("/")
            with contextlib.suppress(PushgateError):
                attributes = unpack(value)
                if isinstance(attributes, dict):
                    out[(tenant, queue)] = attributes
        self._queues = out

    async def _follow_clock(self, clock: ClockFile) -> None:
        """Tests only: when the test moves the clock, leaders sweep at once (retention and
        dedupe expiry), as an embedded store's frequent sweeper would under a ManualClock."""
        async for _ in clock.moves(since=clock.held()):
            for host in self.hosts.values():
                host.sweep_soon()

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
            self._published = None

    async def _open_session(self) -> None:
        session = await self.coordinator.open_session(self.ttl_s)
        self.session = session
        self._campaign_epochs.clear()
        await self._publish(session, force=True)
        log.info("node %s: registered at %s (lease %x)", self.node_id, self.address, session.lease_id)

    async def _step_down_all(self, why: str) -> None:
        for host in self.hosts.values():
            if host.leader is not None:
                await host.step_down(why)

    async def _reconcile(self, session: Session) -> None:
        partitions = self._partitions
        if partitions is None:
            return  # the map was not read yet: change nothing
        mine = {pid: rec for pid, rec in partitions.items() if self.node_id in rec.replicas}
        if not self._swept:
            # Environments left from partitions that left this node while it was down.
            self._swept = True
            await asyncio.to_thread(self._sweep_orphans, set(mine))
        for pid in [p for p in self.hosts if p not in mine]:
            host = self.hosts.pop(pid)
            self.events.forget_partition(pid)
            log.info("node %s: partition %d left this node; deleting its replica", self.node_id, pid)
            await self._resign(host)
            await host.destroy()
        addresses = {n: rec.address for n, rec in self._nodes.items()}
        for pid, record in mine.items():
            found = self.hosts.get(pid)
            if found is None:
                host = PartitionHost(
                    pid,
                    self.data_dir / "partitions" / str(pid),
                    self.node_id,
                    self.options,
                    self._notify,
                    sweep_every_s=self.sweep_every_s,
                    tls=self.tls.client if self.tls is not None else None,
                )
                await host.open()
                self.hosts[pid] = host
            else:
                host = found
            await self._reconcile_partition(session, host, record, addresses)
        await self._publish(session, force=self._publish_now)

    def _sweep_orphans(self, keep: set[int]) -> None:
        root = self.data_dir / "partitions"
        if not root.is_dir():
            return
        for path in root.iterdir():
            pid = path.name.split(".")[0]  # also <id>.incoming / <id>.retired re-seeding leftovers
            if pid.isdigit() and int(pid) not in keep and int(pid) not in self.hosts:
                log.info("node %s: deleting %s (no longer a replica here)", self.node_id, path)
                shutil.rmtree(path, ignore_errors=True)

    async def _reconcile_partition(
        self, session: Session, host: PartitionHost, record: PartitionRecord, addresses: dict[str, str]
    ) -> None:
        designated = record.leader == self.node_id
        if host.leader is not None:
            leader = host.leader
            claim = self._leaders.get(host.partition)
            lost_claim = claim is not None and claim[1] > leader.epoch
            deposed = leader.deposed.is_set() or lost_claim or host.store.epoch > leader.epoch
            successor = record.leader if record.leader in record.replicas else None
            if not deposed and host.lacks_quorum(time.monotonic(), self._nodes):
                # Before a hand-over too: a successor we cannot reach never catches up.
                await self._resign_for_quorum(host)
                return
            if not designated and not deposed and successor is not None:
                host.update_links(record, addresses)
                if not host.hand_over(successor):
                    return  # the next tick looks again
                await self._resign(host)
                await host.step_down(f"handed over to {successor}")
            elif not designated or deposed:
                why = "no longer designated" if not designated else "a newer term exists"
                await self._resign(host)
                await host.step_down(why)
            else:
                host.keep_leading()
                host.update_links(record, addresses)
                await host.apply_queue_attributes(self._queues)
                return
        if host.resigned is not None and not await self._hold_off(host, designated):
            host.record = record
            return
        if not designated or not session.valid():
            host.record = record
            return
        claim_value = LeaderRecord(self.node_id, self.address).pack()
        result = await self.coordinator.campaign(session, self.layout.leader(host.partition), claim_value)
        if not result.won:
            return  # someone else holds the key; it vanishes with their lease
        if not session.valid():
            return
        try:
            await host.lead(
                result.epoch, record, addresses, self._queues, quorum_window_s=self.quorum_window_s
            )
        except StaleEpoch as exc:
            # This replica has seen a newer term than the key's: give the key back.
            log.warning("partition %d: cannot lead at epoch %d: %s", host.partition, result.epoch, exc)
            await self.coordinator.resign(self.layout.leader(host.partition), result.epoch)
            await host.step_down("stale")
            return
        self._campaign_epochs[host.partition] = result.epoch

    async def _resign_for_quorum(self, host: PartitionHost) -> None:
        resignation = await host.resign_for_quorum(time.monotonic())
        log.warning(
            "partition %d: resigned leadership of epoch %d for lack of a quorum; vouching for LSN %d"
            " (epoch %d); not campaigning for %gs",
            host.partition,
            resignation.epoch,
            resignation.lsn,
            resignation.last_epoch,
            self.quorum_window_s,
        )
        await self._resign(host)
        self._publish_now = True

    async def _hold_off(self, host: PartitionHost, designated: bool) -> bool:
        """After a resignation for lack of a quorum: whether this replica may campaign (False:
        not yet). The resignation ends when a newer leader exists; until then, for one
        window, the manager may promote another replica (a majority's fresh positions); if it
        did not (it judged this one the most up to date, or no majority published), this
        one campaigns again."""
        resigned = host.resigned
        assert resigned is not None
        claim = self._leaders.get(host.partition)
        if claim is not None and claim[1] > resigned.epoch:
            host.resigned = None  # a newer term: an ordinary follower again
            self._publish_now = True
            return True
        if claim is not None and claim[1] == resigned.epoch and claim[0].node == self.node_id:
            # Our key is still there (deleting it failed, or the watch has not said yet).
            with contextlib.suppress(CoordinatorUnavailable):
                await self.coordinator.resign(self.layout.leader(host.partition), Epoch(resigned.epoch))
            return False
        return not designated or time.monotonic() - resigned.at >= self.quorum_window_s

    async def _resign(self, host: PartitionHost) -> None:
        epoch = self._campaign_epochs.pop(host.partition, None)
        if epoch is not None:
            with contextlib.suppress(CoordinatorUnavailable):
                await self.coordinator.resign(self.layout.leader(host.partition), epoch)

    async def _publish(self, session: Session, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._published_at < self.publish_every_s:
            return  # the next tick publishes what changed meanwhile
        self._publish_now = False
        replicas: dict[int, ReplicaPosition] = {}
        for pid, host in self.hosts.items():
            claim = self._leaders.get(pid)
            replicas[pid] = await host.position(claim[1] if claim is not None else 0)
        storage = await self.storage.current(h.store for h in list(self.hosts.values()))
        record = NodeRecord(self.address, "up", replicas, storage)
        if record == self._published and not force:
            return
        await self.coordinator.register(session, self.layout.node(self.node_id), record.pack())
        self._published, self._published_at = record, now

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
            # The node is stopping: end the connection quietly (asyncio would log a
            # connection callback that ends cancelled as an error).
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
    clock: ClockFile | None = None,
    etcd_tls: EtcdTls | None = None,
) -> None:
    """``pushgate node``: run until cancelled (SIGINT/SIGTERM). ``clock``: tests only."""
    from .client import split_address
    from .etcd_coordinator import EtcdCoordinator

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
        clock=clock,
    )
    await node.start()
    secured = " (mutual TLS)" if tls is not None else ""
    print(f"pushgate node {node_id} listening on {node.address}{secured}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await node.stop()
        await coordinator.close()
