"""``LeaseKeepAlive``'s rules on a scripted stream (its channel passed to the constructor):
answers matched in order to their own lease, and every way the stream ends failing the
renewals that wait on it at once, as ``CoordinatorUnavailable``, never at their deadline.
A real etcd's stream: tests/cluster/test_coordinator.py."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest
from aetcd import rpc

from backend_store.cluster.coordination.coordinator import CoordinatorUnavailable
from backend_store.cluster.coordination.lease_keepalive import LeaseKeepAlive

# Far past what any test here waits: a renewal that reaches it shows a rule not applied.
_DEADLINE_S = 30.0


class ScriptedCall:
    """A ``LeaseKeepAlive`` call whose answers the test gives, and whose writes it may hold.

    Unlike gRPC, a write after ``cancel`` is taken without an error: the stream's rules must
    not depend on gRPC refusing it."""

    def __init__(self) -> None:
        self.written: list[int] = []
        self.write_gate: asyncio.Event | None = None  # set: writes go through
        self.writing = asyncio.Event()  # a write is waiting at the gate
        self.cancelled = asyncio.Event()
        self.wrote = asyncio.Condition()
        self._answers: asyncio.Queue[Any] = asyncio.Queue()

    async def write(self, request: rpc.LeaseKeepAliveRequest) -> None:
        self.written.append(request.ID)
        async with self.wrote:
            self.wrote.notify_all()
        if self.write_gate is not None:
            self.writing.set()
            await self.write_gate.wait()

    async def read(self) -> Any:
        answer = await self._answers.get()
        if isinstance(answer, BaseException):
            raise answer
        return answer

    def cancel(self) -> bool:
        if not self.cancelled.is_set():
            self.cancelled.set()
            self._answers.put_nowait(asyncio.CancelledError())
        return True

    def answer(self, lease_id: int, ttl: int) -> None:
        self._answers.put_nowait(rpc.LeaseKeepAliveResponse(ID=lease_id, TTL=ttl))

    def end(self) -> None:
        self._answers.put_nowait(grpc.aio.EOF)


class ScriptedChannel:
    def __init__(self) -> None:
        self.call = ScriptedCall()

    def stream_stream(self, path: str, **_: Any) -> Any:
        return lambda *args, **kwargs: self.call

    def unary_unary(self, path: str, **_: Any) -> Any:
        return None  # the stub's other methods, never called

    def unary_stream(self, path: str, **_: Any) -> Any:
        return None


async def _written(call: ScriptedCall, count: int) -> None:
    async with call.wrote:
        await call.wrote.wait_for(lambda: len(call.written) >= count)


async def test_each_renewal_gets_its_own_leases_answer_in_order() -> None:
    channel = ScriptedChannel()
    stream = LeaseKeepAlive(channel)
    first = asyncio.create_task(stream.renew(0xA, _DEADLINE_S))
    second = asyncio.create_task(stream.renew(0xB, _DEADLINE_S))
    await _written(channel.call, 2)
    channel.call.answer(0xA, 1)
    channel.call.answer(0xB, 0)  # etcd holds it no longer
    assert await first == 1
    assert await second == 0
    assert not stream.broken
    await stream.close()


async def test_an_answer_for_another_lease_ends_the_stream_and_fails_its_renewal() -> None:
    channel = ScriptedChannel()
    stream = LeaseKeepAlive(channel)
    renewal = asyncio.create_task(stream.renew(0xA, _DEADLINE_S))
    await _written(channel.call, 1)
    channel.call.answer(0xB, 1)
    with pytest.raises(CoordinatorUnavailable, match="where a was asked"):
        await renewal
    assert stream.broken and channel.call.cancelled.is_set()
    with pytest.raises(CoordinatorUnavailable, match="stream ended"):
        await stream.renew(0xA, _DEADLINE_S)  # the next renewal makes another stream
    await stream.close()


async def test_the_streams_end_fails_every_renewal_waiting_on_it() -> None:
    channel = ScriptedChannel()
    stream = LeaseKeepAlive(channel)
    renewals = [asyncio.create_task(stream.renew(lease, _DEADLINE_S)) for lease in (1, 2, 3)]
    await _written(channel.call, 3)
    channel.call.end()
    for renewal in renewals:
        with pytest.raises(CoordinatorUnavailable, match="the stream ended"):
            await renewal
    await stream.close()


async def test_a_renewal_waiting_to_write_when_the_stream_ends_fails_at_once() -> None:
    # One renewal's write is held; a second waits for the write lock; the stream ends. The
    # second must not write onto the ended stream and wait out its deadline for an answer.
    channel = ScriptedChannel()
    channel.call.write_gate = asyncio.Event()
    stream = LeaseKeepAlive(channel)
    writing = asyncio.create_task(stream.renew(1, _DEADLINE_S))
    await channel.call.writing.wait()
    waiting = asyncio.create_task(stream.renew(2, _DEADLINE_S))
    await asyncio.sleep(0)  # it reaches the write lock
    channel.call.end()
    await channel.call.cancelled.wait()  # the reader saw the end
    channel.call.write_gate.set()
    async with asyncio.timeout(5):
        for renewal in (writing, waiting):
            with pytest.raises(CoordinatorUnavailable, match="the stream ended"):
                await renewal
    assert channel.call.written == [1]
    await stream.close()


async def test_a_renewal_not_answered_by_its_deadline_ends_the_stream() -> None:
    channel = ScriptedChannel()
    stream = LeaseKeepAlive(channel)
    with pytest.raises(CoordinatorUnavailable, match=r"no answer to a lease renewal within 0\.05 s"):
        await stream.renew(1, 0.05)
    assert stream.broken
    channel.call.answer(1, 1)  # late: no later renewal may take it for its own
    with pytest.raises(CoordinatorUnavailable, match="stream ended"):
        await stream.renew(1, _DEADLINE_S)
    await stream.close()


async def test_a_cancelled_renewal_ends_the_stream_so_no_other_takes_its_answer() -> None:
    channel = ScriptedChannel()
    stream = LeaseKeepAlive(channel)
    renewal = asyncio.create_task(stream.renew(1, _DEADLINE_S))
    await _written(channel.call, 1)
    renewal.cancel()
    with pytest.raises(asyncio.CancelledError):
        await renewal
    assert stream.broken and channel.call.cancelled.is_set()
    await stream.close()
