"""The transports' two promises the engine builds on, on the real transport classes with an
ASGI ``send`` that is a list (or a socket that never drains):

- on close, frames not yet handed to the socket are dropped *before* their messages are
  released, so no message is in two consumers' hands at once (docs/push.md, Guarantees);
- an auto-ack subscription's credit is bounded by the transport's backlog, so a consumer
  whose socket stopped draining loses at most ``prefetch`` messages, not the queue.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import orjson

from backend_store import QueueName, TenantId
from backend_store.types import MessageId, Receipt, ReceivedMessage
from push.close_codes import CloseCode
from push.subscription import Connection, Subscription
from push.transport import BufferedTransport, SseTransport, WsTransport
from tests.conftest import scaled

T = TenantId("t")
Q = QueueName("q")


class Principal:
    tenant = T
    expires_at: float | None = None

    def can(self, action: str, queue: str | None = None) -> bool:
        return True


class Socket:
    """An ASGI ``send`` that records messages; ``stall()`` makes the next send block."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.entered = asyncio.Event()

    def stall(self) -> None:
        self.gate.clear()

    async def __call__(self, message: Any) -> None:
        self.entered.set()
        await self.gate.wait()
        self.sent.append(message)


def released_log(transport: BufferedTransport, log: list[str]) -> None:
    """Record, as the engine's on_close does, when messages are released: at that moment
    the transport must already hold no unsent delivery."""

    def on_close(code: CloseCode, reason: str) -> None:
        log.append(f"released with backlog {transport.backlog}")

    transport.bind(on_close)


async def test_ws_close_drops_unsent_frames_before_release() -> None:
    socket = Socket()
    transport = WsTransport(socket, limit=1 << 20)
    log: list[str] = []
    released_log(transport, log)
    socket.stall()
    transport.write(["m1", "m2", "m3"])
    writer = asyncio.create_task(transport.run())
    async with asyncio.timeout(scaled(5)):
        await socket.entered.wait()  # m1 is in the socket's hands; m2, m3 wait in the buffer
    transport.close(CloseCode.POLICY, "slow consumer")
    assert log == ["released with backlog 0"]
    transport.write(["m4"])  # a late delivery after close is dropped too
    socket.gate.set()
    async with asyncio.timeout(scaled(5)):
        await writer
    texts = [m.get("text") for m in socket.sent if m["type"] == "websocket.send"]
    assert texts == ["m1"]
    assert socket.sent[-1] == {"type": "websocket.close", "code": 4008, "reason": "slow consumer"}


async def test_ws_close_before_the_writer_ran_sends_only_the_close() -> None:
    socket = Socket()
    transport = WsTransport(socket, limit=1 << 20)
    transport.write(["m1", "m2"])
    transport.close(CloseCode.GOING_AWAY, "draining")
    async with asyncio.timeout(scaled(5)):
        await transport.run()
    assert socket.sent == [{"type": "websocket.close", "code": 1001, "reason": "draining"}]


async def test_sse_close_drops_unsent_events_and_ends_with_a_close_event() -> None:
    transport = SseTransport(limit=1 << 20, ping_interval_s=60)
    log: list[str] = []
    released_log(transport, log)
    transport.write([b"id: s.1\nevent: message\ndata: {}\n\n", b"id: s.2\nevent: message\ndata: {}\n\n"])
    transport.close(CloseCode.POLICY, "slow consumer")
    assert log == ["released with backlog 0"]
    chunks = []
    async with asyncio.timeout(scaled(5)):
        async for chunk in transport.body(b"retry: 100\n\n"):
            chunks.append(chunk)
    assert chunks[0] == b"retry: 100\n\n"
    assert b"event: message" not in b"".join(chunks)
    assert chunks[-1].startswith(b"event: close\ndata: ")
    assert orjson.loads(chunks[-1].split(b"data: ", 1)[1]) == {
        "code": 4008,
        "reason": "slow consumer",
        "reconnect": True,
    }


def received(n: int) -> ReceivedMessage:
    return ReceivedMessage(
        queue=Q,
        id=MessageId(f"id{n}"),
        seq=n,
        receipt=Receipt(f"r{n}"),
        body=b"x",
        is_text=True,
        attributes={},
        group_id=None,
        sent_at=0.0,
        receive_count=1,
        visible_at=0.0,
    )


def frames(payloads: Sequence[bytes], first_n: int) -> list[bytes]:
    return list(payloads)


async def test_auto_ack_credit_is_bounded_by_the_transport_backlog() -> None:
    # A socket that never drains: nothing runs the writer, so every frame stays buffered.
    transport = BufferedTransport(limit=1 << 30)
    conn = Connection(Principal(), transport)
    sub = Subscription(conn, Q, frames, {}, prefetch=5, auto_ack=True, visibility_timeout_s=30)
    assert sub.credit(0.0) == 5
    sub.deliver([received(1), received(2), received(3)], [b"a", b"b", b"c"])
    assert sub.credit(0.0) == 2
    sub.deliver([received(4), received(5)], [b"d", b"e"])
    assert sub.credit(0.0) == 0
    # Nothing is held for an auto-ack subscription: the messages are gone from the store.
    assert sub.in_flight == {}
