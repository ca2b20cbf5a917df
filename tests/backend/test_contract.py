"""The contract of :class:`backend_store.Backend`, run against every backend kind.

Semantics follow API.md and, where it is silent, Amazon SQS. Time-based behaviour
(visibility timeouts, delays, retention, dedupe windows) moves the injected
:class:`ManualClock`; nothing here sleeps to make time pass.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from backend_store import Backend, NewMessage, QueueAttributes, SendResult, TenantId
from backend_store.errors import (
    InvalidReceipt,
    InvalidRequest,
    MessageTooLarge,
    QueueExists,
    QueueFull,
    QueueNotFound,
)

from ..conftest import ManualClock, scaled, wait_for
from .harness import T1, T2, StoreFactory, msg, ok, q, receive_all, send_one

# ---------------------------------------------------------------------------
# Queues
# ---------------------------------------------------------------------------


async def test_create_queue_reports_created_then_is_idempotent(store: Backend, clock: ManualClock) -> None:
    info, created = await store.create_queue(T1, q("orders"), {"visibility_timeout_s": 5})
    assert created is True
    assert info.name == "orders"
    assert info.tenant == T1
    assert info.created_at == clock.now
    assert info.attributes == QueueAttributes(visibility_timeout_s=5)

    clock.advance(10)
    again, created = await store.create_queue(T1, q("orders"), {"visibility_timeout_s": 5})
    assert created is False
    assert again.attributes == info.attributes
    # The original creation time stands: nothing was recreated.
    assert again.created_at == info.created_at


async def test_create_queue_compares_resolved_attributes(store: Backend) -> None:
    # Spelling out a default is the same queue as leaving it out.
    await store.create_queue(T1, q("orders"), {})
    _, created = await store.create_queue(T1, q("orders"), {"visibility_timeout_s": 30})
    assert created is False


async def test_create_queue_with_different_attributes_conflicts(store: Backend) -> None:
    await store.create_queue(T1, q("orders"), {"visibility_timeout_s": 5})
    with pytest.raises(QueueExists):
        await store.create_queue(T1, q("orders"), {"visibility_timeout_s": 6})
    with pytest.raises(QueueExists):
        await store.create_queue(T1, q("orders"), {})
    info = await store.get_queue(T1, q("orders"))
    assert info.attributes.visibility_timeout_s == 5


@pytest.mark.parametrize("name", ["", "a" * 81, "has space", "dot.fifo", "slash/x", "ünïcode", "trailing\n"])
async def test_create_queue_rejects_bad_names(store: Backend, name: str) -> None:
    with pytest.raises(InvalidRequest):
        await store.create_queue(T1, q(name), {})


async def test_create_queue_accepts_name_edges(store: Backend) -> None:
    for name in ("a", "A" * 80, "with_under-dash09"):
        _, created = await store.create_queue(T1, q(name), {})
        assert created


# Attribute values just outside API.md's bounds, and other malformed values.
BAD_ATTRIBUTES: list[dict[str, Any]] = [
    {"max_message_bytes": 0},
    {"max_message_bytes": 1048577},
    {"max_message_bytes": 1.5},
    {"max_messages": 0},
    {"max_messages": 10**9 + 1},
    {"visibility_timeout_s": -1},
    {"visibility_timeout_s": 43201},
    {"visibility_timeout_s": float("nan")},
    {"visibility_timeout_s": "30"},
    {"visibility_timeout_s": True},
    {"retention_s": 59},
    {"retention_s": 1209601},
    {"delay_s": 901},
    {"delay_s": -0.5},
    {"receive_wait_s": 21},
    {"max_receives": 0, "dead_letter_queue": "dlq"},
    {"max_receives": 1001, "dead_letter_queue": "dlq"},
    {"max_receives": 3},
    {"dead_letter_queue": "dlq"},
    {"ordering": "lifo"},
    {"dedupe_window_s": 86401},
    {"content_dedupe": "yes"},
    {"content_dedupe": 1},
    {"replication_mode": "eventually"},
    {"replication_factor": 0},
    {"no_such_attribute": 1},
]


@pytest.mark.parametrize("attributes", BAD_ATTRIBUTES, ids=repr)
async def test_create_queue_rejects_out_of_bound_attributes(
    store: Backend, attributes: dict[str, Any]
) -> None:
    await store.create_queue(T1, q("dlq"), {})
    with pytest.raises(InvalidRequest):
        await store.create_queue(T1, q("orders"), attributes)
    with pytest.raises(QueueNotFound):
        await store.get_queue(T1, q("orders"))


GOOD_EDGES: list[dict[str, Any]] = [
    {"max_message_bytes": 1},
    {"max_message_bytes": 1048576},
    {"max_messages": 1},
    {"max_messages": 10**9},
    {"max_messages": None},
    {"visibility_timeout_s": 0},
    {"visibility_timeout_s": 43200},
    {"retention_s": 60},
    {"retention_s": 1209600},
    {"delay_s": 900},
    {"receive_wait_s": 20},
    {"max_receives": 1, "dead_letter_queue": "dlq"},
    {"max_receives": 1000, "dead_letter_queue": "dlq"},
    {"ordering": "fifo"},
    {"dedupe_window_s": 0},
    {"dedupe_window_s": 86400},
    {"content_dedupe": True},
    {"replication_mode": "async"},
]


@pytest.mark.parametrize("attributes", GOOD_EDGES, ids=repr)
async def test_create_queue_accepts_bound_edges(store: Backend, attributes: dict[str, Any]) -> None:
    await store.create_queue(T1, q("dlq"), {})
    info, created = await store.create_queue(T1, q("orders"), attributes)
    assert created
    for name, value in attributes.items():
        assert getattr(info.attributes, name) == value


async def test_dead_letter_queue_must_exist_in_the_same_tenant(store: Backend) -> None:
    attrs = {"max_receives": 2, "dead_letter_queue": "dlq"}
    with pytest.raises(InvalidRequest):
        await store.create_queue(T1, q("orders"), attrs)
    # A queue of that name in another tenant does not count.
    await store.create_queue(T2, q("dlq"), {})
    with pytest.raises(InvalidRequest):
        await store.create_queue(T1, q("orders"), attrs)
    await store.create_queue(T1, q("dlq"), {})
    _, created = await store.create_queue(T1, q("orders"), attrs)
    assert created


async def test_get_and_list_are_per_tenant(store: Backend) -> None:
    for name in ("zeta", "alpha", "mid"):
        await store.create_queue(T1, q(name), {})
    await store.create_queue(T2, q("alpha"), {"visibility_timeout_s": 7})
    await store.create_queue(T2, q("other"), {})

    assert [i.name for i in await store.list_queues(T1)] == ["alpha", "mid", "zeta"]
    assert [i.name for i in await store.list_queues(T2)] == ["alpha", "other"]
    assert await store.list_queues(TenantId("nobody")) == []

    with pytest.raises(QueueNotFound):
        await store.get_queue(T2, q("zeta"))
    # Same name, different tenants: different queues.
    assert (await store.get_queue(T1, q("alpha"))).attributes.visibility_timeout_s == 30
    assert (await store.get_queue(T2, q("alpha"))).attributes.visibility_timeout_s == 7


async def test_same_queue_name_in_two_tenants_keeps_messages_apart(store: Backend) -> None:
    await store.create_queue(T1, q("orders"), {})
    await store.create_queue(T2, q("orders"), {})
    await send_one(store, T1, "orders", "for one")
    assert await store.receive(T2, q("orders"), 10) == []
    [got] = await store.receive(T1, q("orders"), 10)
    assert got.body == b"for one"
    # Another tenant's receipt is as good as garbage.
    result = await store.ack(T2, [got.receipt])
    assert result.acked == 0
    assert [(f.receipt, f.code) for f in result.failed] == [(got.receipt, "invalid_receipt")]
    assert (await store.get_queue(T1, q("orders"))).stats.in_flight == 1


async def test_get_queue_missing_raises(store: Backend) -> None:
    with pytest.raises(QueueNotFound):
        await store.get_queue(T1, q("nope"))


async def test_update_queue_changes_mutable_attributes(store: Backend) -> None:
    await store.create_queue(T1, q("orders"), {"visibility_timeout_s": 5, "delay_s": 1})
    info = await store.update_queue(T1, q("orders"), {"visibility_timeout_s": 60})
    assert info.attributes.visibility_timeout_s == 60
    assert info.attributes.delay_s == 1  # left out: kept
    assert (await store.get_queue(T1, q("orders"))).attributes.visibility_timeout_s == 60
    # Re-creating with the old attributes now conflicts; with the new ones it does not.
    with pytest.raises(QueueExists):
        await store.create_queue(T1, q("orders"), {"visibility_timeout_s": 5, "delay_s": 1})
    _, created = await store.create_queue(T1, q("orders"), {"visibility_timeout_s": 60, "delay_s": 1})
    assert created is False


async def test_update_queue_keeps_ordering_immutable(store: Backend) -> None:
    await store.create_queue(T1, q("orders"), {"ordering": "fifo"})
    with pytest.raises(InvalidRequest):
        await store.update_queue(T1, q("orders"), {"ordering": "best_effort"})
    # Naming the current value is not a change.
    info = await store.update_queue(T1, q("orders"), {"ordering": "fifo", "delay_s": 2})
    assert info.attributes.ordering == "fifo"
    assert info.attributes.delay_s == 2


async def test_update_queue_validates(store: Backend) -> None:
    await store.create_queue(T1, q("orders"), {})
    with pytest.raises(InvalidRequest):
        await store.update_queue(T1, q("orders"), {"visibility_timeout_s": 43201})
    with pytest.raises(InvalidRequest):
        await store.update_queue(T1, q("orders"), {"bogus": 1})
    with pytest.raises(InvalidRequest):
        await store.update_queue(T1, q("orders"), {"max_receives": 3, "dead_letter_queue": "missing"})
    with pytest.raises(QueueNotFound):
        await store.update_queue(T1, q("missing"), {"delay_s": 1})
    with pytest.raises(QueueNotFound):
        await store.update_queue(T2, q("orders"), {"delay_s": 1})
    assert (await store.get_queue(T1, q("orders"))).attributes == QueueAttributes()


async def test_delete_queue_removes_it_and_its_messages(store: Backend) -> None:
    await store.create_queue(T1, q("orders"), {})
    await store.create_queue(T1, q("keep"), {})
    await send_one(store, T1, "orders", "a")
    await send_one(store, T1, "orders", "b")
    [held] = await store.receive(T1, q("orders"), 1)

    await store.delete_queue(T1, q("orders"))
    assert [i.name for i in await store.list_queues(T1)] == ["keep"]
    with pytest.raises(QueueNotFound):
        await store.get_queue(T1, q("orders"))
    with pytest.raises(QueueNotFound):
        await store.send(T1, q("orders"), [msg("c")])
    result = await store.ack(T1, [held.receipt])
    assert result.acked == 0 and len(result.failed) == 1

    # A new queue of the same name starts empty.
    await store.create_queue(T1, q("orders"), {})
    assert await store.receive(T1, q("orders"), 10) == []
    assert (await store.get_queue(T1, q("orders"))).stats.visible == 0


async def test_delete_missing_queue_raises(store: Backend) -> None:
    await store.create_queue(T2, q("orders"), {})
    with pytest.raises(QueueNotFound):
        await store.delete_queue(T1, q("orders"))
    await store.get_queue(T2, q("orders"))


async def test_purge_counts_visible_delayed_and_in_flight(store: Backend) -> None:
    await store.create_queue(T1, q("orders"), {})
    await store.send(T1, q("orders"), [msg("a"), msg("b"), msg("c", delay_s=60)])
    [held] = await store.receive(T1, q("orders"), 1)

    assert await store.purge_queue(T1, q("orders")) == 3
    stats = (await store.get_queue(T1, q("orders"))).stats
    assert (stats.visible, stats.in_flight, stats.delayed) == (0, 0, 0)
    assert (await store.ack(T1, [held.receipt])).acked == 0
    assert await store.purge_queue(T1, q("orders")) == 0
    with pytest.raises(QueueNotFound):
        await store.purge_queue(T1, q("missing"))
    # The queue itself stays and works.
    await send_one(store, T1, "orders", "after")
    [got] = await store.receive(T1, q("orders"), 10)
    assert got.body == b"after"


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


async def test_receive_from_missing_queue_raises(store: Backend) -> None:
    with pytest.raises(QueueNotFound):
        await store.receive(T1, q("missing"), 1)


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


# ---------------------------------------------------------------------------
# Dead-letter queues
# ---------------------------------------------------------------------------


async def test_max_receives_moves_to_dead_letter_queue(store: Backend, clock: ManualClock) -> None:
    await store.create_queue(T1, q("dlq"), {})
    await store.create_queue(
        T1, q("orders"), {"visibility_timeout_s": 5, "max_receives": 2, "dead_letter_queue": "dlq"}
    )
    sent = await send_one(store, T1, "orders", "poison", attributes={"k": "v"}, group_id=None)
    await send_one(store, T1, "orders", "fine")

    for expected in (1, 2):
        got = await store.receive(T1, q("orders"), 10)
        assert [(m.body, m.receive_count) for m in got] == [(b"poison", expected), (b"fine", expected)]
        if expected == 2:
            await store.ack(T1, [got[1].receipt])
        clock.advance(6)

    # Past max_receives: moved instead of handed out a third time.
    assert await store.receive(T1, q("orders"), 10) == []
    stats = (await store.get_queue(T1, q("orders"))).stats
    assert (stats.visible, stats.in_flight, stats.delayed) == (0, 0, 0)
    assert stats.dead_lettered_total == 1

    [dead] = await store.receive(T1, q("dlq"), 10)
    assert dead.body == b"poison"
    assert dead.attributes == {"k": "v"}
    # SQS keeps the message id across the move.
    assert dead.id == sent.id
    assert await store.receive(T1, q("dlq"), 10) == []


async def test_dead_letter_move_is_exactly_once(store: Backend, clock: ManualClock) -> None:
    await store.create_queue(T1, q("dlq"), {})
    await store.create_queue(
        T1, q("orders"), {"visibility_timeout_s": 1, "max_receives": 1, "dead_letter_queue": "dlq"}
    )
    await store.send(T1, q("orders"), [msg(f"m{i}") for i in range(30)])
    assert len(await receive_all(store, T1, "orders", visibility_timeout_s=1)) == 30
    clock.advance(2)
    # Many concurrent receivers race to move the same expired messages.
    results = await asyncio.gather(*(store.receive(T1, q("orders"), 10) for _ in range(8)))
    assert all(r == [] for r in results)
    dead = await receive_all(store, T1, "dlq")
    assert sorted(m.body for m in dead) == sorted(f"m{i}".encode() for i in range(30))
    assert (await store.get_queue(T1, q("orders"))).stats.dead_lettered_total == 30


async def test_deleting_a_dead_letter_queue_in_use_is_refused_or_detaches(
    store: Backend, clock: ManualClock
) -> None:
    # SQS lets the DLQ go and the source then keeps its messages; either way nothing is lost
    # silently: after the DLQ is gone a poison message is still somewhere we can see.
    await store.create_queue(T1, q("dlq"), {})
    await store.create_queue(
        T1, q("orders"), {"visibility_timeout_s": 1, "max_receives": 1, "dead_letter_queue": "dlq"}
    )
    await send_one(store, T1, "orders", "poison")
    await store.receive(T1, q("orders"), 1)
    try:
        await store.delete_queue(T1, q("dlq"))
    except InvalidRequest:
        return
    clock.advance(2)
    got = await store.receive(T1, q("orders"), 1)
    assert [m.body for m in got] == [b"poison"]


# ---------------------------------------------------------------------------
# FIFO
# ---------------------------------------------------------------------------


async def test_fifo_one_in_flight_per_group_and_strict_order(store: Backend, clock: ManualClock) -> None:
    await store.create_queue(T1, q("f"), {"ordering": "fifo", "visibility_timeout_s": 10})
    await store.send(T1, q("f"), [msg(f"a{i}", group_id="a") for i in range(3)])

    [a0] = await store.receive(T1, q("f"), 1)
    assert a0.body == b"a0" and a0.group_id == "a"
    # a0 is in flight: nothing else of group a may go out.
    assert await store.receive(T1, q("f"), 10) == []

    # Timed out: a0 comes back before a1.
    clock.advance(11)
    [again] = await store.receive(T1, q("f"), 1)
    assert again.body == b"a0" and again.receive_count == 2
    # Nacked: still a0 first.
    await store.nack(T1, [again.receipt])
    [again] = await store.receive(T1, q("f"), 1)
    assert again.body == b"a0"
    await store.ack(T1, [again.receipt])

    [a1] = await store.receive(T1, q("f"), 1)
    assert a1.body == b"a1"
    await store.ack(T1, [a1.receipt])
    [a2] = await store.receive(T1, q("f"), 1)
    assert a2.body == b"a2"


async def test_fifo_groups_proceed_in_parallel(store: Backend) -> None:
    await store.create_queue(T1, q("f"), {"ordering": "fifo"})
    await store.send(
        T1,
        q("f"),
        [msg("a0", group_id="a"), msg("a1", group_id="a"), msg("b0", group_id="b"), msg("c0", group_id="c")],
    )
    first = await store.receive(T1, q("f"), 1)
    second = await store.receive(T1, q("f"), 1)
    third = await store.receive(T1, q("f"), 1)
    # Group a's head is out, so the next receivers get the other groups' heads, not a1.
    assert sorted(m.body for m in first + second + third) == [b"a0", b"b0", b"c0"]
    assert await store.receive(T1, q("f"), 10) == []


async def test_fifo_batch_receive_keeps_group_order(store: Backend) -> None:
    await store.create_queue(T1, q("f"), {"ordering": "fifo"})
    await store.send(T1, q("f"), [msg(f"{g}{i}", group_id=g) for i in range(5) for g in "abc"])
    delivered: list[bytes] = []
    while True:
        got = await store.receive(T1, q("f"), 10)
        if not got:
            break
        # Whatever one call hands out of a group is the group's next messages in order.
        delivered += [m.body for m in got]
        await store.ack(T1, [m.receipt for m in got])
    for g in "abc":
        assert [b for b in delivered if b.startswith(g.encode())] == [f"{g}{i}".encode() for i in range(5)]
    assert len(delivered) == 15


async def test_fifo_dead_letter_releases_the_group(store: Backend, clock: ManualClock) -> None:
    await store.create_queue(T1, q("dlq"), {"ordering": "fifo"})
    await store.create_queue(
        T1,
        q("f"),
        {"ordering": "fifo", "visibility_timeout_s": 1, "max_receives": 1, "dead_letter_queue": "dlq"},
    )
    await store.send(T1, q("f"), [msg("a0", group_id="a"), msg("a1", group_id="a")])
    [a0] = await store.receive(T1, q("f"), 1)
    assert a0.body == b"a0"
    clock.advance(2)
    [a1] = await store.receive(T1, q("f"), 1)
    assert a1.body == b"a1"
    [dead] = await store.receive(T1, q("dlq"), 1)
    assert dead.body == b"a0" and dead.group_id == "a"


async def test_fifo_message_without_group_is_accepted_or_rejected_cleanly(store: Backend) -> None:
    await store.create_queue(T1, q("f"), {"ordering": "fifo"})
    [result] = await store.send(T1, q("f"), [msg("nogroup")])
    if isinstance(result, SendResult):
        assert [m.body for m in await store.receive(T1, q("f"), 1)] == [b"nogroup"]
    else:
        assert isinstance(result, InvalidRequest)


# ---------------------------------------------------------------------------
# Dedupe
# ---------------------------------------------------------------------------


async def test_dedupe_id_returns_the_original(store: Backend, clock: ManualClock) -> None:
    await store.create_queue(T1, q("orders"), {"dedupe_window_s": 60})
    first = await send_one(store, T1, "orders", "a", dedupe_id="d1")
    clock.advance(30)
    second = await send_one(store, T1, "orders", "a different body", dedupe_id="d1")
    assert (second.id, second.seq, second.duplicate) == (first.id, first.seq, True)
    assert first.duplicate is False
    got = await receive_all(store, T1, "orders")
    assert [m.body for m in got] == [b"a"]
    # Consumed or not, the id stays taken for the window (SQS behaviour).
    await store.ack(T1, [got[0].receipt])
    assert (await send_one(store, T1, "orders", "a", dedupe_id="d1")).duplicate is True

    clock.advance(31)  # past the window of the first send
    third = await send_one(store, T1, "orders", "a", dedupe_id="d1")
    assert third.duplicate is False and third.id != first.id


async def test_dedupe_within_one_batch(store: Backend) -> None:
    await store.create_queue(T1, q("orders"), {})
    results = [
        ok(r)
        for r in await store.send(
            T1, q("orders"), [msg("a", dedupe_id="x"), msg("b", dedupe_id="y"), msg("a", dedupe_id="x")]
        )
    ]
    assert [r.duplicate for r in results] == [False, False, True]
    assert (results[2].id, results[2].seq) == (results[0].id, results[0].seq)
    assert [m.body for m in await receive_all(store, T1, "orders")] == [b"a", b"b"]


async def test_dedupe_is_per_queue_and_tenant(store: Backend) -> None:
    for tenant in (T1, T2):
        for name in ("one", "two"):
            await store.create_queue(tenant, q(name), {})
    results = [
        await send_one(store, tenant, name, "same", dedupe_id="d")
        for tenant in (T1, T2)
        for name in ("one", "two")
    ]
    assert [r.duplicate for r in results] == [False] * 4
    assert len({(r.id) for r in results}) == 4


async def test_content_dedupe(store: Backend, clock: ManualClock) -> None:
    await store.create_queue(T1, q("orders"), {"content_dedupe": True, "dedupe_window_s": 100})
    first = await send_one(store, T1, "orders", "same body")
    dup = await send_one(store, T1, "orders", "same body")
    assert (dup.id, dup.seq, dup.duplicate) == (first.id, first.seq, True)
    assert (await send_one(store, T1, "orders", "other body")).duplicate is False
    # An explicit dedupe_id wins over the body hash.
    assert (await send_one(store, T1, "orders", "same body", dedupe_id="own")).duplicate is False
    clock.advance(101)
    assert (await send_one(store, T1, "orders", "same body")).duplicate is False
    assert len(await receive_all(store, T1, "orders")) == 4


async def test_without_content_dedupe_same_bodies_are_distinct(store: Backend) -> None:
    await store.create_queue(T1, q("orders"), {})
    a = await send_one(store, T1, "orders", "same")
    b = await send_one(store, T1, "orders", "same")
    assert not b.duplicate and a.id != b.id


async def test_dedupe_window_zero_disables_dedupe(store: Backend) -> None:
    await store.create_queue(T1, q("orders"), {"dedupe_window_s": 0, "content_dedupe": True})
    a = await send_one(store, T1, "orders", "same", dedupe_id="d")
    b = await send_one(store, T1, "orders", "same", dedupe_id="d")
    assert not b.duplicate and a.id != b.id


async def test_duplicate_does_not_hit_max_messages(store: Backend) -> None:
    # A retried send of a stored message is answered from the dedupe index, even when full.
    await store.create_queue(T1, q("orders"), {"max_messages": 1})
    first = await send_one(store, T1, "orders", "a", dedupe_id="d")
    [again] = await store.send(T1, q("orders"), [msg("a", dedupe_id="d")])
    assert isinstance(again, SendResult) and again.duplicate and again.id == first.id


# ---------------------------------------------------------------------------
# Stats
# ---------------------------------------------------------------------------


async def test_stats(store: Backend, clock: ManualClock) -> None:
    await store.create_queue(T1, q("dlq"), {})
    await store.create_queue(
        T1, q("orders"), {"visibility_timeout_s": 10, "max_receives": 1, "dead_letter_queue": "dlq"}
    )
    info = await store.get_queue(T1, q("orders"))
    assert info.stats.visible == 0 and info.stats.sent_total == 0
    assert info.stats.oldest_age_s in (None, 0)

    await store.send(T1, q("orders"), [msg("a"), msg("b"), msg("c"), msg("later", delay_s=100)])
    clock.advance(5)
    [a, _b] = await store.receive(T1, q("orders"), 2)
    stats = (await store.get_queue(T1, q("orders"))).stats
    assert (stats.visible, stats.in_flight, stats.delayed) == (1, 2, 1)
    assert stats.sent_total == 4
    assert stats.oldest_age_s == pytest.approx(5)

    await store.ack(T1, [a.receipt])
    clock.advance(11)  # b times out; its next receive moves it to the DLQ
    assert [m.body for m in await store.receive(T1, q("orders"), 10)] == [b"c"]
    stats = (await store.get_queue(T1, q("orders"))).stats
    assert (stats.visible, stats.in_flight, stats.delayed) == (0, 1, 1)
    assert (stats.sent_total, stats.acked_total, stats.dead_lettered_total) == (4, 1, 1)
    dlq = (await store.get_queue(T1, q("dlq"))).stats
    assert dlq.visible == 1

    listed = {i.name: i.stats for i in await store.list_queues(T1)}
    assert listed[q("orders")] == stats


# ---------------------------------------------------------------------------
# Metadata
# ---------------------------------------------------------------------------


async def test_meta_put_get_delete(store: Backend) -> None:
    assert await store.meta_get("tenants", "acme") is None
    assert await store.meta_put("tenants", "acme", b"v1") is True
    assert await store.meta_get("tenants", "acme") == b"v1"
    assert await store.meta_put("tenants", "acme", b"v2") is True
    assert await store.meta_get("tenants", "acme") == b"v2"
    assert await store.meta_put("tenants", "acme", b"v3", only_if_absent=True) is False
    assert await store.meta_get("tenants", "acme") == b"v2"
    assert await store.meta_put("tenants", "new", b"n", only_if_absent=True) is True
    assert await store.meta_delete("tenants", "acme") is True
    assert await store.meta_delete("tenants", "acme") is False
    assert await store.meta_get("tenants", "acme") is None


async def test_meta_list_by_namespace_and_prefix(store: Backend) -> None:
    for key in ("k/b", "k/a", "k/c", "other", "k"):
        await store.meta_put("keys", key, key.encode())
    await store.meta_put("keysx", "k/zz", b"other namespace")
    await store.meta_put("ke", "ys", b"namespace boundary")
    assert await store.meta_list("keys", "k/") == [("k/a", b"k/a"), ("k/b", b"k/b"), ("k/c", b"k/c")]
    assert [k for k, _ in await store.meta_list("keys")] == ["k", "k/a", "k/b", "k/c", "other"]
    assert await store.meta_list("empty") == []


async def test_meta_only_if_absent_races_have_one_winner(store: Backend) -> None:
    results = await asyncio.gather(
        *(store.meta_put("locks", "leader", f"{i}".encode(), only_if_absent=True) for i in range(20))
    )
    assert results.count(True) == 1
    winner = results.index(True)
    assert await store.meta_get("locks", "leader") == f"{winner}".encode()


# ---------------------------------------------------------------------------
# Listeners, durability, lifecycle
# ---------------------------------------------------------------------------


async def test_listeners_hear_sends_and_nacks(store: Backend) -> None:
    await store.create_queue(T1, q("orders"), {})
    heard: list[tuple[TenantId, str]] = []
    event = asyncio.Event()

    def listener(tenant: TenantId, queue: str) -> None:
        heard.append((tenant, queue))
        event.set()

    store.add_listener(listener)

    async def expect_wake(what: str) -> None:
        async with asyncio.timeout(scaled(5)):
            await event.wait()
        assert heard[-1] == (T1, "orders"), what
        event.clear()

    await send_one(store, T1, "orders", "a")
    await expect_wake("send")
    await send_one(store, T1, "orders", "later", delay_s=30)
    await expect_wake("delayed send")
    [got] = await store.receive(T1, q("orders"), 1)
    await store.nack(T1, [got.receipt])
    await expect_wake("nack")


async def test_everything_survives_reopen(store_factory: StoreFactory, clock: ManualClock) -> None:
    store = await store_factory.open()
    await store.create_queue(T1, q("orders"), {"visibility_timeout_s": 100, "dedupe_window_s": 600})
    await store.create_queue(T1, q("f"), {"ordering": "fifo"})
    sent = [ok(r) for r in await store.send(T1, q("orders"), [msg("a", dedupe_id="d"), msg("b"), msg("c")])]
    await store.send(T1, q("f"), [msg("f0", group_id="g"), msg("f1", group_id="g")])
    [held] = await store.receive(T1, q("orders"), 1)
    [f0] = await store.receive(T1, q("f"), 1)
    await store.meta_put("tenants", "acme", b"{}")

    store = await store_factory.reopen(store)
    assert [i.name for i in await store.list_queues(T1)] == ["f", "orders"]
    assert (await store.get_queue(T1, q("orders"))).attributes.visibility_timeout_s == 100
    assert await store.meta_get("tenants", "acme") == b"{}"
    # In-flight state is durable: the held message is still invisible, its receipt still works,
    # and the fifo group is still blocked.
    assert [m.body for m in await receive_all(store, T1, "orders", visibility_timeout_s=5)] == [b"b", b"c"]
    assert await store.receive(T1, q("f"), 1) == []
    assert (await store.ack(T1, [held.receipt, f0.receipt])).acked == 2
    [f1] = await store.receive(T1, q("f"), 1)
    assert f1.body == b"f1"
    stats = (await store.get_queue(T1, q("orders"))).stats
    assert (stats.sent_total, stats.acked_total) == (3, 1)
    # So is the dedupe index, and seqs keep growing.
    dup = await send_one(store, T1, "orders", "a", dedupe_id="d")
    assert dup.duplicate and dup.id == sent[0].id
    fresh = await send_one(store, T1, "orders", "d")
    assert fresh.seq > max(r.seq for r in sent)


async def test_start_is_idempotent_and_check_writable(store: Backend) -> None:
    await store.start()
    await store.check_writable()
    await store.create_queue(T1, q("orders"), {})
    await send_one(store, T1, "orders", "a")


async def test_close_finishes_queued_writes(store_factory: StoreFactory) -> None:
    store = await store_factory.open()
    await store.create_queue(T1, q("orders"), {})
    sends = [asyncio.ensure_future(store.send(T1, q("orders"), [msg(f"m{i}")])) for i in range(200)]
    await asyncio.sleep(0)  # let them reach the writer's queue
    await store_factory.close(store)
    # Every send either completed (and then must be on disk) or failed; none hangs.
    async with asyncio.timeout(scaled(10)):
        outcomes = await asyncio.gather(*sends, return_exceptions=True)
    stored = {r[0].id for r in outcomes if isinstance(r, list) and isinstance(r[0], SendResult)}
    store = await store_factory.open()
    got = await receive_all(store, T1, "orders")
    assert stored <= {m.id for m in got}
    assert len(got) == len({m.id for m in got})


async def test_send_many_small_batches_concurrently_share_commits(store: Backend) -> None:
    # Not a speed test: hundreds of concurrent callers must all complete and all land once.
    await store.create_queue(T1, q("orders"), {})
    batches = [[NewMessage(body=f"{b}-{i}".encode()) for i in range(5)] for b in range(100)]
    results = await asyncio.gather(*(store.send(T1, q("orders"), batch) for batch in batches))
    ids = [ok(r).id for rs in results for r in rs]
    assert len(set(ids)) == 500
    assert len(await receive_all(store, T1, "orders")) == 500
