"""Consecutive single-message sends of a connection ride as one batcher item (push/send_group.py):
each request keeps its own reply, its place in the queue and its own usage record. On the
engine with a real store, then through a real gateway."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from backend_store import NewMessage, QueueName, TenantId, open_backend
from backend_store.backend import Backend
from backend_store.errors import MessageTooLarge, PushgateError, QueueNotFound
from backend_store.types import SendResult
from push.engine import PushEngine
from push.observer import DEDUPLICATED, OK, SEND, Observers
from push.send_group import SendGroup
from push.wakeup import WakeupHub
from tests.conftest import scaled, wait_for
from tests.gateway.conftest import RunningGateway

from .conftest import Http, recv_frame, send_frame, ws_connect

T = TenantId("t")
Q = QueueName("q")

Results = list[SendResult | PushgateError] | BaseException


@dataclass
class Recorded:
    """An observer sink that keeps what it was told: (queue, operation, outcome) -> units,
    and the latency samples of each (queue, operation)."""

    units: dict[tuple[str, str, str], int] = field(default_factory=dict)
    latencies: dict[tuple[str, str], list[float]] = field(default_factory=dict)
    bytes: dict[tuple[str, str], int] = field(default_factory=dict)

    def observe(
        self,
        tenant: str,
        queue: str,
        operation: str,
        transport: str,
        outcome: str = OK,
        count: int = 1,
        nbytes: int = 0,
        latency_s: float | None = None,
    ) -> None:
        key = (queue, operation, outcome)
        self.units[key] = self.units.get(key, 0) + count
        self.bytes[(queue, operation)] = self.bytes.get((queue, operation), 0) + nbytes
        if latency_s is not None:
            self.latencies.setdefault((queue, operation), []).append(latency_s)

    def observe_latencies(
        self,
        tenant: str,
        queue: str,
        operation: str,
        transport: str,
        nbytes: int,
        latencies_s: Sequence[float],
    ) -> None:
        key = (queue, operation, OK)
        self.units[key] = self.units.get(key, 0) + len(latencies_s)
        self.bytes[(queue, operation)] = self.bytes.get((queue, operation), 0) + nbytes
        self.latencies.setdefault((queue, operation), []).extend(latencies_s)


@pytest.fixture
async def backend(tmp_path: Path) -> AsyncIterator[Backend]:
    store = open_backend(f"lmdb://{tmp_path}")
    await store.start()
    await store.create_queue(T, Q, {"max_message_bytes": 8})
    try:
        yield store
    finally:
        await store.close()


@pytest.fixture
def recorded() -> Recorded:
    return Recorded()


@pytest.fixture
async def engine(backend: Backend, recorded: Recorded) -> AsyncIterator[PushEngine]:
    push = PushEngine(backend, WakeupHub(), observer=Observers([recorded]))
    await push.start()
    try:
        yield push
    finally:
        await push.drain()


def group_of(queue: QueueName, first: NewMessage, answered: asyncio.Future[Results]) -> SendGroup:
    return SendGroup(queue, first, "r0", time.perf_counter(), answered.set_result)


async def test_a_group_answers_each_request_with_its_own_result(
    engine: PushEngine, recorded: Recorded
) -> None:
    answered: asyncio.Future[Results] = asyncio.get_running_loop().create_future()
    group = group_of(Q, NewMessage(b"one", dedupe_id="d"), answered)
    engine.send_group(T, group)
    # Joined before the batcher ran: the same store call.
    group.add(NewMessage(b"far too long"), "r1", time.perf_counter())
    group.add(NewMessage(b"three"), None, time.perf_counter())
    group.add(NewMessage(b"again", dedupe_id="d"), "r3", time.perf_counter())
    async with asyncio.timeout(scaled(10)):
        results = await answered
    assert group.taken
    assert not isinstance(results, BaseException)
    one, too_long, three, again = results
    assert isinstance(one, SendResult) and isinstance(three, SendResult) and isinstance(again, SendResult)
    assert isinstance(too_long, MessageTooLarge)  # the bad entry fails alone
    assert one.seq < three.seq and not one.duplicate and not three.duplicate
    assert again.duplicate and again.id == one.id
    # Usage as if each had been its own request: two stored, each with its own latency sample.
    assert recorded.units == {
        (Q, SEND, OK): 2,
        (Q, DEDUPLICATED, OK): 1,
        (Q, SEND, "message_too_large"): 1,
    }
    assert len(recorded.latencies[(Q, SEND)]) == 2
    assert recorded.bytes[(Q, SEND)] == len(b"one") + len(b"three")


async def test_a_group_the_store_refuses_counts_every_request(engine: PushEngine, recorded: Recorded) -> None:
    answered: asyncio.Future[Results] = asyncio.get_running_loop().create_future()
    group = group_of(QueueName("missing"), NewMessage(b"a"), answered)
    engine.send_group(T, group)
    group.add(NewMessage(b"b"), "r1", time.perf_counter())
    async with asyncio.timeout(scaled(10)):
        results = await answered
    assert isinstance(results, QueueNotFound)
    assert recorded.units == {("missing", SEND, "queue_not_found"): 2}


async def test_a_taken_group_is_marked_so(engine: PushEngine) -> None:
    answered: asyncio.Future[Results] = asyncio.get_running_loop().create_future()
    group = group_of(Q, NewMessage(b"a"), answered)
    engine.send_group(T, group)
    open_at_first = not group.taken  # more may join until the batcher runs
    async with asyncio.timeout(scaled(10)):
        await answered
    assert open_at_first and group.taken and len(group.entries) == 1


# Through a real gateway ---------------------------------------------------------------


async def read_replies(ws: Any, ids: set[Any]) -> list[dict[str, Any]]:
    """Every reply until each of ``ids`` was answered, in the order they came."""
    replies: list[dict[str, Any]] = []
    waiting = set(ids)
    while waiting:
        frame = await recv_frame(ws, timeout=20)
        if frame["op"] in ("ok", "error"):
            replies.append(frame)
            waiting.discard(frame["id"])
    return replies


async def test_pipelined_single_sends_keep_ids_order_and_usage(
    gateway: RunningGateway, http: Http, qname: str
) -> None:
    await http.queue(qname, max_message_bytes=64)
    recorded = Recorded()
    observer = gateway.services.observer
    observer.add(recorded)
    try:
        async with ws_connect(gateway, gateway.admin_key) as ws:
            for i in range(60):
                if i == 7:
                    await send_frame(ws, op="send", queue=qname, body="x" * 100, id=i)  # too large
                elif i == 13:
                    await send_frame(ws, op="send", queue=qname, body=5, id=i)  # not a message
                elif i == 20:
                    await send_frame(ws, op="send", queue=qname, body="no id")
                else:
                    await send_frame(ws, op="send", queue=qname, body=f"m{i}", id=i)
            replies = await read_replies(ws, {i for i in range(60) if i != 20})
        by_id = {reply["id"]: reply for reply in replies}
        assert len(by_id) == len(replies) == 59  # one reply per request with an id
        assert (by_id[7]["op"], by_id[7]["code"]) == ("error", "message_too_large")
        assert (by_id[13]["op"], by_id[13]["code"]) == ("error", "invalid_request")
        oks = [reply for reply in replies if reply["op"] == "ok"]
        assert len(oks) == 57
        # The oks come in the order the requests were sent, and so do their seqs.
        assert [reply["id"] for reply in oks] == sorted(reply["id"] for reply in oks)
        seqs = [reply["result"]["seq"] for reply in oks]
        assert seqs == sorted(seqs) and len(set(seqs)) == 57

        async def all_recorded() -> bool:
            return recorded.units.get((qname, SEND, OK), 0) == 58

        # The fire-and-forget send is stored (and recorded) on its own time.
        await wait_for(all_recorded, what="every stored send to be recorded")
        assert len(recorded.latencies[(qname, SEND)]) == 58  # one sample per request
        assert recorded.units.get((qname, SEND, "message_too_large")) == 1
        assert (await http.stats(qname))["visible"] == 58
    finally:
        observer.sinks = tuple(sink for sink in observer.sinks if sink is not recorded)


async def test_a_batch_send_between_single_sends_keeps_its_place(
    gateway: RunningGateway, http: Http, qname: str
) -> None:
    await http.queue(qname)
    async with ws_connect(gateway, gateway.admin_key) as ws:
        for round_ in range(5):
            await send_frame(ws, op="send", queue=qname, body=f"s{round_}a", id=f"{round_}a")
            await send_frame(
                ws, op="send", queue=qname, messages=[{"body": "b1"}, {"body": "b2"}], id=f"{round_}b"
            )
            await send_frame(ws, op="send", queue=qname, body=f"s{round_}c", id=f"{round_}c")
        replies = await read_replies(ws, {f"{r}{x}" for r in range(5) for x in "abc"})
    seqs: list[int] = []
    for round_ in range(5):
        by_id = {reply["id"]: reply for reply in replies}
        seqs.append(by_id[f"{round_}a"]["result"]["seq"])
        seqs.extend(result["seq"] for result in by_id[f"{round_}b"]["results"])
        seqs.append(by_id[f"{round_}c"]["result"]["seq"])
    assert seqs == sorted(seqs) and len(set(seqs)) == 20
