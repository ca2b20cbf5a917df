"""The retention sweep over many queues (issue 49): small transactions that go on where the
last one stopped, and empty queues not visited at all.

A sweep of 10,000 queues in one transaction held the writer, and every send behind it, for
0.3-0.7 s each sweep interval (session 62). The sweep now visits at most ``SWEEP_QUEUES``
queues a transaction; a queue past that is still swept in the same ``sweep()``. It finds
the queues through their messages (session 64): an empty queue costs a sweep nothing. A queue
it found with nothing due is passed until its oldest message comes due (session 67,
``sweep_memo.py``), without decoding anything while its record is unchanged, and without a
full visit while only sends, receives and acks changed it (session 68): a lowered retention
or an older message moved in is swept on time all the same.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from backend_store.lmdb_store import message_ops
from backend_store.lmdb_store.engine import LmdbBackend
from backend_store.lmdb_store.environment import Writes
from backend_store.lmdb_store.message_ops import SWEEP_QUEUES
from backend_store.lmdb_store.records import DeliveryState, QueueRecord

from ..conftest import ManualClock
from .harness import T1, StoreFactory, lmdb_url, msg, ok, q, receive_all, send_one


@pytest.fixture
async def store(tmp_path: Path, clock: ManualClock) -> AsyncIterator[LmdbBackend]:
    factory = StoreFactory(kind="lmdb", url=lmdb_url(tmp_path), clock=clock, sweep_interval_s=0)
    try:
        opened = await factory.open()
        assert isinstance(opened, LmdbBackend)
        yield opened
    finally:
        await factory.close_all()


async def test_a_sweep_past_one_transactions_queues_reaches_every_queue(
    store: LmdbBackend, clock: ManualClock
) -> None:
    names = [q(f"inbox-{i:04d}") for i in range(SWEEP_QUEUES + 20)]
    for name in names:
        await store.create_queue(T1, name, {"retention_s": 60})
        ok((await store.send(T1, name, [msg("old")]))[0])
    clock.advance(30)
    young = ok((await store.send(T1, names[-1], [msg("young")]))[0])
    clock.advance(40)  # every "old" is 70 s old, "young" 40 s
    writer = store._writer
    assert writer is not None
    before = writer.operations
    assert await store.sweep() == len(names)
    assert writer.operations - before >= 2  # more than one transaction
    for name in (names[0], names[SWEEP_QUEUES - 1], names[SWEEP_QUEUES]):
        info = await store.get_queue(T1, name)
        assert (info.stats.visible, info.stats.oldest_age_s) == (0, None)
    assert [p.id for p in await store.peek(T1, names[-1], 10)] == [young.id]
    assert await store.sweep() == 0


async def test_empty_queues_cost_a_sweep_nothing(store: LmdbBackend, clock: ManualClock) -> None:
    names = [q(f"inbox-{i:04d}") for i in range(2 * SWEEP_QUEUES)]
    for name in names:
        await store.create_queue(T1, name, {"retention_s": 60})
    # The first, a middle and the last queue by id hold messages; the others stay empty.
    holding = [names[0], names[SWEEP_QUEUES], names[-1]]
    for name in holding:
        ok((await store.send(T1, name, [msg("old"), msg("older")]))[0])
    clock.advance(61)
    writer = store._writer
    assert writer is not None
    before = writer.operations
    assert await store.sweep() == 2 * len(holding)
    # One transaction: the 997 empty queues were not visited (each counted towards the
    # transaction's SWEEP_QUEUES when every queue record was read).
    assert writer.operations - before == 1
    for name in holding:
        assert (await store.get_queue(T1, name)).stats.visible == 0
    empty = await store.get_queue(T1, names[1])
    assert (empty.stats.visible, empty.stats.in_flight, empty.stats.oldest_age_s) == (0, 0, None)


async def test_a_queue_with_more_expired_messages_than_a_transaction_drops_is_swept_whole(
    store: LmdbBackend, clock: ManualClock
) -> None:
    # 1,000 deletions a transaction: the next one goes on at the same queue.
    await store.create_queue(T1, q("a"), {"retention_s": 60})
    await store.create_queue(T1, q("b"), {"retention_s": 60})
    for start in range(0, 1_050, 50):
        await store.send(T1, q("a"), [msg(f"m{i}") for i in range(start, start + 50)])
    await store.send(T1, q("b"), [msg("b")])
    clock.advance(61)
    assert await store.sweep() == 1_051
    for name in ("a", "b"):
        assert (await store.get_queue(T1, q(name))).stats.visible == 0


async def test_queues_with_nothing_due_are_passed_without_reading_their_records(
    store: LmdbBackend, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    names = [q(f"inbox-{i:04d}") for i in range(SWEEP_QUEUES + 20)]
    for name in names:
        await store.create_queue(T1, name, {"retention_s": 60})
        ok((await store.send(T1, name, [msg("waiting")]))[0])
    assert await store.sweep() == 0  # visits each queue once, and remembers it
    decoded: list[bytes] = []
    real = QueueRecord.decode

    def counted(raw: bytes) -> QueueRecord:
        decoded.append(raw)
        return real(raw)

    monkeypatch.setattr(QueueRecord, "decode", staticmethod(counted))
    clock.advance(30)
    decoded.clear()
    assert await store.sweep() == 0
    assert decoded == []  # nothing changed: no record decoded
    clock.advance(31)  # every "waiting" is 61 s old
    assert await store.sweep() == len(names)
    assert len(decoded) == len(names)


async def test_queues_that_took_sends_are_not_visited_again_until_due(
    store: LmdbBackend, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Under sends every queue's record changes between passes (next_seq, count): a message
    # sent now is never older than the oldest there, so the queue's moment stands.
    names = [q(f"inbox-{i:04d}") for i in range(50)]
    for name in names:
        await store.create_queue(T1, name, {"retention_s": 60})
        ok((await store.send(T1, name, [msg("waiting")]))[0])
    assert await store.sweep() == 0
    visits: list[int] = []
    real = message_ops._past_retention

    def counted(
        w: Writes, qid: int, cutoff: float, limit: int
    ) -> tuple[list[tuple[int, DeliveryState]], int | None]:
        visits.append(qid)
        return real(w, qid, cutoff, limit)

    monkeypatch.setattr(message_ops, "_past_retention", counted)
    clock.advance(30)
    for name in names:
        ok((await store.send(T1, name, [msg("young")]))[0])
    assert await store.sweep() == 0
    assert visits == []
    clock.advance(31)  # every "waiting" is 61 s old, every "young" 31 s
    assert await store.sweep() == len(names)
    assert len(visits) == len(names)
    for name in (names[0], names[-1]):
        assert [m.body for m in await receive_all(store, T1, name)] == [b"young"]


async def test_a_lowered_retention_applies_at_the_next_sweep(store: LmdbBackend, clock: ManualClock) -> None:
    await store.create_queue(T1, q("inbox"), {"retention_s": 3600})
    await send_one(store, T1, "inbox", "old")
    assert await store.sweep() == 0  # due in an hour, as far as this sweep knows
    await store.update_queue(T1, q("inbox"), {"retention_s": 60})
    clock.advance(61)
    assert await store.sweep() == 1
    assert (await store.get_queue(T1, q("inbox"))).stats.visible == 0


async def test_a_queue_made_again_under_its_name_is_swept_by_its_own_retention(
    store: LmdbBackend, clock: ManualClock
) -> None:
    await store.create_queue(T1, q("inbox"), {"retention_s": 3600})
    await send_one(store, T1, "inbox", "first")
    assert await store.sweep() == 0
    await store.delete_queue(T1, q("inbox"))
    await store.create_queue(T1, q("inbox"), {"retention_s": 60})
    await send_one(store, T1, "inbox", "second")
    clock.advance(61)
    assert await store.sweep() == 1


async def test_an_older_message_moved_in_after_a_sweep_is_dropped_on_its_own_time(
    store: LmdbBackend, clock: ManualClock
) -> None:
    await store.create_queue(T1, q("dlq"), {"retention_s": 100})
    await store.create_queue(
        T1, q("orders"), {"visibility_timeout_s": 1, "max_receives": 1, "dead_letter_queue": "dlq"}
    )
    await send_one(store, T1, "orders", "old, moved later")
    await store.receive(T1, q("orders"), 1)
    clock.advance(30)
    await send_one(store, T1, "dlq", "young, sent directly")
    assert await store.sweep() == 0  # the dead-letter queue's oldest is due at 130 s
    clock.advance(2)
    assert await store.receive(T1, q("orders"), 1) == []  # moves the one sent at 0 s
    clock.advance(69)  # 101 s: the moved message is past retention, the direct one is not
    assert await store.sweep() == 1
    assert [m.body for m in await receive_all(store, T1, "dlq")] == [b"young, sent directly"]
