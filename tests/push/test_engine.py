"""The engine on a real embedded store, with a transport that records what it was given
(no sockets): credits, release on close, SSE resume, drain."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest

from backend_store import NewMessage, QueueName, TenantId, open_backend
from backend_store.backend import Backend
from backend_store.errors import PushgateError, Unauthorized
from push.close_codes import CloseCode
from push.engine import PushEngine
from push.principal import PrincipalLike
from push.settings import PushSettings
from push.transport import BufferedTransport
from push.wakeup import WakeupHub
from tests.conftest import scaled, wait_for

T = TenantId("t")
Q = QueueName("q")


@dataclass(frozen=True)
class Caller:
    tenant: TenantId = T
    expires_at: float | None = None

    def can(self, action: str, queue: str | None = None) -> bool:
        return True


P = Caller()


def numbered(payloads: Sequence[bytes], first_n: int) -> list[bytes]:
    """A frame encoder for tests: ``<n> <message JSON>``."""
    return [b"%d %s" % (n, payload) for n, payload in enumerate(payloads, first_n)]


class RecordingTransport(BufferedTransport):
    """A transport whose socket is a list: everything written lands in ``delivered`` at once."""

    def __init__(self) -> None:
        super().__init__(1 << 30)
        self.delivered: list[dict[str, object]] = []
        self.numbers: list[int] = []
        self.arrived = asyncio.Event()

    def write(self, frames: Sequence[bytes]) -> None:
        if self.closed:
            return
        for frame in frames:
            n, _, payload = frame.partition(b" ")
            self.numbers.append(int(n))
            self.delivered.append(orjson.loads(payload))
        self.arrived.set()

    async def count(self, n: int) -> None:
        # 10 s: a redelivery is a receive, an fsync, which takes seconds on a busy disk.
        async with asyncio.timeout(scaled(10)):
            while len(self.delivered) < n:
                self.arrived.clear()
                await self.arrived.wait()


WATCHED = PushSettings(
    sse_resume_grace_s=60, watchdog_interval_s=0.05, stall_grace_s=0.1, recheck_interval_s=0.05
)


class Revocations:
    """The credential recheck the gateway injects, as a set of revoked principals."""

    def __init__(self) -> None:
        self.revoked: set[PrincipalLike] = set()

    async def recheck(
        self, principals: Collection[PrincipalLike]
    ) -> dict[PrincipalLike, PrincipalLike | PushgateError]:
        return {p: Unauthorized("API key revoked") if p in self.revoked else p for p in principals}


@pytest.fixture
def revoked() -> Revocations:
    return Revocations()


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
async def engine(backend: Backend, revoked: Revocations) -> AsyncIterator[PushEngine]:
    hub = WakeupHub()
    backend.add_listener(hub.notify)
    push = PushEngine(backend, hub, WATCHED, recheck=revoked.recheck)
    await push.start()
    try:
        yield push
    finally:
        await push.drain()


async def done(value: bool) -> bool:
    return value


async def send(backend: Backend, *bodies: str) -> None:
    await backend.send(T, Q, [NewMessage(b.encode()) for b in bodies])


async def stats(backend: Backend) -> tuple[int, int]:
    info = await backend.get_queue(T, Q)
    return info.stats.visible, info.stats.in_flight


async def test_credit_and_settle(engine: PushEngine, backend: Backend) -> None:
    await send(backend, "a", "b", "c", "d", "e")
    transport = RecordingTransport()
    conn = engine.open_connection(P, transport)
    await engine.subscribe(conn, Q, numbered, prefetch=2)
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
    conn = engine.open_connection(P, transport)
    await engine.subscribe(conn, Q, numbered, prefetch=10)
    await transport.count(2)
    assert await stats(backend) == (0, 2)
    transport.close(CloseCode.POLICY, "slow")  # the transport tells the engine itself
    await engine.acks.wait_idle()
    assert await stats(backend) == (2, 0)
    assert engine.consumers(T, Q) == 0 and not engine.owners


async def test_resume_keeps_what_was_read_and_releases_the_rest(engine: PushEngine, backend: Backend) -> None:
    await send(backend, "a", "b", "c")
    old = RecordingTransport()
    old_conn = engine.open_connection(P, old, "stream-old-0001")
    await engine.subscribe(old_conn, Q, numbered, prefetch=10)
    await old.count(3)
    engine.suspend(old_conn)  # the client went away
    new = RecordingTransport()
    new_conn = engine.open_connection(P, new, "stream-new-0001")
    sub = await engine.subscribe(new_conn, Q, numbered, prefetch=10, start=False)
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
    conn = engine.open_connection(P, transport)
    await engine.subscribe(conn, Q, numbered, prefetch=10)
    await transport.count(1)
    await engine.drain()
    assert transport.close_code is CloseCode.GOING_AWAY
    assert await stats(backend) == (1, 0)
    with pytest.raises(Exception) as info:
        engine.open_connection(P, RecordingTransport())
    assert getattr(info.value, "code", None) == "unavailable"


async def test_visibility_expiry_gives_credit_back_to_a_consumer_that_speaks(
    engine: PushEngine, backend: Backend
) -> None:
    await send(backend, "a")
    transport = RecordingTransport()
    conn = engine.open_connection(P, transport)
    # Seconds, so the client is heard well before the watchdog could judge it silent.
    await engine.subscribe(conn, Q, numbered, prefetch=1, visibility_timeout_s=2)
    await transport.count(1)
    conn.heard()  # any frame: the client is alive and reading
    # Not acked: when its visibility ends the dispatcher wakes (no notify comes) and deals it again.
    await transport.count(2)
    assert transport.delivered[1]["id"] == transport.delivered[0]["id"]
    assert transport.delivered[1]["receive_count"] == 2
    assert not transport.closed


async def test_a_silent_consumer_gets_no_credit_back_and_is_closed_4008(
    engine: PushEngine, backend: Backend
) -> None:
    await send(backend, "a", "b")
    silent, healthy = RecordingTransport(), RecordingTransport()
    silent_conn = engine.open_connection(P, silent)
    await engine.subscribe(silent_conn, Q, numbered, prefetch=1, visibility_timeout_s=0.2)
    await silent.count(1)
    healthy_conn = engine.open_connection(P, healthy)
    await engine.subscribe(healthy_conn, Q, numbered, prefetch=10, visibility_timeout_s=600)
    await healthy.count(1)
    # The silent one's message times out; it never hears of it again: the healthy one does.
    await healthy.count(2)
    await wait_for(lambda: done(silent.closed), what="the silent consumer to be closed")
    assert silent.close_code is CloseCode.POLICY
    assert len(silent.delivered) == 1
    assert sorted(str(m["body"]) for m in healthy.delivered) == ["a", "b"]


async def test_revoked_credentials_end_connections_and_long_polls(
    engine: PushEngine, backend: Backend, revoked: Revocations
) -> None:
    await send(backend, "a")
    transport = RecordingTransport()
    conn = engine.open_connection(P, transport)
    await engine.subscribe(conn, Q, numbered, prefetch=10)
    await transport.count(1)
    poll_principal = Caller(expires_at=9e12)

    async def forever() -> None:
        await asyncio.Event().wait()

    poll = asyncio.ensure_future(engine.receive(poll_principal, Q, 1, None, 20, forever))
    await wait_for(lambda: done(bool(engine.polls.parked)), what="the long-poll to park")
    revoked.revoked |= {P, poll_principal}
    with pytest.raises(Unauthorized):
        async with asyncio.timeout(scaled(5)):
            await poll
    await wait_for(lambda: done(transport.closed), what="the connection to be closed")
    assert (transport.close_code, transport.close_reason) == (CloseCode.AUTH_FAILED, "API key revoked")
    await engine.acks.wait_idle()
    assert await stats(backend) == (1, 0)  # its message went back at once
