"""Connection lifecycle: slow consumers (4008) and shutdown drain (1001, SSE ended, messages released)."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from websockets.client import ClientProtocol
from websockets.uri import parse_uri

from backend_store.tested_versions import ReleaseCheck
from tests.conftest import scaled
from tests.fixtures.dev_cluster import StoreTarget
from tests.gateway.conftest import RunningGateway, start_gateway

from .conftest import (
    Http,
    closed_with,
    deliveries,
    poll,
    request,
    send_frame,
    sse_stream,
    start_push_gateway,
    ws_connect,
    ws_url,
)


class StalledClient:
    """A WebSocket client that stops reading: ``websockets``' own sans-I/O protocol over a
    raw socket with a small fixed receive buffer (the asyncio client reads on regardless,
    and loopback autotunes buffers up to tens of MiB)."""

    def __init__(self, sock: socket.socket, protocol: ClientProtocol) -> None:
        self.sock = sock
        self.protocol = protocol
        self.loop = asyncio.get_running_loop()

    @classmethod
    async def open(cls, gateway: RunningGateway) -> StalledClient:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
        sock.setblocking(False)
        client = cls(sock, ClientProtocol(parse_uri(ws_url(gateway)), max_size=None))
        await client.loop.sock_connect(sock, ("127.0.0.1", gateway.port))
        request = client.protocol.connect()
        request.headers["Authorization"] = f"Bearer {gateway.admin_key}"
        client.protocol.send_request(request)
        await client.flush()
        while not client.protocol.events_received():
            client.protocol.receive_data(await client.loop.sock_recv(sock, 65536))
        return client

    async def flush(self) -> None:
        for data in self.protocol.data_to_send():
            await self.loop.sock_sendall(self.sock, data)

    async def send(self, frame: dict[str, Any]) -> None:
        self.protocol.send_text(orjson.dumps(frame))
        await self.flush()

    async def close_code(self) -> int | None:
        async with asyncio.timeout(scaled(30)):
            while self.protocol.close_rcvd is None:
                data = await self.loop.sock_recv(self.sock, 1 << 20)
                if not data:
                    break
                self.protocol.receive_data(data)
                self.protocol.events_received()
        self.sock.close()
        return None if self.protocol.close_rcvd is None else self.protocol.close_rcvd.code


@pytest.mark.websocket_doors  # on both doors (tests/push/conftest.py)
async def test_slow_consumer_closed_4008_and_its_messages_go_to_a_healthy_one(
    gateway: RunningGateway, http: Http, qname: str
) -> None:
    await http.queue(qname, visibility_timeout_s=600)
    total = 200
    body = "x" * 60_000
    for start in range(0, total, 20):
        await http.send_many(qname, [f"{i}:{body}" for i in range(start, start + 20)])
    slow = await StalledClient.open(gateway)
    await slow.send({"op": "subscribe", "queue": qname, "prefetch": 1000})
    acked: set[str] = set()
    async with ws_connect(gateway, gateway.admin_key, max_size=2**24) as healthy:
        # Its prefetch keeps what it holds under the buffer bound: credits, not the bound, pace it.
        assert (await request(healthy, op="subscribe", queue=qname, prefetch=3, id=1))["op"] == "ok"
        async with asyncio.timeout(scaled(60)):
            while len(acked) < total:
                got = await deliveries(healthy, 1, timeout=60)
                acked.update(m["id"] for m in got)
                await send_frame(healthy, op="ack", receipts=[m["receipt"] for m in got])
    # Reading at last, the stalled client finds the close after what the kernel had buffered.
    assert await slow.close_code() == 4008
    assert len(acked) == total

    async def empty() -> bool:
        stats = await http.stats(qname)
        return bool(stats["visible"] == 0 and stats["in_flight"] == 0)

    await poll(empty, what="every message acked")


@pytest.mark.websocket_doors  # on both doors (tests/push/conftest.py)
async def test_consumers_that_stop_reading_small_messages_are_closed_4008(
    gateway: RunningGateway, http: Http, qname: str
) -> None:
    # Small messages never fill a socket: only their timing out unacked, with not a word
    # from the client since, tells that these consumers stopped reading (issue: a stalled
    # consumer got its credit back each time its messages timed out, starving the rest).
    await http.queue(qname, visibility_timeout_s=1)
    stalled = [await StalledClient.open(gateway) for _ in range(5)]
    for client in stalled:
        await client.send({"op": "subscribe", "queue": qname, "prefetch": 10})
    total = 200
    await http.send_many(qname, [f"m{i}" for i in range(total)])
    acked: set[str] = set()
    async with ws_connect(gateway, gateway.admin_key) as healthy:
        assert (await request(healthy, op="subscribe", queue=qname, prefetch=10, id=1))["op"] == "ok"
        async with asyncio.timeout(scaled(30)):
            while len(acked) < total:
                got = await deliveries(healthy, 1, timeout=30)
                acked.update(m["id"] for m in got)
                await send_frame(healthy, op="ack", receipts=[m["receipt"] for m in got])
    assert len(acked) == total
    assert [await client.close_code() for client in stalled] == [4008] * len(stalled)


@pytest.mark.websocket_doors  # on both doors (tests/push/conftest.py)
async def test_a_peer_that_never_answers_pings_is_closed_1011(
    tmp_path: Path, store_target: StoreTarget, websocket_doors: ReleaseCheck
) -> None:
    gateway = start_gateway(
        tmp_path, 0, store_target, websocket_doors, ws_ping_interval_s=0.3, ws_ping_timeout_s=0.3
    )
    try:
        silent = await StalledClient.open(gateway)
        # It reads what comes (the ping too) but never sends the pong its protocol queues.
        assert await silent.close_code() == 1011
    finally:
        gateway.stop()


@pytest.mark.websocket_doors  # on both doors (tests/push/conftest.py)
async def test_shutdown_drain(
    tmp_path: Path, store_target: StoreTarget, websocket_doors: ReleaseCheck, qname: str
) -> None:
    gateway = start_push_gateway(tmp_path, target=store_target, releases=websocket_doors)
    try:
        # A fresh name: on cluster:// each door's run shares the store.
        await _drain_scenario(gateway, qname)
    finally:
        gateway.stop()


async def _drain_scenario(gateway: RunningGateway, name: str) -> None:
    headers = {"Authorization": f"Bearer {gateway.admin_key}"}
    async with httpx.AsyncClient(base_url=gateway.url, headers=headers, timeout=scaled(30)) as client:
        http = Http(client)
        queue = await http.queue(name, visibility_timeout_s=600)
        await http.send_many(queue, [f"m{i}" for i in range(5)])
        async with (
            ws_connect(gateway, gateway.admin_key) as ws,
            sse_stream(gateway, queue, gateway.admin_key, prefetch=2) as sse,
        ):
            assert (await request(ws, op="subscribe", queue=queue, prefetch=3, id=1))["op"] == "ok"
            held: list[dict[str, Any]] = await deliveries(ws, 3)
            held += await sse.messages(2)
            assert len({m["id"] for m in held}) == 5
            stats = await http.stats(queue)
            assert (stats["in_flight"], stats["consumers"]) == (5, 2)

            # What GatewayServer.shutdown does first on SIGTERM.
            drain = asyncio.get_running_loop().run_in_executor(None, gateway.call, gateway.services.drain())
            assert await closed_with(ws) == 1001
            # The SSE stream says why and ends.
            closing = await sse.next()
            assert closing["event"] == "close"
            assert orjson.loads(closing["data"])["code"] == 1001
            try:
                extra = await sse.next()
                raise AssertionError(f"event after close: {extra}")
            except EOFError:
                pass
            await drain
        stats = await http.stats(queue)
        assert (stats["visible"], stats["in_flight"], stats["consumers"]) == (5, 0, 0)
        # New push connections are turned away while draining.
        async with ws_connect(gateway, gateway.admin_key) as late:
            assert await closed_with(late) == 1001


async def test_stalled_sse_stream_is_ended_and_its_messages_released(
    gateway: RunningGateway, http: Http, qname: str
) -> None:
    await http.queue(qname, visibility_timeout_s=600)
    total = 100
    body = "x" * 60_000
    for start in range(0, total, 20):
        await http.send_many(qname, [f"{i}:{body}" for i in range(start, start + 20)])
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
    sock.setblocking(False)
    await loop.sock_connect(sock, ("127.0.0.1", gateway.port))
    request_head = (
        f"GET /v1/queues/{qname}/events?prefetch=1000 HTTP/1.1\r\nHost: x\r\n"
        f"Authorization: Bearer {gateway.admin_key}\r\n\r\n"
    )
    await loop.sock_sendall(sock, request_head.encode())
    try:
        # Never read: the stream stalls, the server ends it and releases what it held.
        async with sse_stream(gateway, qname, gateway.admin_key, prefetch=3) as healthy:
            seen: set[str] = set()
            while len(seen) < total:
                for message in await healthy.messages(1, timeout=30):
                    seen.add(message["id"])
                    await http.ack(qname, [message["receipt"]])
    finally:
        sock.close()
