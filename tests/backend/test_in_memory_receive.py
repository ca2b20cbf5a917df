"""Receives held in memory (``InMemoryReceive``): what push subscriptions are handed.

A first delivery is held like any received message (other receives skip it, its receipt
acks, nacks and changes visibility), but nothing is written for it until it is acked, or
ends unacked (then its count is written): after a restart it is visible at once.
The counting rules and many held messages: ``test_held_receives.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from backend_store import Backend, ReceivedMessage
from backend_store.backend import StandingReceive
from backend_store.errors import InvalidReceipt
from backend_store.lmdb_store.holds import Holds
from backend_store.lmdb_store.records import DeliveryState

from ..conftest import ManualClock
from .harness import T1, StoreFactory, in_memory, msg, ok, q, receive_all


async def test_a_held_message_is_skipped_by_others_and_its_ack_deletes_it(
    store: Backend, clock: ManualClock
) -> None:
    await store.create_queue(T1, q("jobs"), {"visibility_timeout_s": 30})
    sent = [ok(r) for r in await store.send(T1, q("jobs"), [msg("a"), msg("b"), msg("c")])]
    held = await in_memory(store).receive_in_memory(T1, q("jobs"), 2)
    assert [(m.id, m.body, m.receive_count) for m in held] == [
        (sent[0].id, b"a", 1),
        (sent[1].id, b"b", 1),
    ]
    assert held[0].visible_at == clock.now + 30
    # Held: neither a plain receive nor another in-memory one gets them.
    assert [m.body for m in await store.receive(T1, q("jobs"), 10)] == [b"c"]
    assert await in_memory(store).receive_in_memory(T1, q("jobs"), 10) == []
    result = await store.ack(T1, [m.receipt for m in held], queue=q("jobs"))
    assert (result.acked, result.failed) == (2, [])
    stats = (await store.get_queue(T1, q("jobs"))).stats
    assert stats.acked_total == 2
    # Acked once: the receipt is spent.
    again = await store.ack(T1, [held[0].receipt])
    assert [f.code for f in again.failed] == ["invalid_receipt"]


async def test_a_hold_ends_with_its_visibility_timeout(store: Backend, clock: ManualClock) -> None:
    await store.create_queue(T1, q("jobs"), {"visibility_timeout_s": 30})
    await store.send(T1, q("jobs"), [msg("a")])
    [held] = await in_memory(store).receive_in_memory(T1, q("jobs"), 1, visibility_timeout_s=10)
    clock.advance(9.5)
    assert await store.receive(T1, q("jobs"), 1) == []
    stats = (await store.get_queue(T1, q("jobs"))).stats
    assert (stats.visible, stats.in_flight) == (0, 1)
    clock.advance(1)
    # Receivable again, so counted visible, before any receive ends the hold.
    stats = (await store.get_queue(T1, q("jobs"))).stats
    assert (stats.visible, stats.in_flight) == (1, 0)
    [again] = await store.receive(T1, q("jobs"), 1)
    # Nothing was written for the in-memory receive, but it counts (written when it ended).
    assert (again.id, again.receive_count) == (held.id, 2)
    with pytest.raises(InvalidReceipt):
        await store.change_visibility(T1, q("jobs"), held.receipt, 5)
    assert [f.code for f in (await store.ack(T1, [held.receipt])).failed] == ["invalid_receipt"]
    assert (await store.ack(T1, [again.receipt])).acked == 1


async def test_releasing_a_hold_makes_it_visible_at_once_or_after_its_delay(
    store: Backend, clock: ManualClock
) -> None:
    await store.create_queue(T1, q("jobs"), {"visibility_timeout_s": 30})
    await store.send(T1, q("jobs"), [msg("a"), msg("b")])
    first, second = await in_memory(store).receive_in_memory(T1, q("jobs"), 2)
    assert (await store.nack(T1, [first.receipt])).acked == 1
    assert (await store.nack(T1, [second.receipt], delay_s=20)).acked == 1
    [a] = await store.receive(T1, q("jobs"), 10)
    assert (a.body, a.receive_count) == (b"a", 2)
    clock.advance(19.5)
    assert await store.receive(T1, q("jobs"), 10) == []
    clock.advance(1)
    [b] = await store.receive(T1, q("jobs"), 10)
    assert (b.body, b.receive_count) == (b"b", 2)


async def test_change_visibility_moves_a_hold(store: Backend, clock: ManualClock) -> None:
    await store.create_queue(T1, q("jobs"), {"visibility_timeout_s": 30})
    await store.send(T1, q("jobs"), [msg("a"), msg("b")])
    first, second = await in_memory(store).receive_in_memory(T1, q("jobs"), 2)
    await store.change_visibility(T1, q("jobs"), first.receipt, 100)
    await store.change_visibility(T1, q("jobs"), second.receipt, 0)
    assert [m.body for m in await store.receive(T1, q("jobs"), 10, visibility_timeout_s=200)] == [b"b"]
    clock.advance(99.5)
    assert await store.receive(T1, q("jobs"), 10) == []
    assert (await store.ack(T1, [first.receipt])).acked == 1


async def test_a_held_fifo_head_blocks_its_group_until_acked(store: Backend) -> None:
    await store.create_queue(T1, q("f"), {"ordering": "fifo"})
    await store.send(T1, q("f"), [msg("a0", group_id="a"), msg("a1", group_id="a"), msg("b0", group_id="b")])
    held = await in_memory(store).receive_in_memory(T1, q("f"), 10)
    assert [m.body for m in held] == [b"a0", b"b0"]
    assert await store.receive(T1, q("f"), 10) == []
    assert (await store.ack(T1, [held[0].receipt])).acked == 1
    assert [m.body for m in await store.receive(T1, q("f"), 10)] == [b"a1"]


async def test_held_messages_are_visible_at_once_after_a_restart(
    store_factory: StoreFactory, clock: ManualClock
) -> None:
    store = await store_factory.open()
    await store.create_queue(T1, q("jobs"), {"visibility_timeout_s": 300})
    await store.send(T1, q("jobs"), [msg("a"), msg("b")])
    [stored] = await store.receive(T1, q("jobs"), 1)
    [held] = await in_memory(store).receive_in_memory(T1, q("jobs"), 1)
    assert (stored.body, held.body) == (b"a", b"b")

    store = await store_factory.reopen(store)
    # The written receive is still in flight; the held one is visible at once. A clean close
    # wrote its count (a crash would not have: test_crash.py).
    [back] = await receive_all(store, T1, "jobs")
    assert (back.id, back.receive_count) == (held.id, 2)
    assert [f.code for f in (await store.ack(T1, [held.receipt])).failed] == ["invalid_receipt"]
    assert (await store.ack(T1, [stored.receipt, back.receipt])).acked == 2


async def test_a_standing_demand_can_hold_in_memory(store_factory: StoreFactory) -> None:
    store = await store_factory.open()
    assert isinstance(store, StandingReceive)
    await store.create_queue(T1, q("jobs"), {"visibility_timeout_s": 300})
    got: asyncio.Queue[list[ReceivedMessage]] = asyncio.Queue()
    store.set_demand(T1, q("jobs"), 5, None, got.put_nowait, in_memory=True)
    await store.send(T1, q("jobs"), [msg("a")])
    [held] = await asyncio.wait_for(got.get(), 5)
    assert await store.receive(T1, q("jobs"), 10) == []

    store = await store_factory.reopen(store)
    [back] = await store.receive(T1, q("jobs"), 10)
    assert (back.id, back.receive_count) == (held.id, 2)


def test_holds_undo_their_changes_when_the_batch_aborts() -> None:
    holds = Holds()
    state = DeliveryState(sent_at=0.0, group_id=None, visible_ms=5)
    committed: list[Callable[[], object]] = []
    queue = holds.watch(1, committed, create=True)
    assert queue is not None
    holds.hold_first(queue, 7, (b"t1", 1_000, state), committed)
    holds.hold_first(queue, 9, (b"t4", 1_000, state), committed)
    aborted: list[Callable[[], object]] = []
    holds.extend(1, 7, (b"t1", 2_000, state), aborted)  # a moved hold
    holds.hold_first(queue, 8, (b"t3", 2_000, state), aborted)  # a new one
    assert holds.end(1, 9, aborted, receivable=True) == (b"t4", 1_000, state)  # nacked
    assert holds.end(2, 9, aborted, receivable=True) is None  # nothing to end: nothing to undo
    assert holds.held_count(1, 0) == 2
    assert len(aborted) == 1  # one rollback for the whole batch
    for undo in reversed(aborted):
        undo()
    assert holds.get(1, 7) == (b"t1", 1_000, state)
    assert holds.get(1, 8) is None
    assert holds.get(1, 9) == (b"t4", 1_000, state)
    assert holds.expire(1, 999, []) == []
    assert holds.held_count(1, 999) == 2
    # At their end the two are receivable again (not counted), before anything expires them.
    assert holds.held_count(1, 1_000) == 0
    # Expired holds end and are returned (their counts are the caller's to write).
    assert sorted(seq for seq, _ in holds.expire(1, 1_000, [])) == [7, 9]
    assert len(holds) == 0
