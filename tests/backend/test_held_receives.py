"""Receives held in memory: the counting rules, the cap, and many messages in flight.

docs/store.md, "Receives held in memory": only a first delivery is held; every delivery
counts (a held one's count is written when it ends unacked), so ``receive_count`` goes 1, 2,
3... and ``max_receives`` dead-letters a message consumers keep failing on exactly as with
written receives; at most ``max_held`` messages per queue are held. A crash loses the counts
of the deliveries held at that moment (``test_crash.py``).
"""

from __future__ import annotations

import pytest

from backend_store import Backend, ReceivedMessage
from backend_store.errors import InvalidReceipt
from backend_store.lmdb_store import queue_ops
from backend_store.lmdb_store.engine import LmdbBackend
from backend_store.lmdb_store.environment import View
from backend_store.lmdb_store.visibility import load_state

from ..conftest import ManualClock
from .harness import T1, StoreFactory, in_memory, msg, ok, q


async def test_redeliveries_count_up_and_dead_letter_after_max_receives(
    store: Backend, clock: ManualClock
) -> None:
    """A consumer-failure loop through every way a delivery ends unacked (nack, visibility
    timeout, visibility changed to 0) still ends in the dead-letter queue."""
    await store.create_queue(T1, q("dlq"), {})
    await store.create_queue(
        T1, q("jobs"), {"visibility_timeout_s": 10, "max_receives": 4, "dead_letter_queue": "dlq"}
    )
    sent = ok((await store.send(T1, q("jobs"), [msg("poison")]))[0])
    counts = []
    for end in ("nack", "timeout", "zero", "nack"):
        [got] = await in_memory(store).receive_in_memory(T1, q("jobs"), 10)
        counts.append(got.receive_count)
        if end == "nack":
            assert (await store.nack(T1, [got.receipt])).acked == 1
        elif end == "timeout":
            clock.advance(10.5)
        else:
            await store.change_visibility(T1, q("jobs"), got.receipt, 0)
    assert counts == [1, 2, 3, 4]
    # A fifth delivery would pass max_receives: moved instead.
    assert await in_memory(store).receive_in_memory(T1, q("jobs"), 10) == []
    stats = (await store.get_queue(T1, q("jobs"))).stats
    assert (stats.visible, stats.in_flight, stats.dead_lettered_total) == (0, 0, 1)
    [dead] = await store.receive(T1, q("dlq"), 10)
    assert (dead.id, dead.receive_count) == (sent.id, 1)


async def test_a_held_first_delivery_counts_toward_max_receives_of_one(
    store: Backend, clock: ManualClock
) -> None:
    await store.create_queue(T1, q("dlq"), {})
    await store.create_queue(
        T1, q("jobs"), {"visibility_timeout_s": 5, "max_receives": 1, "dead_letter_queue": "dlq"}
    )
    await store.send(T1, q("jobs"), [msg("a")])
    [first] = await in_memory(store).receive_in_memory(T1, q("jobs"), 1)
    assert first.receive_count == 1
    clock.advance(6)
    # Its one delivery was held (nothing written) and still counts: a plain receive moves it.
    assert await store.receive(T1, q("jobs"), 10) == []
    assert [m.body for m in await store.receive(T1, q("dlq"), 10)] == [b"a"]


async def test_only_first_deliveries_are_held_and_a_redelivery_writes_the_count(
    store_factory: StoreFactory, clock: ManualClock
) -> None:
    store = await store_factory.open()
    await store.create_queue(T1, q("jobs"), {"visibility_timeout_s": 300})
    await store.send(T1, q("jobs"), [msg("a")])
    [first] = await in_memory(store).receive_in_memory(T1, q("jobs"), 1)
    assert (await store.nack(T1, [first.receipt])).acked == 1
    [second] = await in_memory(store).receive_in_memory(T1, q("jobs"), 1)
    assert second.receive_count == 2
    # The redelivery was written, with the first delivery's count: it survives a restart
    # still in flight, and its receipt still works.
    store = await store_factory.reopen(store)
    assert await store.receive(T1, q("jobs"), 10) == []
    assert (await store.nack(T1, [second.receipt])).acked == 1
    [third] = await store.receive(T1, q("jobs"), 10)
    assert third.receive_count == 3


async def test_a_stale_receipt_never_settles_the_redelivery(store: Backend, clock: ManualClock) -> None:
    await store.create_queue(T1, q("jobs"), {"visibility_timeout_s": 10})
    await store.send(T1, q("jobs"), [msg("a")])
    [first] = await in_memory(store).receive_in_memory(T1, q("jobs"), 1)
    clock.advance(11)
    [second] = await in_memory(store).receive_in_memory(T1, q("jobs"), 1)
    assert second.id == first.id and second.receipt != first.receipt
    assert [f.code for f in (await store.ack(T1, [first.receipt])).failed] == ["invalid_receipt"]
    assert [f.code for f in (await store.nack(T1, [first.receipt])).failed] == ["invalid_receipt"]
    with pytest.raises(InvalidReceipt):
        await store.change_visibility(T1, q("jobs"), first.receipt, 0)
    assert await store.receive(T1, q("jobs"), 10) == []  # still the second's
    assert (await store.ack(T1, [second.receipt])).acked == 1


async def stored_counts(store: Backend, queue: str, messages: list[ReceivedMessage]) -> list[int | None]:
    """The receive counts on disk (what a crash would leave), by reading the store's records."""
    assert isinstance(store, LmdbBackend)

    def read(v: View) -> list[int | None]:
        qid = queue_ops.find_queue(v, T1, queue).qid
        states = [load_state(v, qid, m.seq) for m in messages]
        return [None if state is None else state.receive_count for state in states]

    return await store._read(read)


async def test_a_held_delivery_that_ends_unacked_has_its_count_written(
    store: Backend, clock: ManualClock
) -> None:
    """Nack, visibility changed to 0, nack with a delay, visibility timeout: each writes the
    ended delivery's count then, so a crash afterwards loses none of them."""
    await store.create_queue(T1, q("jobs"), {"visibility_timeout_s": 300})
    await store.send(T1, q("jobs"), [msg("a"), msg("b"), msg("c"), msg("d")])
    got = await in_memory(store).receive_in_memory(T1, q("jobs"), 4, visibility_timeout_s=1)
    assert await stored_counts(store, "jobs", got) == [0, 0, 0, 0]  # held: nothing written
    assert (await store.nack(T1, [got[0].receipt])).acked == 1
    await store.change_visibility(T1, q("jobs"), got[1].receipt, 0)
    assert (await store.nack(T1, [got[2].receipt], delay_s=5)).acked == 1
    assert await stored_counts(store, "jobs", got) == [1, 1, 1, 0]
    clock.advance(2)  # "d"'s visibility timeout ends: the next receive notices and writes it
    again = await store.receive(T1, q("jobs"), 10)
    assert [(m.body, m.receive_count) for m in again] == [(b"a", 2), (b"b", 2), (b"d", 2)]
    assert await stored_counts(store, "jobs", got) == [2, 2, 1, 2]


async def test_at_most_max_held_per_queue_are_held_the_rest_are_written(
    store_factory: StoreFactory, clock: ManualClock
) -> None:
    store = await store_factory.open(max_held=3)
    await store.create_queue(T1, q("jobs"), {"visibility_timeout_s": 300})
    await store.send(T1, q("jobs"), [msg(str(i)) for i in range(5)])
    got = await in_memory(store).receive_in_memory(T1, q("jobs"), 10)
    assert [m.body for m in got] == [b"0", b"1", b"2", b"3", b"4"]
    stats = (await store.get_queue(T1, q("jobs"))).stats
    assert (stats.visible, stats.in_flight) == (0, 5)
    store = await store_factory.reopen(store, max_held=3)
    # The three held ones are visible at once; the two written ones are still in flight.
    back = await store.receive(T1, q("jobs"), 10)
    assert sorted(m.body for m in back) == [b"0", b"1", b"2"]
    assert (await store.ack(T1, [got[3].receipt, got[4].receipt])).acked == 2


async def test_every_call_that_answers_stats_counts_held_messages_in_flight(
    store_factory: StoreFactory,
) -> None:
    store = await store_factory.open()
    await store.create_queue(T1, q("jobs"), {"visibility_timeout_s": 300})
    await store.send(T1, q("jobs"), [msg(str(i)) for i in range(3)])
    await in_memory(store).receive_in_memory(T1, q("jobs"), 2)
    answers = {
        "get_queue": await store.get_queue(T1, q("jobs")),
        "list_queues": next(i for i in await store.list_queues(T1) if i.name == "jobs"),
        "create_queue (exists)": (await store.create_queue(T1, q("jobs"), {"visibility_timeout_s": 300}))[0],
        "update_queue": await store.update_queue(T1, q("jobs"), {"delay_s": 0}),
    }
    for call, answer in answers.items():
        assert (answer.stats.visible, answer.stats.in_flight) == (1, 2), call


async def test_many_in_flight_each_receive_gets_the_next_and_releases_come_back_in_order(
    store: Backend, clock: ManualClock
) -> None:
    """Thousands in flight at once: past the per-queue cap receives are written; a receive
    starts past the run of held messages (the skip hint), and a message released from the
    middle of that run is the next one handed out, in visibility order."""
    total = 3000
    await store.create_queue(T1, q("jobs"), {"visibility_timeout_s": 300})
    for start in range(0, total, 500):
        await store.send(T1, q("jobs"), [msg(f"{i:05d}") for i in range(start, start + 500)])
    got: list[ReceivedMessage] = []
    while batch := await in_memory(store).receive_in_memory(T1, q("jobs"), 100):
        got.extend(batch)
    assert [m.body for m in got] == [f"{i:05d}".encode() for i in range(total)]
    assert all(m.receive_count == 1 for m in got)
    stats = (await store.get_queue(T1, q("jobs"))).stats
    assert (stats.visible, stats.in_flight) == (0, total)
    # Release three from the middle of the held run (and one written), out of order.
    released = [got[700], got[10], got[400], got[2000]]
    assert (await store.nack(T1, [m.receipt for m in released])).acked == 4
    again = await in_memory(store).receive_in_memory(T1, q("jobs"), 100)
    assert [(m.body, m.receive_count) for m in again] == [
        (b"00010", 2),
        (b"00400", 2),
        (b"00700", 2),
        (b"02000", 2),
    ]
    # Acks of the held ones in any order; the queue empties.
    rest = [m for m in got if m.id not in {r.id for r in released}] + again
    for start in range(0, len(rest), 250):
        assert (await store.ack(T1, [m.receipt for m in rest[start : start + 250]])).acked == len(
            rest[start : start + 250]
        )
    stats = (await store.get_queue(T1, q("jobs"))).stats
    assert (stats.visible, stats.in_flight, stats.acked_total) == (0, 0, total)


async def test_a_fifo_head_promoted_behind_the_held_run_is_received(
    store: Backend, clock: ManualClock
) -> None:
    """All in one millisecond (the clock stands still): acking a held head promotes the
    next of its group to an entry below the skip hint; the next receive must find it."""
    await store.create_queue(T1, q("f"), {"ordering": "fifo", "visibility_timeout_s": 300})
    await store.send(T1, q("f"), [msg("a0", group_id="a"), msg("a1", group_id="a"), msg("b0", group_id="b")])
    first = await in_memory(store).receive_in_memory(T1, q("f"), 10)
    assert [m.body for m in first] == [b"a0", b"b0"]
    assert (await store.ack(T1, [first[0].receipt])).acked == 1
    [nxt] = await in_memory(store).receive_in_memory(T1, q("f"), 10)
    assert (nxt.body, nxt.receive_count) == (b"a1", 1)
    # A released held head is redelivered before the rest of its group.
    assert (await store.nack(T1, [nxt.receipt])).acked == 1
    [same] = await in_memory(store).receive_in_memory(T1, q("f"), 10)
    assert (same.body, same.receive_count) == (b"a1", 2)


async def test_a_zero_visibility_receive_is_not_taken_twice_in_one_call(
    store: Backend, clock: ManualClock
) -> None:
    await store.create_queue(T1, q("jobs"), {"visibility_timeout_s": 300})
    await store.send(T1, q("jobs"), [msg("a"), msg("b")])
    await in_memory(store).receive_in_memory(T1, q("jobs"), 1)  # "a" held
    # Redeliveries are written; with a zero timeout each is visible again at once, but one
    # call hands each message out once, and the next call finds them again.
    clock.advance(301)
    got = await in_memory(store).receive_in_memory(T1, q("jobs"), 10, visibility_timeout_s=0)
    assert sorted(m.body for m in got) == [b"a", b"b"]
    again = await store.receive(T1, q("jobs"), 10)
    assert sorted(m.body for m in again) == [b"a", b"b"]


async def test_next_visible_at_counts_the_end_of_a_hold(store: Backend, clock: ManualClock) -> None:
    """A long-poll waiter wakes when a held message's visibility timeout ends."""
    await store.create_queue(T1, q("jobs"), {"visibility_timeout_s": 300})
    await store.send(T1, q("jobs"), [msg("a")])
    [got] = await in_memory(store).receive_in_memory(T1, q("jobs"), 1, visibility_timeout_s=20)
    assert await store.next_visible_at(T1, q("jobs")) == clock.now + 20
    await store.ack(T1, [got.receipt])
    assert await store.next_visible_at(T1, q("jobs")) is None
