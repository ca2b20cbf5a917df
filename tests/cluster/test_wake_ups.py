"""Wake-ups on ``cluster://``: a commit that makes messages of a queue visible sends ``Notify``
to the gateway connections that received from that queue on that partition, not to every
gateway connected to the node (backend_store/cluster/node/events.py, "Wake-ups go to the
queue's receivers"). Two scripted gateways (node pools) talk to real in-process nodes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from backend_store.cluster.client.cluster_backend import ClusterBackend, open_cluster_backend
from backend_store.cluster.client.node_pool import NodeClient, NodePool
from backend_store.cluster.client.partition_map import PartitionInfo
from backend_store.cluster.coordination.layout import Layout
from backend_store.cluster.node.node import Node
from backend_store.cluster.protocol.wire import Notify
from backend_store.options import StoreOptions
from backend_store.types import NewMessage, QueueName, TenantId
from tests.conftest import scaled
from tests.fixtures.dev_cluster import StoreTarget
from tests.gateway.conftest import start_gateway

from .placed import queue_partitions

T = TenantId("acme")
Q = QueueName("inbox")


class Gateway:
    """A node pool that records the ``Notify`` frames it gets."""

    def __init__(self, name: str, part: PartitionInfo) -> None:
        assert part.leader is not None
        self.part = part
        self.woken: asyncio.Queue[Notify] = asyncio.Queue()
        self.pool = NodePool(name, on_notify=lambda _node, notify: self.woken.put_nowait(notify))
        self.client: NodeClient = self.pool.client(part.leader.node, part.leader.address)

    async def call(self, op: str, **kwargs: Any) -> Any:
        assert self.part.leader is not None
        return await self.client.call(op, self.part.id, self.part.leader.epoch, tenant=T, queue=Q, **kwargs)

    async def send(self, body: bytes) -> None:
        """A send; its reply comes after any ``Notify`` of its commit on this connection."""
        await self.call("send", messages=[NewMessage(body)])

    def heard(self) -> list[Notify]:
        out = []
        while not self.woken.empty():
            out.append(self.woken.get_nowait())
        return out


@pytest.fixture
async def backend(
    inprocess_nodes: tuple[Layout, list[Node]], etcd_endpoints: list[str]
) -> AsyncIterator[ClusterBackend]:
    layout, _ = inprocess_nodes
    gateway = open_cluster_backend(f"cluster://{','.join(etcd_endpoints)}{layout.prefix}", StoreOptions())
    await gateway.start()
    try:
        yield gateway
    finally:
        await gateway.close()


async def _led_partition(backend: ClusterBackend) -> PartitionInfo:
    await backend.create_queue(T, Q, {"replication_factor": 2})
    await backend.send(T, Q, [NewMessage(b"warm")])  # served: its partition is led and applied
    got = await backend.receive(T, Q, 10)
    assert [m.body for m in got] == [b"warm"]
    await backend.ack(T, [m.receipt for m in got], Q)
    [part] = queue_partitions(backend, T, Q)
    return part


async def test_a_send_wakes_the_gateways_that_received_from_the_queue_and_no_other(
    backend: ClusterBackend,
) -> None:
    part = await _led_partition(backend)
    waiter, sender = Gateway("waiter", part), Gateway("sender", part)
    try:
        await sender.send(b"before anyone received")
        # A connection that only sends hears nothing: the reply follows any Notify of the
        # send's commit on the same connection, so none came.
        assert sender.heard() == []
        got = await waiter.call("receive", max_messages=10, visibility_timeout_s=60)
        assert isinstance(got, list) and got != []  # what was sent before is read, not announced
        assert waiter.heard() == []
        await sender.send(b"after the receive")
        async with asyncio.timeout(scaled(5)):
            assert await waiter.woken.get() == Notify(part.id, T, Q)
        assert sender.heard() == []
        # The sender receives too: now both hear the next commit.
        await sender.call("receive", max_messages=10, visibility_timeout_s=60)
        await sender.send(b"both wait")
        assert sender.heard() == [Notify(part.id, T, Q)]
        async with asyncio.timeout(scaled(5)):
            assert await waiter.woken.get() == Notify(part.id, T, Q)
    finally:
        await waiter.pool.close()
        await sender.pool.close()


async def test_a_closed_connection_or_a_deleted_queue_is_no_receiver_any_more(
    inprocess_nodes: tuple[Layout, list[Node]], backend: ClusterBackend
) -> None:
    _, nodes = inprocess_nodes
    part = await _led_partition(backend)
    [leader] = [n for n in nodes if part.leader is not None and n.node_id == part.leader.node]
    waiter = Gateway("waiter", part)
    await waiter.call("receive", max_messages=1)
    assert len(leader.events.receivers(part.id, T, Q)) == 2  # the backend's connection, and this one
    await waiter.pool.close()
    async with asyncio.timeout(scaled(5)):  # the node sees the close a moment later
        while True:
            if len(leader.events.receivers(part.id, T, Q)) == 1:
                break
            await asyncio.sleep(0.01)
    await backend.delete_queue(T, Q)
    assert leader.events.receivers(part.id, T, Q) == []


async def test_a_live_console_page_is_brought_forward_by_a_send_nobody_receives(
    inprocess_nodes: tuple[Layout, list[Node]], etcd_endpoints: list[str], tmp_path: Path
) -> None:
    """Nobody receives from the queue, so no node wakes the gateway for it; the partition
    map's change still pokes the sampler (a write moves the replicas' positions, which their
    nodes republish: gateway/cluster_operator.py), as docs/console.md promises. The timer is
    far past the test, so only a poke can bring the sample that shows the message."""
    layout, _ = inprocess_nodes
    url = f"cluster://{','.join(etcd_endpoints)}{layout.prefix}"
    gateway = await asyncio.to_thread(
        start_gateway, tmp_path / "gateway", target=StoreTarget(url), monitor_interval_s=600.0
    )
    try:
        headers = {"Authorization": f"Bearer {gateway.admin_key}"}
        async with httpx.AsyncClient(base_url=gateway.url, headers=headers, timeout=scaled(30)) as api:
            assert (await api.put(f"/v1/queues/{Q}", json={"replication_factor": 2})).status_code == 201
            async with httpx.AsyncClient(base_url=gateway.url, timeout=scaled(30)) as browser:
                login = await browser.post("/console/login", data={"token": gateway.admin_key})
                assert login.status_code == 303
                async with browser.stream("GET", f"/console/queues/{Q}/events") as stream:
                    lines = stream.aiter_lines()
                    await _next_sample(lines)  # the sample a new watcher brings forward
                    assert (await api.post(f"/v1/queues/{Q}/messages", json={"body": "x"})).status_code == 201
                    async with asyncio.timeout(scaled(5)):
                        await _next_sample(lines)
    finally:
        await asyncio.to_thread(gateway.stop)


async def _next_sample(lines: AsyncIterator[str]) -> str:
    """The data of the stream's next ``queue`` event."""
    event = ""
    async for line in lines:
        if line.startswith("event:"):
            event = line
        elif line.startswith("data:") and event == "event: queue":
            return line
    raise AssertionError("the live stream ended")


async def test_a_lost_connection_wakes_the_waiters_of_the_queues_its_node_leads(
    inprocess_nodes: tuple[Layout, list[Node]], backend: ClusterBackend
) -> None:
    """The node forgets a closed connection's receivers; the gateway wakes the queues of the
    partitions that node leads, so their waiters receive again over a new connection, which
    registers them anew (push_operations.py, ``_disconnected``)."""
    _, nodes = inprocess_nodes
    part = await _led_partition(backend)
    [leader] = [n for n in nodes if part.leader is not None and n.node_id == part.leader.node]
    woken: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
    backend.add_listener(lambda tenant, queue: woken.put_nowait((tenant, queue)))
    assert await backend.receive(T, Q, 10) == []
    # The node drops the gateway's connection (as a cut or a restart of its port would).
    for stream in list(leader._clients):
        await stream.close()
    async with asyncio.timeout(scaled(5)):
        while await woken.get() != (T, Q):
            pass
    assert await backend.receive(T, Q, 10) == []  # over a new connection: registered again
    sender = Gateway("sender", part)
    try:
        await sender.send(b"after the reconnect")
        async with asyncio.timeout(scaled(5)):
            while await woken.get() != (T, Q):
                pass
    finally:
        await sender.pool.close()
