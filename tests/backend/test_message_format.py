"""How a message is stored: no state record until its state first changes.

docs/store.md, "How a message is stored": a send writes the message record only, carrying
the message's initial state (sent_at, group_id, visible_ms); a state record appears when
the state first changes and wins over the record's. Everything that reads states (receive,
stats, peek, retention sweeps, FIFO promotion, receipts) must see a message without one,
and a store written before (every message with a state record, records without the initial
state) must keep working, so these tests also rewrite a store into that older layout.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import lmdb
import msgpack
import pytest

from backend_store import Backend
from backend_store.errors import ConfigurationError
from backend_store.lmdb_store.engine import STORE_FORMAT, LmdbBackend
from backend_store.lmdb_store.environment import Db

from ..conftest import ManualClock
from .harness import T1, StoreFactory, in_memory, lmdb_url, msg, ok, q


@pytest.fixture
async def factory(tmp_path: Path, clock: ManualClock) -> AsyncIterator[StoreFactory]:
    # No background sweeps: the tests sweep when they mean to.
    made = StoreFactory(kind="lmdb", url=lmdb_url(tmp_path), clock=clock, sweep_interval_s=0)
    try:
        yield made
    finally:
        await made.close_all()


def _open_env(root: Path) -> lmdb.Environment:
    return lmdb.open(str(root / "store"), max_dbs=len(Db), sync=True)


def _db(env: lmdb.Environment, db: Db) -> Any:
    return env.open_db(db.name.lower().encode())


def state_records(root: Path) -> dict[bytes, list[Any]]:
    """The state records of a closed store, decoded."""
    env = _open_env(root)
    try:
        with env.begin(db=_db(env, Db.STATE)) as txn:
            return {bytes(k): msgpack.unpackb(v) for k, v in txn.cursor()}
    finally:
        env.close()


def rewrite_as_written_before(root: Path) -> int:
    """Rewrite a closed store the way the store wrote messages before 2026-11-23: message
    records of five fields, a state record for every message, and index entries with empty
    values. Returns how many messages had no state record."""
    env = _open_env(root)
    added = 0
    try:
        msgs, states, index = _db(env, Db.MSGS), _db(env, Db.STATE), _db(env, Db.VIS)
        with env.begin(write=True) as txn:
            for key, _ in list(txn.cursor(db=index)):
                txn.put(key, b"", db=index)
            for key, raw in list(txn.cursor(db=msgs)):
                fields: list[Any] = msgpack.unpackb(raw)
                assert len(fields) == 8, "a record of this version carries its initial state"
                sent_at, group_id, visible_ms = fields[5:]
                txn.put(key, msgpack.packb(fields[:5]), db=msgs)
                if txn.get(key, db=states) is None:
                    old_state = [sent_at, group_id, visible_ms, 0, None, "n", False]
                    txn.put(key, msgpack.packb(old_state), db=states)
                    added += 1
    finally:
        env.close()
    return added


def lmdb_store(store: Backend) -> LmdbBackend:
    assert isinstance(store, LmdbBackend)
    return store


async def test_a_send_writes_no_state_record_and_every_reader_still_sees_the_message(
    factory: StoreFactory, tmp_path: Path, clock: ManualClock
) -> None:
    store = lmdb_store(await factory.open())
    await store.create_queue(T1, q("jobs"), {"retention_s": 60})
    sent = [ok(r) for r in await store.send(T1, q("jobs"), [msg("a"), msg("b"), msg("c", delay_s=30)])]
    await factory.close(store)
    assert state_records(tmp_path) == {}

    store = lmdb_store(await factory.open())
    clock.advance(5)
    stats = (await store.get_queue(T1, q("jobs"))).stats
    assert (stats.visible, stats.delayed, stats.in_flight, stats.oldest_age_s) == (2, 1, 0, 5)
    peeked = await store.peek(T1, q("jobs"), 10)
    assert [(p.id, p.state, p.receive_count) for p in peeked] == [
        (sent[0].id, "visible", 0),
        (sent[1].id, "visible", 0),
        (sent[2].id, "delayed", 0),
    ]
    # Past retention, the sweep finds them all (it walks the message records).
    clock.advance(56)
    assert await store.sweep() == 3
    stats = (await store.get_queue(T1, q("jobs"))).stats
    assert (stats.visible, stats.delayed, stats.oldest_age_s) == (0, 0, None)


async def test_a_first_state_change_writes_the_state_record_and_the_ack_removes_it(
    factory: StoreFactory, tmp_path: Path, clock: ManualClock
) -> None:
    store = lmdb_store(await factory.open())
    await store.create_queue(T1, q("jobs"), {})
    await store.send(T1, q("jobs"), [msg("held"), msg("written")])
    [held] = await in_memory(store).receive_in_memory(T1, q("jobs"), 1)
    [written] = await store.receive(T1, q("jobs"), 1, visibility_timeout_s=60)
    await factory.close(store)  # a clean close writes the held delivery's count
    assert sorted(s[3] for s in state_records(tmp_path).values()) == [1, 1]

    store = lmdb_store(await factory.open())
    peeked = {p.id: (p.state, p.receive_count) for p in await store.peek(T1, q("jobs"), 10)}
    assert peeked == {held.id: ("visible", 1), written.id: ("in_flight", 1)}
    assert (await store.ack(T1, [written.receipt])).acked == 1
    [again] = await store.receive(T1, q("jobs"), 10)
    assert (again.id, again.receive_count) == (held.id, 2)
    assert (await store.ack(T1, [again.receipt])).acked == 1
    await factory.close(store)
    assert state_records(tmp_path) == {}


async def test_a_store_written_before_still_reads_receives_nacks_acks_and_sweeps(
    factory: StoreFactory, tmp_path: Path, clock: ManualClock
) -> None:
    store = lmdb_store(await factory.open())
    await store.create_queue(T1, q("jobs"), {"retention_s": 600})
    await store.create_queue(T1, q("ordered"), {"ordering": "fifo"})
    old = [ok(r) for r in await store.send(T1, q("jobs"), [msg("o1"), msg("o2"), msg("o3", delay_s=30)])]
    fifo = [ok(r) for r in await store.send(T1, q("ordered"), [msg(f"f{i}", group_id="g") for i in range(3)])]
    await factory.close(store)
    assert rewrite_as_written_before(tmp_path) == 6

    store = lmdb_store(await factory.open())
    clock.advance(10)
    # Messages sent by this version next to them: the two layouts in one queue.
    new = ok((await store.send(T1, q("jobs"), [msg("n1")]))[0])
    stats = (await store.get_queue(T1, q("jobs"))).stats
    assert (stats.visible, stats.delayed, stats.oldest_age_s) == (3, 1, 10)
    assert [p.id for p in await store.peek(T1, q("jobs"), 10)] == [*(s.id for s in old), new.id]

    # Receive (written and held), nack, receive again, ack.
    [first] = await store.receive(T1, q("jobs"), 1, visibility_timeout_s=60)
    [second] = await in_memory(store).receive_in_memory(T1, q("jobs"), 1)
    assert (first.id, first.receive_count, second.id, second.receive_count) == (old[0].id, 1, old[1].id, 1)
    assert (await store.nack(T1, [first.receipt, second.receipt])).acked == 2
    again = await store.receive(T1, q("jobs"), 10, visibility_timeout_s=60)
    assert {m.id: m.receive_count for m in again} == {old[0].id: 2, old[1].id: 2, new.id: 1}
    assert (await store.ack(T1, [m.receipt for m in again])).acked == 3

    # FIFO: one head at a time; each ack promotes the next (their states are the old records).
    for expected in fifo:
        [head] = await store.receive(T1, q("ordered"), 10)
        assert head.id == expected.id
        assert (await store.ack(T1, [head.receipt])).acked == 1

    # The delayed one, past retention, is swept.
    clock.advance(600)
    assert await store.sweep() == 1
    assert (await store.get_queue(T1, q("jobs"))).stats.oldest_age_s is None
    await factory.close(store)
    assert state_records(tmp_path) == {}


async def test_a_sweep_stops_at_the_first_young_message_whichever_layout_it_has(
    factory: StoreFactory, tmp_path: Path, clock: ManualClock
) -> None:
    store = lmdb_store(await factory.open())
    await store.create_queue(T1, q("jobs"), {"retention_s": 100})
    await store.send(T1, q("jobs"), [msg("old")])
    await factory.close(store)
    rewrite_as_written_before(tmp_path)

    store = lmdb_store(await factory.open())
    clock.advance(50)
    young = ok((await store.send(T1, q("jobs"), [msg("young")]))[0])
    clock.advance(60)  # "old" is 110 s old, "young" 60 s
    assert await store.sweep() == 1
    assert [p.id for p in await store.peek(T1, q("jobs"), 10)] == [young.id]
    clock.advance(50)
    assert await store.sweep() == 1
    assert await store.peek(T1, q("jobs"), 10) == []


def _format_mark(root: Path) -> int | None:
    env = _open_env(root)
    try:
        with env.begin(db=_db(env, Db.META)) as txn:
            raw = txn.get(b"\0sys\0format")
    finally:
        env.close()
    return None if raw is None else int.from_bytes(raw, "big")


def _mark_format(root: Path, version: int | None) -> None:
    env = _open_env(root)
    try:
        with env.begin(write=True, db=_db(env, Db.META)) as txn:
            if version is None:
                txn.delete(b"\0sys\0format")
            else:
                txn.put(b"\0sys\0format", version.to_bytes(8, "big"))
    finally:
        env.close()


async def test_a_store_is_marked_with_its_format_and_one_from_a_newer_version_is_refused(
    factory: StoreFactory, tmp_path: Path
) -> None:
    """A version that cannot read what a newer one wrote must not open its store (it would
    take new messages for damaged ones and strand them): the store says its format, and a
    store of an older layout (no mark) is marked when this version opens it."""
    store = lmdb_store(await factory.open())
    await store.create_queue(T1, q("jobs"), {})
    await factory.close(store)
    assert _format_mark(tmp_path) == STORE_FORMAT
    _mark_format(tmp_path, None)  # as every store written before the mark
    store = lmdb_store(await factory.open())
    await factory.close(store)
    assert _format_mark(tmp_path) == STORE_FORMAT

    _mark_format(tmp_path, STORE_FORMAT + 1)
    with pytest.raises(ConfigurationError, match="written by a newer Pushgate"):
        await factory.open()
    assert _format_mark(tmp_path) == STORE_FORMAT + 1  # left as it was
