"""The Backend contract: Send, receive, ack, nack, visibility, delays, retention and size limits.

Run against every backend kind (see conftest.py). Semantics follow docs/api.md and, where it is
silent, Amazon SQS. Time-based behaviour moves the injected ManualClock; nothing sleeps.
"""

from __future__ import annotations

import asyncio

import pytest

from backend_store import Backend, SendResult
from backend_store.errors import (
    InvalidReceipt,
    InvalidRequest,
    MessageTooLarge,
    QueueFull,
    QueueNotFound,
)

from ..conftest import ManualClock, wait_for
from .harness import T1, T2, msg, ok, q, receive_all, send_one

# ---------------------------------------------------------------------------
# Send and receive
# ---------------------------------------------------------------------------


async def test_send_and_receive_round_trip(store: Backend, clock: ManualClock) -> None:
    await store.create_queue(T1, q("orders"), {"visibility_timeout_s": 30})
    sent = await send_one(
        store, T1, "orders", b"\x00\xffbinary", is_text=False, attributes={"k": "v", "x": "y"}
    )
    assert sent.duplicate is False
    clock.advance(2)

    [got] = await store.receive(T1, q("orders"), 10)
    assert got.queue == "orders"
    assert (got.id, got.seq) == (sent.id, sent.seq)
    assert got.body == b"\x00\xffbinary"
    assert got.is_text is False
    assert got.attributes == {"k": "v", "x": "y"}
    assert got.group_id is None
    assert got.sent_at == clock.now - 2
    assert got.receive_count == 1
    assert got.visible_at == clock.now + 30
    assert got.receipt


async def test_send_to_missing_queue_raises_for_the_whole_call(store: Backend) -> None:
    with pytest.raises(QueueNotFound):
        await store.send(T1, q("missing"), [msg("a"), msg("b")])
    await store.create_queue(T2, q("elsewhere"), {})
    with pytest.raises(QueueNotFound):
        await store.send(T1, q("elsewhere"), [msg("a")])


async def test_batch_send_gives_one_result_per_entry_in_order(store: Backend) -> None:
    await store.create_queue(T1, q("orders"), {})
    results = [ok(r) for r in await store.send(T1, q("orders"), [msg(f"m{i}") for i in range(10)])]
    assert len({r.id for r in results}) == 10
    seqs = [r.seq for r in results]
    assert seqs == sorted(seqs) and len(set(seqs)) == 10
    got = await store.receive(T1, q("orders"), 100)
    assert [m.body for m in got] == [f"m{i}".encode() for i in range(10)]
    assert [m.id for m in got] == [r.id for r in results]


async def test_ids_and_seqs_are_unique_across_concurrent_sends(store: Backend) -> None:
    await store.create_queue(T1, q("orders"), {})

    async def producer(p: int) -> list[SendResult]:
        out = []
        for i in range(20):
            out.append(await send_one(store, T1, "orders", f"{p}-{i}"))
        return out

    results = [r for rs in await asyncio.gather(*(producer(p) for p in range(8))) for r in rs]
    assert len({r.id for r in results}) == 160
    assert len({r.seq for r in results}) == 160
    got = await receive_all(store, T1, "orders")
    assert sorted(m.body for m in got) == sorted(f"{p}-{i}".encode() for p in range(8) for i in range(20))
    # Each producer's own messages come out in the order it sent them.
    for p in range(8):
        mine = [m.body for m in got if m.body.startswith(f"{p}-".encode())]
        assert mine == [f"{p}-{i}".encode() for i in range(20)]


async def test_receive_respects_max_and_best_effort_order(store: Backend) -> None:
    await store.create_queue(T1, q("orders"), {})
    await store.send(T1, q("orders"), [msg(f"m{i}") for i in range(5)])
    first = await store.receive(T1, q("orders"), 2)
    assert [m.body for m in first] == [b"m0", b"m1"]
    rest = await store.receive(T1, q("orders"), 10)
    assert [m.body for m in rest] == [b"m2", b"m3", b"m4"]
    assert await store.receive(T1, q("orders"), 10) == []


@pytest.mark.parametrize(
    ("max_messages", "timeout"), [(0, None), (-1, None), (1, -1), (1, 43201)], ids=lambda v: repr(v)
)
async def test_receive_validates_its_arguments(
    store: Backend, max_messages: int, timeout: float | None
) -> None:
    await store.create_queue(T1, q("orders"), {})
    await send_one(store, T1, "orders", "a")
    with pytest.raises(InvalidRequest):
        await store.receive(T1, q("orders"), max_messages, visibility_timeout_s=timeout)
    assert (await store.get_queue(T1, q("orders"))).stats.visible == 1


async def test_nack_validates_its_delay(store: Backend) -> None:
    await store.create_queue(T1, q("orders"), {})
    await send_one(store, T1, "orders", "a")
    [got] = await store.receive(T1, q("orders"), 1)
    with pytest.raises(InvalidRequest):
        await store.nack(T1, [got.receipt], delay_s=-1)
    assert (await store.ack(T1, [got.receipt])).acked == 1


async def test_receive_from_missing_queue_raises(store: Backend) -> None:
    with pytest.raises(QueueNotFound):
        await store.receive(T1, q("missing"), 1)


async def test_ack_nack_and_visibility_on_a_missing_queue_raise(store: Backend) -> None:
    await store.create_queue(T1, q("orders"), {})
    await send_one(store, T1, "orders", "a")
    [got] = await store.receive(T1, q("orders"), 1)
    with pytest.raises(QueueNotFound):
        await store.ack(T1, [got.receipt], q("missing"))
    with pytest.raises(QueueNotFound):
        await store.nack(T1, [got.receipt], 0, q("missing"))
    with pytest.raises(QueueNotFound):
        await store.change_visibility(T1, q("missing"), got.receipt, 5)
    # Another tenant's queue of the same name is missing too, and nothing was touched.
    with pytest.raises(QueueNotFound):
        await store.ack(T2, [got.receipt], q("orders"))
    assert (await store.ack(T1, [got.receipt], q("orders"))).acked == 1


async def test_invisible_until_visibility_timeout_then_redelivered(
    store: Backend, clock: ManualClock
) -> None:
    await store.create_queue(T1, q("orders"), {"visibility_timeout_s": 10})
    sent = await send_one(store, T1, "orders", "a")
    [first] = await store.receive(T1, q("orders"), 1)

    clock.advance(9.5)
    assert await store.receive(T1, q("orders"), 1) == []
    clock.advance(1)
    [second] = await store.receive(T1, q("orders"), 1)
    assert second.id == sent.id
    assert second.receive_count == 2
    assert second.receipt != first.receipt


async def test_receive_visibility_override(store: Backend, clock: ManualClock) -> None:
    await store.create_queue(T1, q("orders"), {"visibility_timeout_s": 10})
    await send_one(store, T1, "orders", "a")
    [got] = await store.receive(T1, q("orders"), 1, visibility_timeout_s=100)
    assert got.visible_at == clock.now + 100
    clock.advance(50)
    assert await store.receive(T1, q("orders"), 1) == []
    clock.advance(51)
    assert len(await store.receive(T1, q("orders"), 1)) == 1


async def test_ack_deletes(store: Backend, clock: ManualClock) -> None:
    await store.create_queue(T1, q("orders"), {"visibility_timeout_s": 10})
    await store.send(T1, q("orders"), [msg("a"), msg("b")])
    got = await store.receive(T1, q("orders"), 2)
    result = await store.ack(T1, [m.receipt for m in got], queue=q("orders"))
    assert (result.acked, result.failed) == (2, [])
    clock.advance(3600)
    assert await store.receive(T1, q("orders"), 10) == []
    stats = (await store.get_queue(T1, q("orders"))).stats
    assert (stats.visible, stats.in_flight, stats.acked_total) == (0, 0, 2)


async def test_ack_reports_bad_receipts_without_failing_good_ones(store: Backend) -> None:
    await store.create_queue(T1, q("orders"), {})
    await store.create_queue(T1, q("other"), {})
    await send_one(store, T1, "orders", "a")
    await send_one(store, T1, "other", "b")
    [a] = await store.receive(T1, q("orders"), 1)
    [b] = await store.receive(T1, q("other"), 1)

    result = await store.ack(T1, ["garbage", a.receipt, b.receipt, ""], queue=q("orders"))
    assert result.acked == 1
    assert [(f.receipt, f.code) for f in result.failed] == [
        ("garbage", "invalid_receipt"),
        (b.receipt, "invalid_receipt"),
        ("", "invalid_receipt"),
    ]
    # The receipt of the other queue still works where it belongs.
    assert (await store.ack(T1, [b.receipt])).acked == 1
    # Acking twice: the second time the receipt is spent.
    again = await store.ack(T1, [a.receipt])
    assert again.acked == 0 and [f.code for f in again.failed] == ["invalid_receipt"]


async def test_malformed_receipts_fail_cleanly(store: Backend) -> None:
    await store.create_queue(T1, q("orders"), {})
    await send_one(store, T1, "orders", "a")
    [got] = await store.receive(T1, q("orders"), 1)
    r = got.receipt
    nasty = [
        "", "=", "====", "A" * 10_000, "\ud800", "\x00", "ünï", r + "AAAA", r[:-4], r[::-1],
        r.replace("A", "B", 1), "/" * len(r), "+" * len(r), r.upper() if r.upper() != r else r.lower(),
    ]  # fmt: skip
    result = await store.ack(T1, nasty, queue=q("orders"))
    assert result.acked == 0
    assert [f.code for f in result.failed] == ["invalid_receipt"] * len(nasty)
    assert (await store.nack(T1, nasty)).acked == 0
    for receipt in nasty:
        with pytest.raises(InvalidReceipt):
            await store.change_visibility(T1, q("orders"), receipt, 5)
    # None of that touched the real one.
    assert (await store.ack(T1, [r])).acked == 1


async def test_receipts_are_opaque_and_not_guessable(store: Backend) -> None:
    await store.create_queue(T1, q("orders"), {})
    await store.send(T1, q("orders"), [msg(f"m{i}") for i in range(50)])
    got = await store.receive(T1, q("orders"), 50)
    receipts = [m.receipt for m in got]
    assert len(set(receipts)) == 50
    for m in got:
        # A receipt is not the id or seq in disguise.
        assert m.receipt not in (m.id, str(m.seq))
        assert len(m.receipt) >= 16


async def test_stale_receipt_rejected_once_message_is_visible_again(
    store: Backend, clock: ManualClock
) -> None:
    await store.create_queue(T1, q("orders"), {"visibility_timeout_s": 10})
    await send_one(store, T1, "orders", "a")
    [first] = await store.receive(T1, q("orders"), 1)
    clock.advance(11)

    # Visible again but nobody holds it yet: the old receipt already stopped working.
    stale = await store.ack(T1, [first.receipt])
    assert stale.acked == 0 and [f.code for f in stale.failed] == ["invalid_receipt"]

    [second] = await store.receive(T1, q("orders"), 1)
    assert second.id == first.id
    # Someone else holds it now: the stale receipt must not delete it, nor release it.
    assert (await store.ack(T1, [first.receipt])).acked == 0
    assert (await store.nack(T1, [first.receipt])).acked == 0
    with pytest.raises(InvalidReceipt):
        await store.change_visibility(T1, q("orders"), first.receipt, 0)
    assert await store.receive(T1, q("orders"), 1) == []
    assert (await store.ack(T1, [second.receipt])).acked == 1


async def test_nack_makes_visible_now(store: Backend) -> None:
    await store.create_queue(T1, q("orders"), {"visibility_timeout_s": 600})
    await send_one(store, T1, "orders", "a")
    [first] = await store.receive(T1, q("orders"), 1)
    result = await store.nack(T1, [first.receipt], queue=q("orders"))
    assert (result.acked, result.failed) == (1, [])
    [second] = await store.receive(T1, q("orders"), 1)
    assert second.id == first.id and second.receive_count == 2
    # The nacked receipt is spent.
    assert (await store.ack(T1, [first.receipt])).acked == 0


async def test_nack_with_delay(store: Backend, clock: ManualClock) -> None:
    await store.create_queue(T1, q("orders"), {"visibility_timeout_s": 600})
    await send_one(store, T1, "orders", "a")
    [first] = await store.receive(T1, q("orders"), 1)
    await store.nack(T1, [first.receipt], delay_s=20)
    assert await store.next_visible_at(T1, q("orders")) == clock.now + 20
    clock.advance(19.5)
    assert await store.receive(T1, q("orders"), 1) == []
    clock.advance(1)
    [again] = await store.receive(T1, q("orders"), 1)
    assert again.id == first.id


async def test_nack_reports_bad_receipts(store: Backend) -> None:
    await store.create_queue(T1, q("orders"), {})
    await store.create_queue(T1, q("other"), {})
    await send_one(store, T1, "other", "b")
    [b] = await store.receive(T1, q("other"), 1)
    result = await store.nack(T1, ["garbage", b.receipt], queue=q("orders"))
    assert result.acked == 0
    assert [f.code for f in result.failed] == ["invalid_receipt", "invalid_receipt"]
    # The wrong-queue nack did not release it.
    assert await store.receive(T1, q("other"), 1) == []


async def test_change_visibility_extends_and_shortens(store: Backend, clock: ManualClock) -> None:
    await store.create_queue(T1, q("orders"), {"visibility_timeout_s": 10})
    await send_one(store, T1, "orders", "a")
    [got] = await store.receive(T1, q("orders"), 1)
    clock.advance(8)
    await store.change_visibility(T1, q("orders"), got.receipt, 30)
    clock.advance(20)  # 28 s after receive: past the original 10 s, inside the new 30 s
    assert await store.receive(T1, q("orders"), 1) == []
    # The receipt survived the extension.
    await store.change_visibility(T1, q("orders"), got.receipt, 0)
    [again] = await store.receive(T1, q("orders"), 1)
    assert again.id == got.id and again.receive_count == 2


async def test_change_visibility_rejects_bad_input(store: Backend, clock: ManualClock) -> None:
    await store.create_queue(T1, q("orders"), {"visibility_timeout_s": 10})
    await store.create_queue(T1, q("other"), {})
    await send_one(store, T1, "orders", "a")
    [got] = await store.receive(T1, q("orders"), 1)
    with pytest.raises(InvalidReceipt):
        await store.change_visibility(T1, q("orders"), "garbage", 5)
    with pytest.raises(InvalidReceipt):
        await store.change_visibility(T1, q("other"), got.receipt, 5)
    with pytest.raises(InvalidRequest):
        await store.change_visibility(T1, q("orders"), got.receipt, 43201)
    with pytest.raises(InvalidRequest):
        await store.change_visibility(T1, q("orders"), got.receipt, -1)
    clock.advance(11)
    with pytest.raises(InvalidReceipt):
        await store.change_visibility(T1, q("orders"), got.receipt, 100)


async def test_message_delay_and_queue_default_delay(store: Backend, clock: ManualClock) -> None:
    await store.create_queue(T1, q("orders"), {"delay_s": 30})
    await store.send(T1, q("orders"), [msg("default"), msg("own", delay_s=5), msg("none", delay_s=0)])
    stats = (await store.get_queue(T1, q("orders"))).stats
    assert (stats.visible, stats.delayed) == (1, 2)
    [now] = await store.receive(T1, q("orders"), 10)
    assert now.body == b"none"
    await store.ack(T1, [now.receipt])
    assert await store.next_visible_at(T1, q("orders")) == clock.now + 5

    clock.advance(5.5)
    assert [m.body for m in await store.receive(T1, q("orders"), 10)] == [b"own"]
    clock.advance(25)
    assert [m.body for m in await store.receive(T1, q("orders"), 10)] == [b"default"]


async def test_message_delay_is_validated(store: Backend) -> None:
    await store.create_queue(T1, q("orders"), {})
    results = await store.send(T1, q("orders"), [msg("bad", delay_s=901), msg("good", delay_s=900)])
    assert isinstance(results[0], InvalidRequest)
    ok(results[1])


async def test_next_visible_at(store: Backend, clock: ManualClock) -> None:
    await store.create_queue(T1, q("orders"), {"visibility_timeout_s": 40})
    assert await store.next_visible_at(T1, q("orders")) is None
    await send_one(store, T1, "orders", "now")
    # Already visible: nothing is waiting to become visible.
    assert await store.next_visible_at(T1, q("orders")) is None
    await send_one(store, T1, "orders", "later", delay_s=60)
    assert await store.next_visible_at(T1, q("orders")) == clock.now + 60
    await store.receive(T1, q("orders"), 1)
    assert await store.next_visible_at(T1, q("orders")) == clock.now + 40
    with pytest.raises(QueueNotFound):
        await store.next_visible_at(T1, q("missing"))


async def test_next_visible_at_skips_messages_blocked_behind_their_fifo_group(
    store: Backend, clock: ManualClock
) -> None:
    # a1 is visible but cannot go out while a0 is in flight. A dispatcher sleeping until
    # next_visible_at must be told "when a0 comes back", not "now", or it would spin.
    await store.create_queue(T1, q("f"), {"ordering": "fifo", "visibility_timeout_s": 40})
    await store.send(T1, q("f"), [msg("a0", group_id="a"), msg("a1", group_id="a")])
    [a0] = await store.receive(T1, q("f"), 1)
    assert a0.body == b"a0"
    assert await store.receive(T1, q("f"), 1) == []
    assert await store.next_visible_at(T1, q("f")) == clock.now + 40


async def test_retention_drops_old_messages_acked_or_not(store: Backend, clock: ManualClock) -> None:
    await store.create_queue(T1, q("orders"), {"retention_s": 60, "visibility_timeout_s": 3600})
    await send_one(store, T1, "orders", "held")
    await send_one(store, T1, "orders", "waiting")
    [held] = await store.receive(T1, q("orders"), 1)
    clock.advance(30)
    await send_one(store, T1, "orders", "young")
    clock.advance(31)  # the first two are 61 s old, "young" 31 s

    async def only_young_left() -> bool:
        stats = (await store.get_queue(T1, q("orders"))).stats
        return (stats.visible, stats.in_flight, stats.delayed) == (1, 0, 0)

    await wait_for(only_young_left, what="the retention sweep")
    assert [m.body for m in await receive_all(store, T1, "orders")] == [b"young"]
    assert (await store.ack(T1, [held.receipt])).acked == 0


async def test_max_messages_rejects_per_entry(store: Backend) -> None:
    await store.create_queue(T1, q("orders"), {"max_messages": 2})
    results = await store.send(T1, q("orders"), [msg("a"), msg("b"), msg("c")])
    ok(results[0])
    ok(results[1])
    assert isinstance(results[2], QueueFull)
    assert results[2].code == "queue_full"
    # In-flight messages still count: they are stored.
    [got] = await store.receive(T1, q("orders"), 1)
    [full] = await store.send(T1, q("orders"), [msg("d")])
    assert isinstance(full, QueueFull)
    await store.ack(T1, [got.receipt])
    ok((await store.send(T1, q("orders"), [msg("e")]))[0])
    assert sorted(m.body for m in await receive_all(store, T1, "orders")) == [b"b", b"e"]


async def test_max_message_bytes_rejects_per_entry(store: Backend) -> None:
    await store.create_queue(T1, q("orders"), {"max_message_bytes": 10})
    results = await store.send(T1, q("orders"), [msg(b"x" * 10), msg(b"y" * 11), msg(b"z")])
    ok(results[0])
    assert isinstance(results[1], MessageTooLarge)
    assert results[1].code == "message_too_large"
    ok(results[2])
    assert [m.body for m in await store.receive(T1, q("orders"), 10)] == [b"x" * 10, b"z"]


async def test_default_max_message_bytes_is_256_kib(store: Backend) -> None:
    await store.create_queue(T1, q("orders"), {})
    results = await store.send(T1, q("orders"), [msg(b"a" * 262144), msg(b"a" * 262145)])
    ok(results[0])
    assert isinstance(results[1], MessageTooLarge)


async def test_one_mebibyte_message_round_trips(store: Backend) -> None:
    await store.create_queue(T1, q("big"), {"max_message_bytes": 1048576})
    body = bytes(range(256)) * 4096
    await send_one(store, T1, "big", body, is_text=False)
    [got] = await store.receive(T1, q("big"), 1)
    assert got.body == body


async def test_receive_count_counts_deliveries(store: Backend, clock: ManualClock) -> None:
    await store.create_queue(T1, q("orders"), {"visibility_timeout_s": 5})
    await send_one(store, T1, "orders", "a")
    counts = []
    for _ in range(3):
        [got] = await store.receive(T1, q("orders"), 1)
        counts.append(got.receive_count)
        clock.advance(6)
    [got] = await store.receive(T1, q("orders"), 1)
    await store.nack(T1, [got.receipt])
    [got] = await store.receive(T1, q("orders"), 1)
    assert [*counts, got.receive_count] == [1, 2, 3, 5]
