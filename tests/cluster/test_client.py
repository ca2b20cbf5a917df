"""NodeClient and NodePool over real TCP on loopback against a scripted node: pipelined
requests answered out of order, error replies with the leader hint, wake-ups, a broken
connection failing what is pending and the next call dialling again, timeouts."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from backend_store.cluster.client.node_pool import NodeClient, NodePool
from backend_store.cluster.protocol import ops
from backend_store.cluster.protocol.connection import Connection
from backend_store.cluster.protocol.stream import NodeStream
from backend_store.cluster.protocol.wire import Delivery, Demand, Notify, Request, Withdraw
from backend_store.errors import QueueNotFound, Unavailable
from backend_store.types import Epoch, MessageId, NewMessage, QueueName, SendResult, TenantId
from tests.conftest import scaled

T = TenantId("t")
Q = QueueName("orders")


class ScriptedNode:
    """A TCP server speaking the node protocol; requests are queued for the test to answer."""

    def __init__(self) -> None:
        self.requests: asyncio.Queue[tuple[NodeStream, Request]] = asyncio.Queue()
        self.one_way: asyncio.Queue[Demand | Withdraw] = asyncio.Queue()
        self.streams: list[NodeStream] = []
        self.server: asyncio.Server | None = None
        self.address = ""
        self.connections = 0

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.address = f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        stream = NodeStream(Connection("node-a"), reader, writer)
        self.streams.append(stream)
        self.connections += 1
        async for event in stream.events():
            if isinstance(event, Request):
                await self.requests.put((stream, event))
            elif isinstance(event, Demand | Withdraw):
                await self.one_way.put(event)

    async def next_request(self) -> tuple[NodeStream, Request]:
        return await asyncio.wait_for(self.requests.get(), scaled(5))

    async def drop_connections(self) -> None:
        for stream in self.streams:
            await stream.close()
        self.streams.clear()

    async def stop(self) -> None:
        await self.drop_connections()
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


@pytest.fixture
async def node() -> AsyncIterator[ScriptedNode]:
    n = ScriptedNode()
    await n.start()
    yield n
    await n.stop()


@pytest.fixture
async def client(node: ScriptedNode) -> AsyncIterator[NodeClient]:
    c = NodeClient("gateway-1", "node-a", node.address, timeout_s=scaled(5))
    yield c
    await c.close()


async def test_pipelined_requests_are_matched_to_their_answers(
    node: ScriptedNode, client: NodeClient
) -> None:
    first = asyncio.create_task(
        client.call("send", 3, Epoch(7), tenant=T, queue=Q, messages=[NewMessage(b"a", dedupe_id="d")])
    )
    second = asyncio.create_task(client.call("get_queue", 3, Epoch(7), tenant=T, name=Q))
    (s1, r1), (s2, r2) = await node.next_request(), await node.next_request()
    assert (r1.op, r1.partition, r1.epoch) == ("send", 3, 7)
    assert ops.decode_args("send", r1.args)["messages"][0].dedupe_id == "d"
    # Answered out of order.
    s2.connection.error(r2.id, "queue_not_found", "no such queue")
    s2.flush()
    s1.connection.reply(r1.id, [["id-1", 1, False]])
    s1.flush()
    assert await first == [SendResult(MessageId("id-1"), 1, False)]
    with pytest.raises(QueueNotFound):
        await second


async def test_not_leader_carries_the_hint(node: ScriptedNode, client: NodeClient) -> None:
    call = asyncio.create_task(client.call("next_visible_at", 1, tenant=T, queue=Q))
    stream, request = await node.next_request()
    stream.connection.error(request.id, "not_leader", "led elsewhere", epoch=Epoch(12), leader="127.0.0.1:1")
    stream.flush()
    with pytest.raises(ops.NotLeader) as caught:
        await call
    assert (caught.value.epoch, caught.value.leader) == (12, "127.0.0.1:1")


async def test_wake_ups_reach_the_callback(node: ScriptedNode) -> None:
    woken: asyncio.Queue[tuple[str, Notify]] = asyncio.Queue()
    pool = NodePool("gateway-1", on_notify=lambda node_id, n: woken.put_nowait((node_id, n)))
    try:
        client = pool.client("node-a", node.address)
        call = asyncio.create_task(client.call("next_visible_at", 1, tenant=T, queue=Q))
        stream, request = await node.next_request()
        stream.connection.notify(1, "t", "orders")
        stream.connection.reply(request.id, None)
        stream.flush()
        assert await call is None
        assert await asyncio.wait_for(woken.get(), scaled(5)) == ("node-a", Notify(1, "t", "orders"))
    finally:
        await pool.close()


async def test_a_broken_connection_fails_pending_requests_and_the_next_call_redials(
    node: ScriptedNode, client: NodeClient
) -> None:
    pending = asyncio.create_task(client.call("get_queue", 0, tenant=T, name=Q))
    await node.next_request()
    await node.drop_connections()
    with pytest.raises(Unavailable):
        await pending
    call = asyncio.create_task(client.call("purge_queue", 0, tenant=T, name=Q))
    stream, request = await node.next_request()
    stream.connection.reply(request.id, 4)
    stream.flush()
    assert await call == 4 and node.connections == 2


async def test_no_answer_in_time_is_unavailable(node: ScriptedNode, client: NodeClient) -> None:
    with pytest.raises(Unavailable):
        await client.call("get_queue", 0, tenant=T, name=Q, timeout_s=0.1)
    # A late answer to the abandoned request is dropped; the connection stays usable.
    stream, request = await node.next_request()
    stream.connection.reply(request.id, None)
    stream.flush()
    call = asyncio.create_task(client.call("purge_queue", 0, tenant=T, name=Q))
    stream, request = await node.next_request()
    stream.connection.reply(request.id, 0)
    stream.flush()
    assert await call == 0 and node.connections == 1


async def test_an_unreachable_node_is_unavailable() -> None:
    with contextlib.closing(__import__("socket").socket()) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: connection refused
        client = NodeClient("gateway-1", "node-x", f"127.0.0.1:{port}", connect_timeout_s=scaled(2))
        with pytest.raises(Unavailable):
            await client.call("get_queue", 0, tenant=T, name=Q)
        await client.close()


async def test_a_pool_retargets_a_node_that_moved(node: ScriptedNode) -> None:
    other = ScriptedNode()
    await other.start()
    pool = NodePool("gateway-1")
    try:
        first = pool.client("node-a", node.address)
        assert pool.client("node-a", node.address) is first
        moved = pool.client("node-a", other.address)
        assert moved is not first and pool.get("node-a") is moved
        call: asyncio.Task[Any] = asyncio.create_task(moved.call("purge_queue", 0, tenant=T, name=Q))
        stream, request = await other.next_request()
        stream.connection.reply(request.id, 2)
        stream.flush()
        assert await call == 2
    finally:
        await pool.close()
        await other.stop()


async def test_demands_go_out_only_on_an_open_connection_and_deliveries_come_back(node: ScriptedNode) -> None:
    delivered: asyncio.Queue[tuple[str, Delivery]] = asyncio.Queue()
    gone: asyncio.Queue[str] = asyncio.Queue()
    pool = NodePool(
        "gateway-1",
        on_delivery=lambda node_id, d: delivered.put_nowait((node_id, d)),
        on_disconnect=gone.put_nowait,
    )
    try:
        client = pool.client("node-a", node.address)
        demand = Demand(1, 3, Epoch(7), "t", "orders", 10, None)
        # Never dials: a demand is for a connection the gateway already uses.
        assert client.demand(demand) is False
        call = asyncio.create_task(client.call("next_visible_at", 3, tenant=T, queue=Q))
        stream, request = await node.next_request()
        assert client.demand(demand) is True
        client.withdraw(1, 3)
        async with asyncio.timeout(scaled(5)):
            assert [await node.one_way.get(), await node.one_way.get()] == [demand, Withdraw(1, 3)]
        record = ["orders", "id-1", 4, "r1", b"x", False, {}, None, 1.5, 1, 31.5]
        stream.connection.deliver(1, 3, "t", "orders", [record])
        stream.connection.reply(request.id, None)
        stream.flush()
        assert await call is None
        async with asyncio.timeout(scaled(5)):
            assert await delivered.get() == ("node-a", Delivery(1, 3, "t", "orders", (record,)))
            # The node closing the connection is reported (its demands are gone with it).
            await node.drop_connections()
            assert await gone.get() == "node-a"
        assert client.demand(demand) is False
    finally:
        await pool.close()
    assert gone.empty()  # closing the pool is not a lost connection
