"""The send batcher on its own (no I/O): a stand-in for ``ClusterBackend._partition_call``
that the test answers by hand, so which requests go out, with what, and when, is exact."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, cast

import pytest

from backend_store.cluster.client.partition_map import PartitionInfo
from backend_store.cluster.client.send_batcher import SendBatcher
from backend_store.errors import InvalidRequest, MessageTooLarge, PushgateError, QueueNotFound
from backend_store.types import MessageId, NewMessage, QueueName, SendResult, TenantId

Results = list[SendResult | PushgateError]


@dataclass
class Request:
    part: PartitionInfo
    retry_unknown: bool
    messages: list[NewMessage]
    answer: asyncio.Future[Any]
    since: float | None
    op: str = "send"
    queue: str = ""
    sends: list[tuple[str, list[NewMessage]]] = field(default_factory=list)


@dataclass
class FakeLeader:
    """Records each request and holds it until the test answers it."""

    requests: list[Request] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    async def __call__(
        self, part: PartitionInfo, op: str, *, retry_unknown: bool = False, **kwargs: Any
    ) -> Any:
        if op == "send_queues":
            sends = [(str(q), list(m)) for q, m in kwargs["sends"]]
            messages = [m for _, ms in sends for m in ms]
        else:
            assert op == "send" and kwargs["queue"] == part.queue
            sends, messages = [], list(kwargs["messages"])
        request = Request(
            part,
            retry_unknown,
            messages,
            asyncio.get_running_loop().create_future(),
            kwargs.get("since"),
            op,
            str(kwargs.get("queue", "")),
            sends,
        )
        self.requests.append(request)
        self.arrived.set()
        return await request.answer

    async def next_request(self, count: int) -> Request:
        while len(self.requests) < count:
            self.arrived.clear()
            await asyncio.wait_for(self.arrived.wait(), 5)
        return self.requests[count - 1]


def stored(request: Request) -> Results:
    """What a node answers: a result per message, the oversized refused alone."""
    out: Results = []
    for i, m in enumerate(request.messages):
        out.append(
            MessageTooLarge("too big") if m.body == b"huge" else SendResult(MessageId(m.body.decode()), i)
        )
    return out


def part(index: int = 0, queue: str = "q") -> PartitionInfo:
    return PartitionInfo(10 + index, TenantId("t"), QueueName(queue), index, ("n0",), "n0", "sync")


def msgs(*bodies: str, dedupe: bool = False) -> list[NewMessage]:
    return [NewMessage(b.encode(), dedupe_id=b if dedupe else None) for b in bodies]


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_sends_wait_while_one_is_in_flight_and_go_together_in_arrival_order() -> None:
    leader = FakeLeader()
    batcher = SendBatcher(leader, max_in_flight=1)
    first = asyncio.create_task(batcher.send(part(), QueueName("q"), msgs("a1"), safe=False))
    r1 = await leader.next_request(1)
    assert [m.body for m in r1.messages] == [b"a1"]  # the first goes at once, alone
    later = [
        asyncio.create_task(
            batcher.send(part(), QueueName("q"), msgs(f"{c}1", f"{c}2", "huge", f"{c}3"), safe=False)
        )
        for c in "bcd"
    ]
    await settle()
    assert len(leader.requests) == 1  # they wait while a1 is in flight
    r1.answer.set_result(stored(r1))
    assert [r.id for r in await first if isinstance(r, SendResult)] == ["a1"]
    r2 = await leader.next_request(2)
    # One request: each caller's entries contiguous, callers in arrival order.
    assert [m.body.decode() for m in r2.messages] == [
        "b1", "b2", "huge", "b3", "c1", "c2", "huge", "c3", "d1", "d2", "huge", "d3"
    ]  # fmt: skip
    r2.answer.set_result(stored(r2))
    for c, task in zip("bcd", later, strict=True):
        results = await task
        assert [r.id if isinstance(r, SendResult) else r.code for r in results] == [
            f"{c}1", f"{c}2", "message_too_large", f"{c}3"
        ]  # fmt: skip
    assert batcher.counters.requests == 2 and batcher.counters.calls == 4 and batcher.counters.merged == 1
    await settle()
    assert not batcher._lanes  # idle lanes are dropped


async def test_a_send_that_waited_keeps_the_deadline_it_had_when_it_was_called() -> None:
    """The request deadline of a merged request counts from its earliest caller's call, so
    waiting behind the request in flight spends the caller's budget (it used to start
    afresh when the merged request left)."""
    leader = FakeLeader()
    batcher = SendBatcher(leader, max_in_flight=1)
    first = asyncio.create_task(batcher.send(part(), QueueName("q"), msgs("a"), safe=False))
    r1 = await leader.next_request(1)
    assert r1.since is None  # went at once: its deadline counts from the call itself
    called = time.monotonic()
    waiting = [asyncio.create_task(batcher.send(part(), QueueName("q"), msgs(b), safe=False)) for b in "bc"]
    await settle()
    queued = time.monotonic()
    await asyncio.sleep(0.05)  # the request in flight takes a while
    r1.answer.set_result(stored(r1))
    await first
    r2 = await leader.next_request(2)
    assert r2.since is not None and called <= r2.since <= queued
    r2.answer.set_result(stored(r2))
    await asyncio.gather(*waiting)


async def test_safe_and_unsafe_sends_never_share_a_request() -> None:
    leader = FakeLeader()
    batcher = SendBatcher(leader, max_in_flight=1)
    tasks = [
        asyncio.create_task(batcher.send(part(), QueueName("q"), msgs("u1"), safe=False)),
        asyncio.create_task(batcher.send(part(), QueueName("q"), msgs("s1", dedupe=True), safe=True)),
        asyncio.create_task(batcher.send(part(), QueueName("q"), msgs("u2"), safe=False)),
        asyncio.create_task(batcher.send(part(), QueueName("q"), msgs("s2", dedupe=True), safe=True)),
    ]
    await leader.next_request(2)  # one lane each: both first sends go at once
    for request in list(leader.requests):
        request.answer.set_result(stored(request))
    await leader.next_request(4)
    for request in leader.requests[2:]:
        request.answer.set_result(stored(request))
    await asyncio.gather(*tasks)
    lanes = {(r.retry_unknown, tuple(m.body for m in r.messages)) for r in leader.requests}
    assert lanes == {(False, (b"u1",)), (True, (b"s1",)), (False, (b"u2",)), (True, (b"s2",))}


async def test_a_request_level_failure_reaches_every_caller_of_that_request_only() -> None:
    leader = FakeLeader()
    batcher = SendBatcher(leader, max_in_flight=1)
    first = asyncio.create_task(batcher.send(part(), QueueName("q"), msgs("a"), safe=False))
    r1 = await leader.next_request(1)
    waiting = [asyncio.create_task(batcher.send(part(), QueueName("q"), msgs(b), safe=False)) for b in "bc"]
    await settle()
    r1.answer.set_result(stored(r1))
    r2 = await leader.next_request(2)
    r2.answer.set_exception(QueueNotFound("gone"))
    assert isinstance((await first)[0], SendResult)
    for task in waiting:
        with pytest.raises(QueueNotFound):
            await task


async def test_a_malformed_entry_fails_only_its_caller() -> None:
    """The node refuses a whole request it cannot decode: the batch is sent again caller by
    caller, so only the caller with the bad entry gets the error, as it did alone."""
    leader = FakeLeader()
    batcher = SendBatcher(leader, max_in_flight=1)
    first = asyncio.create_task(batcher.send(part(), QueueName("q"), msgs("a"), safe=False))
    r1 = await leader.next_request(1)
    bad = [NewMessage(b"x", delay_s=cast(float, "soon"))]
    tasks = [
        asyncio.create_task(batcher.send(part(), QueueName("q"), msgs("b"), safe=False)),
        asyncio.create_task(batcher.send(part(), QueueName("q"), bad, safe=False)),
        asyncio.create_task(batcher.send(part(), QueueName("q"), msgs("c"), safe=False)),
    ]
    await settle()
    r1.answer.set_result(stored(r1))
    await first
    merged = await leader.next_request(2)
    merged.answer.set_exception(InvalidRequest("a message's delay_s must be a number"))
    for n in (3, 4, 5):  # each caller alone, in order
        alone = await leader.next_request(n)
        if any(m.delay_s is not None for m in alone.messages):
            alone.answer.set_exception(InvalidRequest("a message's delay_s must be a number"))
        else:
            alone.answer.set_result(stored(alone))
    assert [r.id for r in await tasks[0] if isinstance(r, SendResult)] == ["b"]
    with pytest.raises(InvalidRequest):
        await tasks[1]
    assert [r.id for r in await tasks[2] if isinstance(r, SendResult)] == ["c"]
    assert batcher.counters.split == 1


async def test_bounds_keep_callers_whole_and_the_waiting_queue_bounded() -> None:
    leader = FakeLeader()
    batcher = SendBatcher(leader, max_messages=4, max_waiting=3, max_in_flight=1)
    first = asyncio.create_task(batcher.send(part(), QueueName("q"), msgs("a"), safe=False))
    r1 = await leader.next_request(1)
    waiting = [
        asyncio.create_task(batcher.send(part(), QueueName("q"), msgs("b1", "b2", "b3"), safe=False)),
        asyncio.create_task(batcher.send(part(), QueueName("q"), msgs("c1", "c2"), safe=False)),
        asyncio.create_task(
            batcher.send(part(), QueueName("q"), msgs("d1", "d2", "d3", "d4", "d5"), safe=False)
        ),
    ]
    await settle()
    # A fourth waiter is one too many: it goes at once, on its own.
    bypass = asyncio.create_task(batcher.send(part(), QueueName("q"), msgs("e"), safe=False))
    r2 = await leader.next_request(2)
    assert [m.body for m in r2.messages] == [b"e"] and batcher.counters.bypassed == 1
    r2.answer.set_result(stored(r2))
    r1.answer.set_result(stored(r1))
    sizes = []
    for n in (3, 4, 5):
        request = await leader.next_request(n)
        sizes.append([m.body.decode() for m in request.messages])
        request.answer.set_result(stored(request))
    # b (3) and c (2) exceed 4 together: each its own request; d (5) is over alone, never split.
    assert sizes == [["b1", "b2", "b3"], ["c1", "c2"], ["d1", "d2", "d3", "d4", "d5"]]
    await asyncio.gather(first, bypass, *waiting)


async def test_a_cancelled_caller_does_not_break_the_others() -> None:
    leader = FakeLeader()
    batcher = SendBatcher(leader, max_in_flight=1)
    first = asyncio.create_task(batcher.send(part(), QueueName("q"), msgs("a"), safe=False))
    r1 = await leader.next_request(1)
    b, c, d = (asyncio.create_task(batcher.send(part(), QueueName("q"), msgs(x), safe=False)) for x in "bcd")
    await settle()
    c.cancel()  # cancelled while waiting: never sent
    first.cancel()  # the first caller's request is cancelled: the lane moves on
    await settle()
    r2 = await leader.next_request(2)
    assert [m.body for m in r2.messages] == [b"b", b"d"]
    d.cancel()  # cancelled while in flight: the request goes on for b
    await settle()
    r2.answer.set_result(stored(r2))
    assert [r.id for r in await b if isinstance(r, SendResult)] == ["b"]
    for task in (first, c, d):
        with pytest.raises(asyncio.CancelledError):
            await task
    assert r1.answer.cancelled()


async def test_partitions_are_batched_apart_and_disabled_means_one_request_per_send() -> None:
    leader = FakeLeader()
    batcher = SendBatcher(leader, max_in_flight=1)
    tasks = [
        asyncio.create_task(batcher.send(part(i), QueueName("q"), msgs(f"p{i}"), safe=False))
        for i in range(3)
    ]
    await leader.next_request(3)  # each partition's first send goes at once
    for request in leader.requests:
        request.answer.set_result(stored(request))
    await asyncio.gather(*tasks)
    off = SendBatcher(leader, enabled=False)
    tasks = [
        asyncio.create_task(off.send(part(), QueueName("q"), msgs(f"x{i}"), safe=False)) for i in range(3)
    ]
    await leader.next_request(6)
    for request in leader.requests[3:]:
        request.answer.set_result(stored(request))
    await asyncio.gather(*tasks)
    assert off.counters.requests == 3


async def test_with_two_in_flight_the_second_send_goes_at_once_and_the_rest_wait() -> None:
    leader = FakeLeader()
    batcher = SendBatcher(leader, max_in_flight=2)
    tasks = [
        asyncio.create_task(batcher.send(part(), QueueName("q"), msgs(f"m{i}"), safe=False)) for i in range(6)
    ]
    await leader.next_request(2)
    await settle()
    assert [[m.body for m in r.messages] for r in leader.requests] == [[b"m0"], [b"m1"]]
    leader.requests[1].answer.set_result(stored(leader.requests[1]))  # the second returns first
    r3 = await leader.next_request(3)
    assert [m.body for m in r3.messages] == [b"m2", b"m3", b"m4", b"m5"]  # all that waited, in order
    leader.requests[0].answer.set_result(stored(leader.requests[0]))
    r3.answer.set_result(stored(r3))
    seqs = [0, 0, 0, 1, 2, 3]  # the fake numbers each request's entries from 0
    assert [(await t)[0] for t in tasks] == [SendResult(MessageId(f"m{i}"), seqs[i]) for i in range(6)]
    await settle()
    assert len(leader.requests) == 3 and not batcher._lanes


def pooled(queue: str) -> PartitionInfo:
    """Pool partition 7 as a queue placed on it sees it (partition_map.bind_to_queue)."""
    return PartitionInfo(7, TenantId("t"), QueueName(queue), 0, ("n0",), "n0", "sync", placed=True)


def sent_each(request: Request) -> list[Results]:
    """What a node answers to ``send_queues``: per entry, a result per message."""
    return [[SendResult(MessageId(m.body.decode()), i) for i, m in enumerate(ms)] for _, ms in request.sends]


async def test_sends_to_queues_sharing_a_pool_partition_go_as_one_request() -> None:
    leader = FakeLeader()
    batcher = SendBatcher(leader, max_in_flight=1)
    first = asyncio.create_task(batcher.send(pooled("a"), QueueName("a"), msgs("a1"), safe=False))
    r1 = await leader.next_request(1)
    assert (r1.op, r1.queue) == ("send", "a")  # a lone send goes at once, as before
    later = [
        asyncio.create_task(batcher.send(pooled(q), QueueName(q), msgs(f"{q}{n}", f"{q}{n}x"), safe=False))
        for q, n in (("b", 1), ("c", 1), ("b", 2))
    ]
    await settle()
    assert len(leader.requests) == 1
    r1.answer.set_result(stored(r1))
    await first
    r2 = await leader.next_request(2)
    assert r2.op == "send_queues" and r2.part.id == 7
    # A caller's entries are one entry of the request, callers in arrival order.
    assert [(q, [m.body.decode() for m in ms]) for q, ms in r2.sends] == [
        ("b", ["b1", "b1x"]), ("c", ["c1", "c1x"]), ("b", ["b2", "b2x"])
    ]  # fmt: skip
    r2.answer.set_result(sent_each(r2))
    for task, (q, n) in zip(later, (("b", 1), ("c", 1), ("b", 2)), strict=True):
        assert [r.id for r in await task if isinstance(r, SendResult)] == [f"{q}{n}", f"{q}{n}x"]
    c = batcher.counters
    assert (c.requests, c.merged, c.queues, c.alone) == (2, 1, 1, 0)
    # Callers of one queue alone go as a plain send, as before.
    await settle()
    assert batcher._lanes == {}


async def behind_a_first_send(
    leader: FakeLeader, batcher: SendBatcher, sends: list[tuple[str, str]], *, safe: bool
) -> tuple[list[asyncio.Task[Any]], Request]:
    """Queue ``a``'s send in flight, then ``sends`` (queue, body) of the same pool partition
    waiting behind it; ``a``'s answered: the callers and the request they make next."""
    first = asyncio.create_task(batcher.send(pooled("a"), QueueName("a"), msgs("a1"), safe=safe))
    r1 = await leader.next_request(1)
    later = [
        asyncio.create_task(batcher.send(pooled(q), QueueName(q), msgs(body), safe=safe)) for q, body in sends
    ]
    await settle()
    r1.answer.set_result(stored(r1))
    await first
    return later, await leader.next_request(2)


async def test_a_queue_refused_in_a_request_of_several_is_sent_again_alone() -> None:
    leader = FakeLeader()
    batcher = SendBatcher(leader, max_in_flight=1)
    (b, new), r2 = await behind_a_first_send(leader, batcher, [("b", "b1"), ("new", "n1")], safe=False)
    assert r2.op == "send_queues"
    # The leader has no queue "new" yet (its record not applied there, or deleted).
    r2.answer.set_result([sent_each(r2)[0], QueueNotFound("queue 'new' does not exist")])
    assert [r.id for r in await b if isinstance(r, SendResult)] == ["b1"]
    r3 = await leader.next_request(3)
    assert (r3.op, r3.queue, [m.body for m in r3.messages]) == ("send", "new", [b"n1"])
    r3.answer.set_result(stored(r3))
    assert [r.id for r in await new if isinstance(r, SendResult)] == ["n1"]
    assert batcher.counters.alone == 1


async def test_a_node_that_predates_send_queues_gets_each_caller_alone() -> None:
    leader = FakeLeader()
    batcher = SendBatcher(leader, max_in_flight=1)
    later, r2 = await behind_a_first_send(leader, batcher, [("b", "b1"), ("c", "c1")], safe=True)
    assert r2.op == "send_queues" and r2.retry_unknown
    r2.answer.set_exception(InvalidRequest("unknown operation 'send_queues'"))
    for n, q in enumerate("bc", start=3):
        alone = await leader.next_request(n)
        assert (alone.op, alone.queue, alone.retry_unknown) == ("send", q, True)
        alone.answer.set_result(stored(alone))
    for task, q in zip(later, "bc", strict=True):
        assert [r.id for r in await task if isinstance(r, SendResult)] == [f"{q}1"]
    assert batcher.counters.split == 1


async def test_a_refused_callers_lone_send_does_not_hold_the_partitions_other_queues() -> None:
    # A new queue's lone send may wait for the leader to apply it; the pool partition's
    # other queues go on meanwhile.
    leader = FakeLeader()
    batcher = SendBatcher(leader, max_in_flight=1)
    (b, new), r2 = await behind_a_first_send(leader, batcher, [("b", "b1"), ("new", "n1")], safe=False)
    r2.answer.set_result([sent_each(r2)[0], QueueNotFound("not applied yet")])
    await b
    r3 = await leader.next_request(3)
    assert (r3.op, r3.queue) == ("send", "new")  # alone, and not answered yet
    c = asyncio.create_task(batcher.send(pooled("c"), QueueName("c"), msgs("c1"), safe=False))
    r4 = await leader.next_request(4)
    assert (r4.op, r4.queue) == ("send", "c") and not new.done()
    r4.answer.set_result(stored(r4))
    assert [r.id for r in await c if isinstance(r, SendResult)] == ["c1"]
    r3.answer.set_result(stored(r3))
    assert [r.id for r in await new if isinstance(r, SendResult)] == ["n1"]


def _send(batcher: SendBatcher, body: str) -> asyncio.Task[Results]:
    return asyncio.create_task(batcher.send(part(), QueueName("q"), msgs(body), safe=False))


async def _merge_once(batcher: SendBatcher, leader: FakeLeader) -> None:
    """One request in flight and two callers behind it, which go as one merged request."""
    first = _send(batcher, "a")
    r1 = await leader.next_request(len(leader.requests) + 1)
    behind = [_send(batcher, b) for b in "bc"]
    await settle()
    r1.answer.set_result(stored(r1))
    r2 = await leader.next_request(len(leader.requests) + 1)
    assert [m.body for m in r2.messages] == [b"b", b"c"]
    r2.answer.set_result(stored(r2))
    await asyncio.gather(first, *behind)


async def _busy_lane() -> tuple[list[float], FakeLeader, SendBatcher]:
    """A batcher lingering 50 ms, on a clock the test moves, whose lane just merged a request."""
    now = [100.0]
    leader = FakeLeader()
    batcher = SendBatcher(leader, max_in_flight=1, linger_s=0.05, clock=lambda: now[0])
    await _merge_once(batcher, leader)
    return now, leader, batcher


async def test_a_lone_sender_never_lingers() -> None:
    """One send at a time, however long the linger: each request leaves as its send is called."""
    leader = FakeLeader()
    batcher = SendBatcher(leader, max_in_flight=1, linger_s=30.0)
    for n in range(1, 4):
        task = _send(batcher, f"m{n}")
        request = await asyncio.wait_for(leader.next_request(n), 1.0)
        request.answer.set_result(stored(request))
        await task
    assert batcher.counters.lingered == 0 and batcher.counters.requests == 3


async def test_once_a_lane_merged_a_send_finding_it_free_waits_for_others() -> None:
    """After a merged request, the next send to find the lane free lingers: sends called
    meanwhile go with it as one request; one that lingered alone ends the lingering."""
    _, leader, batcher = await _busy_lane()
    d = _send(batcher, "d")
    await settle()
    assert len(leader.requests) == 2  # d lingers
    e = _send(batcher, "e")
    r3 = await asyncio.wait_for(leader.next_request(3), 1.0)
    assert [m.body for m in r3.messages] == [b"d", b"e"]  # one request, in arrival order
    r3.answer.set_result(stored(r3))
    assert [r.id for r in await d if isinstance(r, SendResult)] == ["d"]
    assert [r.id for r in await e if isinstance(r, SendResult)] == ["e"]
    # Lingering alone: one request of one caller, after which the next goes at once.
    f = _send(batcher, "f")
    r4 = await asyncio.wait_for(leader.next_request(4), 1.0)
    r4.answer.set_result(stored(r4))
    await f
    g = _send(batcher, "g")
    await settle()
    assert len(leader.requests) == 5  # at once
    leader.requests[4].answer.set_result(stored(leader.requests[4]))
    await g
    assert batcher.counters.lingered == 2


async def test_a_lane_that_merged_long_ago_does_not_linger_and_a_cancelled_lingerer_sends_nothing() -> None:
    now, leader, batcher = await _busy_lane()
    # Cancelled while it lingers: nothing is sent for it, and the lane is free again.
    lingering = _send(batcher, "x")
    await settle()
    lingering.cancel()
    # The lane's task ends its linger, finds nobody waiting and frees the lane.
    await asyncio.wait_for(asyncio.gather(*batcher._drains), 1.0)
    assert len(leader.requests) == 2 and batcher.counters.lingered == 1
    assert not batcher._lanes
    now[0] += 2.0  # past the busy window: the lane sends at once again
    h = _send(batcher, "h")
    await settle()
    assert len(leader.requests) == 3
    leader.requests[2].answer.set_result(stored(leader.requests[2]))
    await h
    assert batcher.counters.lingered == 1


def test_the_linger_is_a_cluster_url_option() -> None:
    from backend_store.cluster.client.cluster_settings import ClusterSettings, parse_cluster_url

    assert ClusterSettings().send_linger_s == 0.005
    _, settings = parse_cluster_url("cluster://127.0.0.1:2379?send_linger_s=0")
    assert settings.send_linger_s == 0.0
