"""The Backend contract: Dead-letter queues, FIFO groups and dedupe.

Run against every backend kind (see conftest.py). Semantics follow docs/api.md and, where it is
silent, Amazon SQS. Time-based behaviour moves the injected ManualClock; nothing sleeps.
"""

from __future__ import annotations

import asyncio

from backend_store import Backend, SendResult
from backend_store.errors import (
    InvalidRequest,
)

from ..conftest import ManualClock, wait_for
from .harness import T1, T2, msg, ok, q, receive_all, send_one

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

    first_sent_at = 0.0
    for expected in (1, 2):
        got = await store.receive(T1, q("orders"), 10)
        assert [(m.body, m.receive_count) for m in got] == [(b"poison", expected), (b"fine", expected)]
        first_sent_at = got[0].sent_at
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
    # docs/store.md: same sent_at, receive_count back to 0 (so this first receive is 1).
    assert dead.receive_count == 1
    assert dead.sent_at == first_sent_at
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


async def test_a_full_dead_letter_queue_loses_nothing(store: Backend, clock: ManualClock) -> None:
    # Whether a move past the DLQ's max_messages goes through (SQS has no cap) or the message
    # stays put, the poison message is never dropped, and receive keeps working.
    await store.create_queue(T1, q("dlq"), {"max_messages": 1})
    await store.create_queue(
        T1, q("orders"), {"visibility_timeout_s": 1, "max_receives": 1, "dead_letter_queue": "dlq"}
    )
    await send_one(store, T1, "dlq", "filler")
    await store.send(T1, q("orders"), [msg("poison"), msg("fine")])
    await store.receive(T1, q("orders"), 1)
    clock.advance(2)
    assert [m.body for m in await store.receive(T1, q("orders"), 10)] == [b"fine"]
    clock.advance(3600)
    everywhere = await receive_all(store, T1, "dlq") + await receive_all(store, T1, "orders")
    assert sorted(m.body for m in everywhere).count(b"poison") == 1


async def test_retention_in_a_dead_letter_queue_counts_from_the_original_send(
    store: Backend, clock: ManualClock
) -> None:
    # SQS: a message's expiry always follows its original enqueue time, also after a move.
    # Here the moved message is older than one sent straight to the DLQ before it arrived.
    await store.create_queue(T1, q("dlq"), {"retention_s": 100})
    await store.create_queue(
        T1, q("orders"), {"visibility_timeout_s": 1, "max_receives": 1, "dead_letter_queue": "dlq"}
    )
    await send_one(store, T1, "orders", "old, moved later")
    await store.receive(T1, q("orders"), 1)
    clock.advance(30)
    await send_one(store, T1, "dlq", "young, sent directly")
    clock.advance(2)
    assert await store.receive(T1, q("orders"), 1) == []  # moves the old one
    clock.advance(69)  # the moved message is 101 s old, the direct one 71 s

    async def only_the_young_one_left() -> bool:
        stats = (await store.get_queue(T1, q("dlq"))).stats
        return stats.visible + stats.in_flight + stats.delayed == 1

    await wait_for(only_the_young_one_left, what="the retention sweep of the dead-letter queue")
    assert [m.body for m in await receive_all(store, T1, "dlq")] == [b"young, sent directly"]


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


async def test_dead_letters_stay_readable_where_they_went_when_the_source_changes_its_dlq(
    store: Backend, clock: ManualClock
) -> None:
    # SQS: a message moved to a dead-letter queue is that queue's; pointing the source at
    # another queue later (or at none) does not take it away from there.
    for name in ("old-dlq", "new-dlq"):
        await store.create_queue(T1, q(name), {})
    poison = {"visibility_timeout_s": 1, "max_receives": 1}
    await store.create_queue(T1, q("orders"), {**poison, "dead_letter_queue": "old-dlq"})

    async def dead_letter(body: str) -> None:
        await send_one(store, T1, "orders", body)
        assert len(await store.receive(T1, q("orders"), 1)) == 1
        clock.advance(2)
        assert await store.receive(T1, q("orders"), 1) == []  # moved, not delivered

    await dead_letter("first")
    await store.update_queue(T1, q("orders"), {"dead_letter_queue": "new-dlq"})
    await dead_letter("second")
    assert (await store.get_queue(T1, q("old-dlq"))).stats.visible == 1
    [old] = await store.receive(T1, q("old-dlq"), 10, visibility_timeout_s=60)
    [new] = await store.receive(T1, q("new-dlq"), 10)
    assert (old.body, new.body) == (b"first", b"second")

    # Without a dead-letter queue at all: still there, and still settles where it is.
    await store.update_queue(T1, q("orders"), {"dead_letter_queue": None, "max_receives": None})
    await store.nack(T1, [old.receipt])
    [again] = await store.receive(T1, q("old-dlq"), 10)
    assert again.body == b"first" and again.receive_count == 2
    await store.ack(T1, [again.receipt])
    assert (await store.get_queue(T1, q("old-dlq"))).stats.visible == 0

    # Deleted and made again under the same name: a new, empty queue that answers at once.
    await store.nack(T1, [new.receipt])
    await store.update_queue(T1, q("orders"), {**poison, "dead_letter_queue": "old-dlq"})
    await dead_letter("third")
    await store.update_queue(T1, q("orders"), {"dead_letter_queue": "new-dlq"})
    await store.delete_queue(T1, q("old-dlq"))
    await store.create_queue(T1, q("old-dlq"), {})
    assert await store.receive(T1, q("old-dlq"), 10) == []
    assert (await store.get_queue(T1, q("old-dlq"))).stats.visible == 0
    assert [m.body for m in await store.receive(T1, q("new-dlq"), 10)] == [b"second"]


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


async def test_purge_releases_fifo_groups(store: Backend) -> None:
    await store.create_queue(T1, q("f"), {"ordering": "fifo"})
    await store.send(T1, q("f"), [msg("a0", group_id="a"), msg("a1", group_id="a")])
    [a0] = await store.receive(T1, q("f"), 1)
    assert await store.purge_queue(T1, q("f")) == 2
    await store.send(T1, q("f"), [msg("a2", group_id="a")])
    # The purged in-flight head no longer blocks its group.
    assert [m.body for m in await store.receive(T1, q("f"), 10)] == [b"a2"]
    assert (await store.ack(T1, [a0.receipt])).acked == 0


async def test_retention_releases_a_fifo_group_behind_an_expired_head(
    store: Backend, clock: ManualClock
) -> None:
    await store.create_queue(
        T1, q("f"), {"ordering": "fifo", "retention_s": 60, "visibility_timeout_s": 3600}
    )
    await send_one(store, T1, "f", "a0", group_id="a")
    [a0] = await store.receive(T1, q("f"), 1)
    clock.advance(30)
    await send_one(store, T1, "f", "a1", group_id="a")
    clock.advance(31)  # a0 is past retention (held or not), a1 is not

    async def a1_released() -> bool:
        got = await store.receive(T1, q("f"), 10)
        assert [m.body for m in got] in ([], [b"a1"])
        return bool(got)

    await wait_for(a1_released, what="the group to move past its expired head")
    assert (await store.ack(T1, [a0.receipt])).acked == 0


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


async def test_fifo_messages_without_a_group_share_one_default_group(store: Backend) -> None:
    # docs/store.md: "Messages without a group_id share one default group."
    await store.create_queue(T1, q("f"), {"ordering": "fifo"})
    results = await store.send(T1, q("f"), [msg("n0"), msg("n1"), msg("other", group_id="g")])
    assert all(isinstance(r, SendResult) for r in results), results
    first = await store.receive(T1, q("f"), 10)
    # One in flight per group: n1 waits behind n0, the named group goes on in parallel.
    assert sorted(m.body for m in first) == [b"n0", b"other"]
    assert [m.group_id for m in first if m.body == b"n0"] == [None]
    assert await store.receive(T1, q("f"), 10) == []
    await store.ack(T1, [m.receipt for m in first if m.body == b"n0"])
    assert [m.body for m in await store.receive(T1, q("f"), 10)] == [b"n1"]


async def test_a_promoted_fifo_head_keeps_its_own_delay(store: Backend, clock: ManualClock) -> None:
    # Acking a head promotes the next message of its group "now, or when its own delay
    # ends" (visibility.py): a delayed message behind a head stays hidden until its delay.
    await store.create_queue(T1, q("f"), {"ordering": "fifo"})
    await send_one(store, T1, "f", "a0", group_id="a")
    await send_one(store, T1, "f", "a1", group_id="a", delay_s=60)
    [a0] = await store.receive(T1, q("f"), 10)
    assert a0.body == b"a0"
    assert (await store.ack(T1, [a0.receipt])).acked == 1
    assert await store.receive(T1, q("f"), 10) == []
    clock.advance(59)
    assert await store.receive(T1, q("f"), 10) == []
    clock.advance(2)
    assert [m.body for m in await store.receive(T1, q("f"), 10)] == [b"a1"]


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


async def test_a_recreated_queue_forgets_the_old_dedupe_ids(store: Backend) -> None:
    await store.create_queue(T1, q("orders"), {"content_dedupe": True})
    await send_one(store, T1, "orders", "a", dedupe_id="d")
    await send_one(store, T1, "orders", "body")
    await store.delete_queue(T1, q("orders"))
    await store.create_queue(T1, q("orders"), {"content_dedupe": True})
    again = await send_one(store, T1, "orders", "a", dedupe_id="d")
    same_body = await send_one(store, T1, "orders", "body")
    assert not again.duplicate and not same_body.duplicate
    assert sorted(m.body for m in await receive_all(store, T1, "orders")) == [b"a", b"body"]


async def test_purge_keeps_the_dedupe_window_or_clears_it_consistently(store: Backend) -> None:
    # The contract leaves open whether a purge forgets dedupe ids; either way a duplicate
    # answer must point at a message id the store really issued, and nothing is stored twice.
    await store.create_queue(T1, q("orders"), {})
    first = await send_one(store, T1, "orders", "a", dedupe_id="d")
    await store.purge_queue(T1, q("orders"))
    again = await send_one(store, T1, "orders", "a", dedupe_id="d")
    if again.duplicate:
        assert (again.id, again.seq) == (first.id, first.seq)
        assert await receive_all(store, T1, "orders") == []
    else:
        assert [m.id for m in await receive_all(store, T1, "orders")] == [again.id]


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
