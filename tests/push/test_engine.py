"""The engine on a real embedded store, with a transport that records what it was given
(no sockets): credits, release on close, SSE resume, drain."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest

from backend_store import NewMessage, QueueName, TenantId, open_backend
from backend_store.backend import Backend
from push.close_codes import CloseCode
from push.engine import PushEngine
from push.settings import PushSettings
from push.subscription import Subscription
from push.transport import BufferedTransport
from push.wakeup import WakeupHub
from tests.conftest import scaled

T = TenantId("t")
Q = QueueName("q")


class RecordingTransport(BufferedTransport):
    """A transport whose socket is a list: everything written lands in ``delivered`` at once."""

    def __init__(self) -> None:
        super().__init__(1 << 30)
        self.delivered: list[dict[str, object]] = []
        self.numbers: list[int] = []
        self.arrived = asyncio.Event()

    def write(self, sub: Subscription, payload: bytes, n: int) -> None:
        self.write_many(sub, [payload], n)

    def write_many(self, sub: Subscription, payloads: list[bytes], first_n: int) -> None:
        if self.closed:
            return
        self.delivered += [orjson.loads(p) for p in payloads]
        self.numbers += range(first_n, first_n + len(payloads))
        self.arrived.set()

    def end_subscription(self, queue: str, code: str, detail: str) -> None:
        self.close(CloseCode.NORMAL, code)

    async def count(self, n: int) -> None:
        async with asyncio.timeout(scaled(5)):
            while len(self.delivered) < n:
                self.arrived.clear()
                await self.arrived.wait()


@pytest.fixture
async def backend(tmp_path: Path) -> AsyncIterator[Backend]:
    store = open_backend(f"lmdb://{tmp_path}")
    await store.start()
    await store.create_queue(T, Q, {"visibility_timeout_s": 600})
    try:
        yield store
    finally:
        await store.close()


@pytest.fixture
async def engine(backend: Backend) -> AsyncIterator[PushEngine]:
    hub = WakeupHub()
    backend.add_listener(hub.notify)
    push = PushEngine(backend, hub, PushSettings(sse_resume_grace_s=60))
    try:
        yield push
    finally:
        await push.drain()


async def send(backend: Backend, *bodies: str) -> None:
    await backend.send(T, Q, [NewMessage(b.encode()) for b in bodies])


async def stats(backend: Backend) -> tuple[int, int]:
    info = await backend.get_queue(T, Q)
    return info.stats.visible, info.stats.in_flight


async def test_credit_and_settle(engine: PushEngine, backend: Backend) -> None:
    await send(backend, "a", "b", "c", "d", "e")
    transport = RecordingTransport()
    conn = engine.open_connection(T, transport)
    engine.subscribe(conn, Q, prefetch=2)
    await transport.count(2)
    assert engine.consumers(T, Q) == 1
    assert len(engine.owners) == 2
    engine.ack(T, [str(transport.delivered[0]["receipt"])])
    await transport.count(3)
    assert [m["body"] for m in transport.delivered] == ["a", "b", "c"]
    assert transport.numbers == [1, 2, 3]


async def test_close_releases_at_once(engine: PushEngine, backend: Backend) -> None:
    await send(backend, "a", "b")
    transport = RecordingTransport()
    conn = engine.open_connection(T, transport)
    engine.subscribe(conn, Q, prefetch=10)
    await transport.count(2)
    assert await stats(backend) == (0, 2)
    transport.close(CloseCode.POLICY, "slow")  # the transport tells the engine itself
    await engine.acks.wait_idle()
    assert await stats(backend) == (2, 0)
    assert engine.consumers(T, Q) == 0 and not engine.owners


async def test_resume_keeps_what_was_read_and_releases_the_rest(engine: PushEngine, backend: Backend) -> None:
    await send(backend, "a", "b", "c")
    old = RecordingTransport()
    old_conn = engine.open_connection(T, old, "stream-old-0001")
    engine.subscribe(old_conn, Q, prefetch=10)
    await old.count(3)
    engine.suspend(old_conn)  # the client went away
    new = RecordingTransport()
    new_conn = engine.open_connection(T, new, "stream-new-0001")
    sub = engine.subscribe(new_conn, Q, prefetch=10, start=False)
    assert engine.resume(sub, "stream-old-0001", 1) == 2
    engine.start_subscription(sub)
    await new.count(2)
    assert [m["body"] for m in new.delivered] == ["b", "c"]
    assert new.numbers == [2, 3]  # after the adopted message, numbered 1
    # The kept one still acks, and frees the new stream's credit.
    engine.settle([str(old.delivered[0]["receipt"])])
    assert len(sub.in_flight) == 2
    assert engine.resume(sub, "stream-unknown-01", 5) == 0


async def test_drain_releases_and_refuses(engine: PushEngine, backend: Backend) -> None:
    await send(backend, "a")
    transport = RecordingTransport()
    conn = engine.open_connection(T, transport)
    engine.subscribe(conn, Q, prefetch=10)
    await transport.count(1)
    await engine.drain()
    assert transport.close_code is CloseCode.GOING_AWAY
    assert await stats(backend) == (1, 0)
    with pytest.raises(Exception) as info:
        engine.open_connection(T, RecordingTransport())
    assert getattr(info.value, "code", None) == "unavailable"


async def test_visibility_expiry_gives_credit_back(engine: PushEngine, backend: Backend) -> None:
    await send(backend, "a")
    transport = RecordingTransport()
    conn = engine.open_connection(T, transport)
    engine.subscribe(conn, Q, prefetch=1, visibility_timeout_s=0.2)
    await transport.count(1)
    # Not acked: when its visibility ends the dispatcher wakes (no notify comes) and deals it again.
    await transport.count(2)
    assert transport.delivered[1]["id"] == transport.delivered[0]["id"]
    assert transport.delivered[1]["receive_count"] == 2
