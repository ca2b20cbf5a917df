"""A simulated gateway and its producers: sends with dedupe ids to FIFO groups, and the reads after healing.

Production code: the partition map is the gateway's own :class:`ClusterView` (watches
following the coordinator, :class:`PartitionMap`), each request runs the gateway's own loop,
``PartitionCalls.call`` (``client/partition_calls.py``: the leader from the map, its hints,
waits for a leader to move, the circuit breaker per node, requests given up at a leader the
map shows replaced, the deadline of 10 s), on virtual time, through :class:`NodeClient` (its
dialling replaced: :class:`SimNodeClient`); routing is ``routing.partition_index``.

Queues in pools of shared partitions are made, deleted and routed by :mod:`.sim_pools`.

Each FIFO group has one producer that sends its messages one at a time, each with a dedupe
id, and repeats a message until it is acknowledged (as a client that must keep order does).
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field
from typing import Any

from backend_store.cluster.client.metadata import ClusterMetadata
from backend_store.cluster.client.node_health import NodeHealth
from backend_store.cluster.client.node_pool import NodeClient
from backend_store.cluster.client.partition_calls import PartitionCalls
from backend_store.cluster.client.partition_map import ClusterView, PartitionInfo
from backend_store.cluster.client.routing import partition_index
from backend_store.cluster.coordination.layout import Layout
from backend_store.cluster.protocol.address import NodeUnreachable
from backend_store.cluster.protocol.connection import Connection
from backend_store.cluster.protocol.stream import NodeStream
from backend_store.errors import PushgateError
from backend_store.types import (
    Epoch,
    NewMessage,
    PeekedMessage,
    QueueAttributes,
    QueueName,
    SendResult,
)

from .kernel import Process
from .network import Network
from .oracle import Oracle
from .sim_coordinator import SimCoordinator
from .sim_pools import TENANT, SimPools

DEADLINE_S = 10.0
NODE_TIMEOUT_S = 5.0
# The producers' pace, all groups together (a group's pauses between sends follow).
SENDS_PER_S = 8.0


class SimNodeClient(NodeClient):
    """The production client to one node; only its dialling is the simulated network's. It
    notes, per task, the partition that last answered (``served``): the oracle records an
    acknowledged send under the partition that took it."""

    def __init__(
        self,
        proc: Process,
        network: Network,
        client_id: str,
        node_id: str,
        address: str,
        served: dict[asyncio.Task[Any], int],
    ) -> None:
        super().__init__(client_id, node_id, address, timeout_s=NODE_TIMEOUT_S)
        self._proc = proc
        self._network = network
        self._served = served

    async def call_with(
        self,
        op: str,
        partition: int,
        epoch: Epoch,
        arguments: dict[str, Any],
        *,
        timeout_s: float | None = None,
    ) -> Any:
        result = await super().call_with(op, partition, epoch, arguments, timeout_s=timeout_s)
        task = asyncio.current_task()
        assert task is not None
        self._served[task] = partition
        return result

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
        loop = asyncio.get_running_loop()
        self.view = ClusterView(coordinator, layout, reread_every_s=2.0, clock=loop.time)
        self.calls = PartitionCalls(
            self.view,
            ClusterMetadata(coordinator, layout),
            NodeHealth(clock=loop.time),
            deadline_s=DEADLINE_S,
            node_timeout_s=NODE_TIMEOUT_S,
            clock=loop.time,
        )
        self.calls.pool = self
        self._clients: dict[str, SimNodeClient] = {}
        # The partition that answered each task's last call (``SimNodeClient``).
        self._served: dict[asyncio.Task[Any], int] = {}
        self.groups: dict[tuple[str, str], GroupProgress] = {}
        self.sending = True
        self.think_s = 0.5
        self.stale_map_noted = False
        self.pools = SimPools(coordinator, layout, self)  # queues in pools (sim_pools.py)

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

    async def start(self) -> None:
        await self.view.start()

    def client(self, node_id: str, address: str) -> SimNodeClient:
        """``NodePool.client`` on the simulated network (``PartitionCalls.pool``)."""
        client = self._clients.get(node_id)
        if client is None or client.address != address:
            client = self._clients[node_id] = SimNodeClient(
                self.proc, self.network, self.proc.name, node_id, address, self._served
            )
        return client

    async def call(
        self, queue: str, index: int, op: str, *, retry_unknown: bool, **kwargs: Any
    ) -> tuple[int, Any]:
        """Run ``op`` on the leader of partition ``index`` of ``queue`` through the production
        ``PartitionCalls.call``; (the id of the partition that answered, its result)."""
        name = QueueName(queue)
        part = self.pools.route(queue, index)
        if part is None:
            part = self.view.map.partition(TENANT, name, index, None) or PartitionInfo(
                -1, TENANT, name, index, (), None, "sync"
            )
        task = asyncio.current_task()
        assert task is not None
        try:
            result = await self.calls.call(part, op, retry_unknown=retry_unknown, queue=queue, **kwargs)
            return self._served[task], result
        finally:
            self._served.pop(task, None)

    # Producers --------------------------------------------------------------------------------------

    def start_producers(self, queues: list[QueueSpec]) -> None:
        # About SENDS_PER_S acknowledged sends a second in all, however many groups (those
        # started before included: a queue made later adds its groups).
        self.think_s = (len(self.groups) + sum(len(spec.groups) for spec in queues)) / SENDS_PER_S
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
