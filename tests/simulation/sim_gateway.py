"""A simulated gateway and its producers: sends with dedupe ids to FIFO groups, and the reads after healing.

Production code: the partition map is the gateway's own :class:`ClusterView` (three
:class:`WatchedPrefix` following the coordinator, :class:`PartitionMap`), requests go through
:class:`NodeClient` (its dialling replaced: :class:`SimNodeClient`), routing is
``routing.partition_index``. The loop around each request is ``PartitionCalls.call``'s
(``client/partition_calls.py``) on virtual time: the leader from the map; on ``not_leader``
/ ``stale_epoch`` re-read the map and wait up to 0.5 s for the leader to move; retry an
unknown outcome only for reads and deduplicated sends; give up at the deadline (10 s). The
circuit breaker per node is left out.

Each FIFO group has one producer that sends its messages one at a time, each with a dedupe
id, and repeats a message until it is acknowledged (as a client that must keep order does).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from backend_store.cluster.client.node_pool import NoAnswer, NodeClient
from backend_store.cluster.client.partition_map import ClusterView, PartitionInfo, PartitionMap
from backend_store.cluster.client.routing import partition_index
from backend_store.cluster.coordination.coordinator import CoordinatorUnavailable
from backend_store.cluster.coordination.layout import Layout
from backend_store.cluster.protocol.address import NodeUnreachable
from backend_store.cluster.protocol.connection import Connection
from backend_store.cluster.protocol.ops import NotLeader
from backend_store.cluster.protocol.stream import NodeStream
from backend_store.errors import PushgateError, QueueNotFound, StaleEpoch, Unavailable
from backend_store.types import NewMessage, PeekedMessage, QueueAttributes, QueueName, SendResult, TenantId

from .kernel import Process
from .network import Network
from .oracle import Oracle
from .sim_coordinator import SimCoordinator

TENANT = TenantId("t")
DEADLINE_S = 10.0
NODE_TIMEOUT_S = 5.0
RETRY_PAUSE_S = 0.05
# The producers' pace, all groups together (a group's pauses between sends follow).
SENDS_PER_S = 8.0


class SimNodeClient(NodeClient):
    """The production client to one node; only its dialling is the simulated network's."""

    def __init__(self, proc: Process, network: Network, client_id: str, node_id: str, address: str) -> None:
        super().__init__(client_id, node_id, address, timeout_s=NODE_TIMEOUT_S)
        self._proc = proc
        self._network = network

    async def _connect(self) -> NodeStream:
        """``NodeClient._connect`` with the simulated network's dial (no TLS)."""
        self._check_open()
        if (open_stream := self._open_stream()) is not None:
            return open_stream
        async with self._dialing:
            if (open_stream := self._open_stream()) is not None:
                return open_stream
            host = self.address.rpartition(":")[0]
            try:
                async with asyncio.timeout(self.connect_timeout_s):
                    reader, writer = await self._network.open_connection(self._proc, host, "node")
            except (OSError, TimeoutError) as exc:
                raise NodeUnreachable(f"cannot reach node {self.node_id} at {self.address}: {exc}") from None
            stream = NodeStream(Connection(self.client_id), reader, writer)
            self._stream = stream
            self._reader_task = asyncio.create_task(self._read(stream), name=f"node-client {self.node_id}")
            return stream


@dataclass(slots=True)
class QueueSpec:
    name: str
    partitions: int
    groups: list[str]

    def attributes(self) -> dict[str, Any]:
        return {"ordering": "fifo", "partitions": self.partitions, "replication_factor": 3}


@dataclass(slots=True)
class GroupProgress:
    queue: str
    group: str
    index: int  # the partition index its messages go to
    acked: int = 0  # the last seq acknowledged
    sending: int = 0  # the seq being sent (0: none)
    ack_times: list[float] = field(default_factory=list)
    # (first attempt, acknowledged at) of each acknowledged send: how long a send waited,
    # retries included (a group's think time between sends is not a wait).
    waits: list[tuple[float, float]] = field(default_factory=list)
    sending_since: float | None = None  # the first attempt of the send under way


class SimGateway:
    def __init__(
        self,
        proc: Process,
        network: Network,
        coordinator: SimCoordinator,
        oracle: Oracle,
        rng: random.Random,
        *,
        layout: Layout,
    ) -> None:
        self.proc = proc
        self.network = network
        self.coordinator = coordinator
        self.oracle = oracle
        self.rng = rng
        self.layout = layout
        self.view = ClusterView(coordinator, layout, reread_every_s=2.0)
        self.view.add_listener(self._map_changed)
        self._moved = asyncio.Event()
        # PartitionCalls' held requests: partition -> {task: the epoch asked}; a map showing
        # a newer leader gives them up (failover in the lease, not in the freeze).
        self._held: dict[int, dict[asyncio.Task[Any], int]] = {}
        self._given_up: set[asyncio.Task[Any]] = set()
        self._clients: dict[str, SimNodeClient] = {}
        self.groups: dict[tuple[str, str], GroupProgress] = {}
        self.sending = True
        self.think_s = 0.5
        self.stale_map_noted = False

    def note_stale_map(self, etcd_revision: int) -> None:
        """A fact for the diagnosis: the map the gateway holds is from a revision etcd has not
        reached (etcd went back in time); ``WatchedPrefix`` keeps it until etcd catches up."""
        held = max(w.state.revision for w in (self.view.nodes, self.view.partitions, self.view.leaders))
        if held > etcd_revision and not self.stale_map_noted:
            self.stale_map_noted = True
            self.oracle.fact(
                "gateway-map-ahead-of-etcd",
                f"the gateway holds the map at revision {held}, etcd is at {etcd_revision}:"
                " its watches drop every state older than what they hold",
            )
        elif held <= etcd_revision:
            self.stale_map_noted = False

    def _map_changed(self, current: PartitionMap) -> None:
        self._moved.set()
        # ``PartitionCalls._leader_replaced``.
        for pid, held in list(self._held.items()):
            part = current.partitions.get(pid)
            if part is None or part.leader is None:
                continue
            for task, epoch in list(held.items()):
                if part.leader.epoch > epoch:
                    del held[task]
                    self._given_up.add(task)
                    task.cancel()
            if not held:
                del self._held[pid]

    async def start(self) -> None:
        await self.view.start()

    async def _wait_map(self, condition: Callable[[PartitionMap], bool], timeout_s: float) -> None:
        """``ClusterView.wait_for`` on virtual time."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not condition(self.view.map):
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            self._moved.clear()
            try:
                async with asyncio.timeout(remaining):
                    await self._moved.wait()
            except TimeoutError:
                return

    def _client(self, node: str, address: str) -> SimNodeClient:
        client = self._clients.get(node)
        if client is None or client.address != address:
            client = self._clients[node] = SimNodeClient(
                self.proc, self.network, self.proc.name, node, address
            )
        return client

    # PartitionCalls.call ----------------------------------------------------------------------

    async def call(
        self, queue: str, index: int, op: str, *, retry_unknown: bool, **kwargs: Any
    ) -> tuple[int, Any]:
        """Run ``op`` on the leader of partition ``index`` of ``queue``; (partition id, result)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + DEADLINE_S
        last: PushgateError = Unavailable(f"no leader for partition {index} of {queue!r}")
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise last
            await self.proc.awake()
            current = self.view.map.partition(TENANT, QueueName(queue), index, None)
            if current is None or current.leader is None:
                if current is None:
                    await self._check_queue(queue)
                await self._wait_map(
                    functools.partial(_has_leader, queue=queue, index=index), min(remaining, 1.0)
                )
                continue
            leader = current.leader
            client = self._client(leader.node, leader.address)
            task = asyncio.current_task()
            assert task is not None
            held = self._held.setdefault(current.id, {})
            held[task] = leader.epoch
            try:
                try:
                    result = await client.call_with(
                        op,
                        current.id,
                        leader.epoch,
                        {"tenant": TENANT, "queue": queue, **kwargs},
                        timeout_s=min(remaining, NODE_TIMEOUT_S),
                    )
                finally:
                    held.pop(task, None)
                    if not held and self._held.get(current.id) is held:
                        del self._held[current.id]
            except asyncio.CancelledError:
                if task not in self._given_up:
                    raise
                self._given_up.discard(task)
                if task.uncancel():
                    raise
                last = NoAnswer(
                    f"partition {current.id}: its leader {leader.node} was replaced while it held the request"
                )
                if not retry_unknown:
                    raise last from None
                continue
            except (NotLeader, StaleEpoch):
                last = Unavailable(f"partition {current.id} is changing leader; retry")
                await self._refresh()
                await self._wait_map(functools.partial(_leader_moved, part=current), min(remaining, 0.5))
                continue
            except NodeUnreachable as exc:
                last = exc
                await self._wait_map(functools.partial(_leader_moved, part=current), min(remaining, 0.2))
                continue
            except NoAnswer as exc:
                if not retry_unknown:
                    raise
                last = exc
                await self._wait_map(functools.partial(_leader_moved, part=current), min(remaining, 0.2))
                continue
            except Unavailable as exc:
                if not retry_unknown:
                    raise
                last = exc
                await asyncio.sleep(min(RETRY_PAUSE_S, max(0.0, deadline - loop.time())))
                continue
            return current.id, result

    async def _refresh(self) -> None:
        with contextlib.suppress(CoordinatorUnavailable):
            await self.view.refresh()

    async def _check_queue(self, queue: str) -> None:
        try:
            found = await self.coordinator.get(self.layout.queue(TENANT, queue))
        except CoordinatorUnavailable:
            return
        if found is None:
            raise QueueNotFound(f"queue {queue!r} does not exist")

    # Producers --------------------------------------------------------------------------------------

    def start_producers(self, queues: list[QueueSpec]) -> None:
        # About SENDS_PER_S acknowledged sends a second in all, however many groups.
        self.think_s = sum(len(spec.groups) for spec in queues) / SENDS_PER_S
        for spec in queues:
            attributes = QueueAttributes(ordering="fifo", partitions=spec.partitions)
            for group in spec.groups:
                index = partition_index(NewMessage(b"", group_id=group), attributes, 0)
                progress = self.groups[(spec.name, group)] = GroupProgress(spec.name, group, index)
                self.proc.spawn(self._produce(progress), f"producer {group}")

    def body(self, group: str, seq: int) -> bytes:
        return f"{group}/{seq}".encode()

    async def send_one(self, progress: GroupProgress, seq: int) -> bool:
        """One attempt (a gateway request, up to its deadline) to send ``seq``; True: acknowledged."""
        group = progress.group
        message = NewMessage(self.body(group, seq), group_id=group, dedupe_id=f"{group}-{seq}")
        try:
            pid, results = await self.call(
                progress.queue, progress.index, "send", retry_unknown=True, messages=[message]
            )
        except PushgateError:
            return False
        result = results[0]
        if not isinstance(result, SendResult):
            return False
        self.oracle.acknowledged(pid, str(result.id), group, seq, message.body)
        progress.acked = seq
        now = asyncio.get_running_loop().time()
        progress.ack_times.append(now)
        progress.waits.append((progress.sending_since if progress.sending_since is not None else now, now))
        progress.sending_since = None
        return True

    async def _produce(self, progress: GroupProgress) -> None:
        seq = progress.acked + 1
        while True:
            if not self.sending:
                await asyncio.sleep(0.5)
                continue
            progress.sending = seq
            if progress.sending_since is None:
                progress.sending_since = asyncio.get_running_loop().time()
            if await self.send_one(progress, seq):
                seq += 1
                await asyncio.sleep(self.think_s * (0.5 + self.rng.random()))
            else:
                await asyncio.sleep(0.1 + self.rng.random() * 0.3)

    async def read_all(self, queue: str, index: int) -> list[PeekedMessage]:
        _, messages = await self.call(queue, index, "peek", retry_unknown=True, max_messages=1_000_000)
        assert isinstance(messages, list)
        return messages


def _has_leader(current: PartitionMap, queue: str, index: int) -> bool:
    found = current.partition(TENANT, QueueName(queue), index, None)
    return found is not None and found.leader is not None


def _leader_moved(current: PartitionMap, part: PartitionInfo) -> bool:
    found = current.partition(part.tenant, part.queue, part.index, part.queue_revision)
    return found is None or (found.leader is not None and found.leader != part.leader)
