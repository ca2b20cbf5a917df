"""What only the embedded LMDB engine promises beyond the Backend contract.

Encryption at rest (checked on the bytes of the files), key rotation and start-up key
checks, the replication log, group commit, and a full map. The contract suite in
``test_contract.py`` covers the queue semantics.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from backend_store import Backend, Lsn, PushgateError, ReceivedMessage, SendResult, open_backend
from backend_store.backend import EarlyChanges
from backend_store.encryption import Keyring
from backend_store.errors import ConfigurationError, InvalidRequest, Unavailable
from backend_store.lmdb_store.engine import LmdbBackend
from backend_store.lmdb_store.environment import Db
from backend_store.tested_versions import ReleaseCheck
from backend_store.types import QueueName, TenantId

from ..conftest import ManualClock
from .harness import T1, T2, StoreFactory, lmdb_url, msg, ok, q, receive_all, send_one

# Backend nodes keep a replication log; a standalone store does not (replication_log_keep=0).
LOG_KEEP = 1000
MARKER = b"PLAINTEXT-MARKER-7f3a9c1e-do-not-store-me"


@pytest.fixture
async def lmdb_factory(tmp_path: Path, clock: ManualClock) -> AsyncIterator[StoreFactory]:
    factory = StoreFactory(kind="lmdb", url=lmdb_url(tmp_path), clock=clock)
    try:
        yield factory
    finally:
        await factory.close_all()


def store_bytes(root: Path) -> bytes:
    """Every byte LMDB wrote under the store directory (data and lock files)."""
    return b"".join(p.read_bytes() for p in sorted((root / "store").iterdir()) if p.is_file())


def keyring(**keys: bytes) -> Keyring:
    """A keyring whose last named key is active."""
    return Keyring(keys, active=list(keys)[-1])


def engine(store: Backend) -> LmdbBackend:
    assert isinstance(store, LmdbBackend)
    return store


# ---------------------------------------------------------------------------
# Encryption at rest
# ---------------------------------------------------------------------------


async def test_without_keyring_bodies_are_in_the_file(lmdb_factory: StoreFactory, tmp_path: Path) -> None:
    # The control for the next test: the scan below does find a plaintext body.
    store = await lmdb_factory.open()
    await store.create_queue(T1, q("orders"), {})
    await send_one(store, T1, "orders", MARKER)
    await lmdb_factory.close(store)
    assert MARKER in store_bytes(tmp_path)


async def test_with_keyring_bodies_never_reach_the_file(lmdb_factory: StoreFactory, tmp_path: Path) -> None:
    ring = keyring(k1=os.urandom(32))
    # With a replication log, so the scan also covers the copies of records it keeps.
    store = await lmdb_factory.open(ring, replication_log_keep=LOG_KEEP)
    await store.create_queue(T1, q("orders"), {"content_dedupe": True})
    await store.create_queue(T1, q("dlq"), {})
    await store.update_queue(T1, q("orders"), {"max_receives": 2, "dead_letter_queue": "dlq"})
    await send_one(store, T1, "orders", MARKER + b"-one")
    await send_one(store, T1, "orders", MARKER + b"-two", delay_s=10)
    # Walk a message through every record rewrite: receive, nack, receive, DLQ move.
    [got] = await store.receive(T1, q("orders"), 1, visibility_timeout_s=1)
    await store.nack(T1, [got.receipt])
    [got] = await store.receive(T1, q("orders"), 1, visibility_timeout_s=1)
    lmdb_factory.clock.advance(11)
    await receive_all(store, T1, "orders")
    [dead] = await store.receive(T1, q("dlq"), 1)
    assert dead.body == MARKER + b"-one"
    await lmdb_factory.close(store)

    data = store_bytes(tmp_path)
    # Not the body, nor a large piece of it (the replication log holds the same records).
    assert MARKER[:16] not in data

    store = await lmdb_factory.open(ring)
    lmdb_factory.clock.advance(3600)
    bodies = sorted(
        m.body for m in await receive_all(store, T1, "dlq") + await receive_all(store, T1, "orders")
    )
    assert bodies == [MARKER + b"-one", MARKER + b"-two"]


async def test_content_dedupe_does_not_leave_a_plain_body_hash(
    lmdb_factory: StoreFactory, tmp_path: Path
) -> None:
    # An unkeyed hash of the body lets anyone holding the file confirm a guessed body
    # ("is there a message that says 'approved'?"), which encryption at rest is meant to stop.
    ring = keyring(k1=os.urandom(32))
    store = await lmdb_factory.open(ring)
    await store.create_queue(T1, q("orders"), {"content_dedupe": True})
    body = b"approved"
    first = await send_one(store, T1, "orders", body)
    assert (await send_one(store, T1, "orders", body)).id == first.id
    await lmdb_factory.close(store)
    data = store_bytes(tmp_path)
    for name in ("sha256", "sha1", "md5", "blake2b"):
        digest = hashlib.new(name, body).digest()
        assert digest[:8] not in data, f"the file holds an unkeyed {name} of a body"


async def test_rotation_keeps_old_messages_readable(lmdb_factory: StoreFactory) -> None:
    k1, k2 = os.urandom(32), os.urandom(32)
    store = await lmdb_factory.open(keyring(k1=k1))
    await store.create_queue(T1, q("orders"), {})
    await send_one(store, T1, "orders", "sealed with k1")

    store = await lmdb_factory.reopen(store, keyring(k1=k1, k2=k2))
    await send_one(store, T1, "orders", "sealed with k2")
    assert [m.body for m in await receive_all(store, T1, "orders")] == [b"sealed with k1", b"sealed with k2"]


async def test_an_old_key_can_be_retired_once_nothing_sealed_with_it_remains(
    lmdb_factory: StoreFactory,
) -> None:
    # encryption.py: "keep the old one until the old messages are gone". Then it must be
    # possible to drop it (a leaked key has to go for good), without rewriting the store.
    k1, k2 = os.urandom(32), os.urandom(32)
    store = await lmdb_factory.open(keyring(k1=k1))
    await store.create_queue(T1, q("orders"), {})
    await send_one(store, T1, "orders", "sealed with k1")
    [old] = await store.receive(T1, q("orders"), 1)

    store = await lmdb_factory.reopen(store, keyring(k1=k1, k2=k2))
    await send_one(store, T1, "orders", "sealed with k2")
    assert (await store.ack(T1, [old.receipt])).acked == 1  # the last k1 message is gone

    store = await lmdb_factory.reopen(store, keyring(k2=k2))
    assert [m.body for m in await receive_all(store, T1, "orders")] == [b"sealed with k2"]


async def test_start_refuses_a_missing_key(lmdb_factory: StoreFactory) -> None:
    k1, k2 = os.urandom(32), os.urandom(32)
    store = await lmdb_factory.open(keyring(k1=k1))
    await store.create_queue(T1, q("orders"), {})
    await send_one(store, T1, "orders", "sealed with k1")
    await lmdb_factory.close(store)

    with pytest.raises(ConfigurationError, match="k1"):
        await lmdb_factory.open(keyring(k2=k2))
    with pytest.raises(ConfigurationError):
        await lmdb_factory.open()
    # The refusals left the store intact.
    store = await lmdb_factory.open(keyring(k1=k1))
    assert [m.body for m in await receive_all(store, T1, "orders")] == [b"sealed with k1"]


async def test_start_refuses_a_wrong_key_under_the_right_id(lmdb_factory: StoreFactory) -> None:
    store = await lmdb_factory.open(keyring(k1=os.urandom(32)))
    await store.create_queue(T1, q("orders"), {})
    await send_one(store, T1, "orders", "secret")
    await lmdb_factory.close(store)
    with pytest.raises(ConfigurationError):
        await lmdb_factory.open(keyring(k1=os.urandom(32)))


async def test_a_failed_start_leaves_nothing_running(lmdb_factory: StoreFactory) -> None:
    store = await lmdb_factory.open(keyring(k1=os.urandom(32)))
    await lmdb_factory.close(store)
    backend = open_backend(lmdb_factory.url, lmdb_factory.options())
    with pytest.raises(ConfigurationError):
        await backend.start()
    with pytest.raises(Unavailable):
        await backend.send(T1, q("orders"), [msg("x")])


# ---------------------------------------------------------------------------
# Embedded limits
# ---------------------------------------------------------------------------


async def test_embedded_store_accepts_only_replication_factor_one(lmdb_factory: StoreFactory) -> None:
    store = await lmdb_factory.open()
    await store.create_queue(T1, q("one"), {"replication_factor": 1})
    with pytest.raises(InvalidRequest):
        await store.create_queue(T1, q("three"), {"replication_factor": 3})
    with pytest.raises(InvalidRequest):
        await store.update_queue(T1, q("one"), {"replication_factor": 2})


# ---------------------------------------------------------------------------
# Replication log
# ---------------------------------------------------------------------------


async def test_each_commit_gets_the_next_lsn(lmdb_factory: StoreFactory) -> None:
    store = engine(await lmdb_factory.open(replication_log_keep=LOG_KEEP))
    start = store.last_lsn
    await store.create_queue(T1, q("orders"), {})
    after_create = store.last_lsn
    assert after_create > start
    for i in range(5):
        await send_one(store, T1, "orders", f"m{i}")
    assert store.last_lsn == after_create + 5

    entries = await store.read_replication_log(start)
    assert [e.lsn for e in entries] == list(range(start + 1, store.last_lsn + 1))
    assert all(isinstance(e.record, bytes) and e.record for e in entries)
    # Reads commit nothing.
    await store.get_queue(T1, q("orders"))
    await store.list_queues(T1)
    assert store.last_lsn == after_create + 5
    # Paging.
    first_two = await store.read_replication_log(start, limit=2)
    assert [e.lsn for e in first_two] == [start + 1, start + 2]
    assert await store.read_replication_log(store.last_lsn) == []


async def test_a_standalone_store_numbers_batches_but_keeps_no_log(lmdb_factory: StoreFactory) -> None:
    store = engine(await lmdb_factory.open())
    await store.create_queue(T1, q("orders"), {})
    await send_one(store, T1, "orders", "a")
    assert store.last_lsn >= 2
    assert await store.read_replication_log(Lsn(0)) == []
    assert await store.first_retained_lsn() is None


async def test_lsn_survives_reopen(lmdb_factory: StoreFactory) -> None:
    store = engine(await lmdb_factory.open())
    await store.create_queue(T1, q("orders"), {})
    await send_one(store, T1, "orders", "a")
    last = store.last_lsn
    store = engine(await lmdb_factory.reopen(store))
    assert store.last_lsn == last
    await send_one(store, T1, "orders", "b")
    assert store.last_lsn == last + 1


async def test_concurrent_sends_share_lsns(lmdb_factory: StoreFactory) -> None:
    store = engine(await lmdb_factory.open())
    await store.create_queue(T1, q("orders"), {})
    before = store.last_lsn
    await asyncio.gather(*(send_one(store, T1, "orders", f"m{i}") for i in range(200)))
    # Group commit: one LSN per committed batch, not per send.
    assert 0 < store.last_lsn - before < 200


async def test_log_is_trimmed_to_the_newest_entries(lmdb_factory: StoreFactory) -> None:
    store = engine(await lmdb_factory.open(replication_log_keep=5))
    await store.create_queue(T1, q("orders"), {})
    for i in range(20):
        await send_one(store, T1, "orders", f"m{i}")
    first = await store.first_retained_lsn()
    assert first == store.last_lsn - 5 + 1
    entries = await store.read_replication_log(Lsn(0))
    assert [e.lsn for e in entries] == list(range(first, store.last_lsn + 1))


async def test_a_follower_replaying_the_log_ends_up_equal(tmp_path: Path, clock: ManualClock) -> None:
    leader_factory = StoreFactory(kind="lmdb", url=lmdb_url(tmp_path / "leader"), clock=clock)
    follower_factory = StoreFactory(kind="lmdb", url=lmdb_url(tmp_path / "follower"), clock=clock)
    try:
        leader = engine(await leader_factory.open(replication_log_keep=LOG_KEEP))
        follower = engine(await follower_factory.open(replication_log_keep=LOG_KEEP))
        assert follower.last_lsn == 0, (
            "a fresh store must not have logged anything a leader's log would clash with"
        )

        await leader.create_queue(T1, q("orders"), {"visibility_timeout_s": 50})
        await leader.create_queue(T1, q("f"), {"ordering": "fifo"})
        await leader.send(T1, q("orders"), [msg(f"m{i}", dedupe_id=f"d{i}") for i in range(10)])
        await leader.send(T1, q("f"), [msg("f0", group_id="g"), msg("f1", group_id="g")])
        got = await leader.receive(T1, q("orders"), 3)
        await leader.ack(T1, [got[0].receipt])
        await leader.nack(T1, [got[1].receipt], delay_s=5)
        await leader.meta_put("tenants", "acme", b"{}")

        for entry in await leader.read_replication_log(Lsn(0), limit=10_000):
            await follower.apply_replicated([entry])
        assert follower.last_lsn == leader.last_lsn

        assert await follower.list_queues(T1) == await leader.list_queues(T1)
        assert await follower.meta_get("tenants", "acme") == b"{}"
        # got[2] is in flight on both: its receipt works on the follower.
        assert (await follower.ack(T1, [got[2].receipt])).acked == 1
        clock.advance(6)
        bodies = sorted(m.body for m in await receive_all(follower, T1, "orders"))
        assert bodies == sorted(f"m{i}".encode() for i in range(1, 10) if i != 2)
        dup = await send_one(follower, T1, "orders", "m5", dedupe_id="d5")
        assert dup.duplicate
    finally:
        await leader_factory.close_all()
        await follower_factory.close_all()


async def test_a_gap_in_the_log_is_refused(tmp_path: Path, clock: ManualClock) -> None:
    leader_factory = StoreFactory(kind="lmdb", url=lmdb_url(tmp_path / "leader"), clock=clock)
    follower_factory = StoreFactory(kind="lmdb", url=lmdb_url(tmp_path / "follower"), clock=clock)
    try:
        leader = engine(await leader_factory.open(replication_log_keep=LOG_KEEP))
        follower = engine(await follower_factory.open(replication_log_keep=LOG_KEEP))
        await leader.create_queue(T1, q("orders"), {})
        await send_one(leader, T1, "orders", "a")
        entries = await leader.read_replication_log(Lsn(0))
        assert len(entries) >= 2
        with pytest.raises(PushgateError):
            await follower.apply_replicated([entries[1]])
        assert follower.last_lsn == 0
    finally:
        await leader_factory.close_all()
        await follower_factory.close_all()


# ---------------------------------------------------------------------------
# Group commit
# ---------------------------------------------------------------------------


# py-lmdb as a release the journal's meta-page handling was not tested with.
UNTESTED_LMDB = ReleaseCheck(lambda distribution: "99.0")


def counted_syncs(store: LmdbBackend, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the writer's explicit syncs of ``store``'s environment (one fdatasync each)."""
    env = store._require_env()
    calls: list[int] = []
    sync = env.sync

    def counted() -> None:
        sync()
        calls.append(1)

    monkeypatch.setattr(env, "sync", counted)
    return calls


async def test_commits_are_synced_and_receives_only_sync_their_data(
    lmdb_factory: StoreFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The crash tests kill the process, not the machine: the page cache survives SIGKILL, so
    # they cannot tell a synced commit from an unsynced one. Guard the flags and the syncs.
    # A standalone store that does not journal (an LMDB release the journal's checkpoints
    # were not tested with; test_journal.py has the journaling store): LMDB syncs each
    # commit's data pages, not its meta page (a machine crash can undo, never corrupt); the
    # writer syncs every batch but one of receives only (docs/store.md, "Durability"),
    # before any caller hears of it.
    store = engine(await lmdb_factory.open(releases=UNTESTED_LMDB))
    flags = store._require_env().env.flags()
    assert flags["sync"] and not flags["metasync"], flags
    # writemap is fine with sync; writemap with map_async flushes asynchronously.
    assert not (flags["writemap"] and flags["map_async"]), flags
    await store.create_queue(T1, q("a"), {})
    syncs = counted_syncs(store, monkeypatch)
    await send_one(store, T1, q("a"), "m1")
    await send_one(store, T1, q("a"), "m2")
    assert len(syncs) == 2  # each send was synced before it returned
    got = await store.receive(T1, q("a"), 1, 30)
    held = await store.receive_in_memory(T1, q("a"), 1, 30)
    assert len(got) == len(held) == 1
    assert len(syncs) == 2  # receives: their data pages only
    await store.nack(T1, [got[0].receipt])
    await store.ack(T1, [held[0].receipt])
    assert len(syncs) == 4


async def test_under_load_a_commit_is_made_durable_by_the_next_ones_data_sync(
    lmdb_factory: StoreFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A commit syncs its data pages, and with them the meta page of the commit before it: a
    # writer with more to commit tells a batch's callers after the next commit, instead of
    # syncing each meta page alone (group_commit.py, _settle). Idle, it syncs at once (above).
    store = engine(await lmdb_factory.open(max_batch=5, releases=UNTESTED_LMDB))
    await store.create_queue(T1, q("a"), {})
    syncs = counted_syncs(store, monkeypatch)
    writer = store._writer
    assert writer is not None
    batches = writer.batches
    results = await asyncio.gather(*(send_one(store, T1, q("a"), f"m{i}") for i in range(200)))
    commits = writer.batches - batches
    assert len({r.id for r in results}) == 200
    assert commits >= 40  # at most five sends a commit
    assert 1 <= len(syncs) < commits / 2
    got = await receive_all(store, T1, "a")
    assert len(got) == 200


async def test_the_event_loop_thread_never_calls_into_lmdb(lmdb_factory: StoreFactory) -> None:
    # Issue 3: "the event loop is never blocked by LMDB or fsync". A profile hook on this
    # (the loop's) thread records every call into py-lmdb while a mixed workload runs; reads
    # and writes must all happen on worker threads.
    import lmdb

    store = await lmdb_factory.open()
    lmdb_types = (lmdb.Environment, lmdb.Transaction, lmdb.Cursor)
    on_loop: list[str] = []

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "c_call" and isinstance(getattr(arg, "__self__", None), lmdb_types):
            on_loop.append(arg.__qualname__)

    sys.setprofile(profile)
    try:
        await store.create_queue(T1, q("orders"), {"content_dedupe": True})
        await store.send(T1, q("orders"), [msg(f"m{i}") for i in range(20)])
        got = await store.receive(T1, q("orders"), 10)
        await store.ack(T1, [m.receipt for m in got[:5]])
        await store.nack(T1, [m.receipt for m in got[5:]])
        await store.change_visibility(
            T1, q("orders"), (await store.receive(T1, q("orders"), 1))[0].receipt, 5
        )
        await store.get_queue(T1, q("orders"))
        await store.list_queues(T1)
        await store.next_visible_at(T1, q("orders"))
        await store.meta_put("ns", "k", b"v")
        await store.meta_get("ns", "k")
        await store.meta_list("ns")
        await store.check_writable()
    finally:
        sys.setprofile(None)
    assert on_loop == [], f"LMDB called on the event loop thread: {sorted(set(on_loop))}"


async def test_group_commit_batches_concurrent_operations(lmdb_factory: StoreFactory) -> None:
    # No sweeper: its commits would blur the count.
    store = engine(await lmdb_factory.open(sweep_interval_s=0))
    await store.create_queue(T1, q("orders"), {})
    before = store.stats["batches"]
    await asyncio.gather(*(send_one(store, T1, "orders", f"m{i}") for i in range(200)))
    assert store.stats["batches"] - before < 200


@pytest.mark.parametrize("served", [False, True], ids=["woken", "delivered"])
async def test_a_commit_wakes_or_delivers_before_its_senders_resume(
    lmdb_factory: StoreFactory, served: bool
) -> None:
    """What a commit's signal starts on the loop (the push frame's write after a standing
    receive's delivery; a task a wake-up wakes, such as the broadcaster that tells other
    gateways through Redis) runs before the code awaiting the send resumes (the HTTP reply
    with its records): a commit's push never waits behind its reply. A standing receive that
    takes everything the commit made visible is its one signal: no wake-up besides."""
    store = engine(await lmdb_factory.open(sweep_interval_s=0))
    await store.create_queue(T1, q("jobs"), {})
    loop = asyncio.get_running_loop()
    order: list[str] = []
    wake_sender = asyncio.Event()

    async def sender() -> None:
        await wake_sender.wait()
        order.append("woken task")

    task = asyncio.create_task(sender())
    await asyncio.sleep(0)  # the task waits on its event

    def woken(tenant: TenantId, queue: QueueName) -> None:
        # As the gateway's wake-ups to other gateways go: gathered for the loop turn, then
        # handed to the broadcaster's task.
        loop.call_soon(order.append, "wake-up's work")
        loop.call_soon(wake_sender.set)

    def delivered(messages: list[ReceivedMessage]) -> None:
        loop.call_soon(order.append, "delivery's work")

    store.add_listener(woken)
    if served:
        store.set_demand(T1, q("jobs"), 10, 60, delivered)
    await send_one(store, T1, "jobs", "a")
    order.append("sender resumed")
    if served:
        assert order == ["delivery's work", "sender resumed"]
        task.cancel()
    else:
        await task
        assert sorted(order[:2]) == ["wake-up's work", "woken task"]
        assert order[2:] == ["sender resumed"]


async def test_max_batch_one_commits_each_operation_alone(lmdb_factory: StoreFactory) -> None:
    # The benchmark's baseline: the same engine with one sync per operation.
    store = engine(await lmdb_factory.open(max_batch=1, sweep_interval_s=0))
    await store.create_queue(T1, q("orders"), {})
    before = store.stats["batches"]
    await asyncio.gather(*(send_one(store, T1, "orders", f"m{i}") for i in range(50)))
    assert store.stats["batches"] - before == 50


# ---------------------------------------------------------------------------
# A full map
# ---------------------------------------------------------------------------


async def test_map_grows_when_it_can(lmdb_factory: StoreFactory) -> None:
    store = await lmdb_factory.open(map_size=1 << 20, max_map_size=64 << 20)
    await store.create_queue(T1, q("big"), {"max_message_bytes": 1 << 20})
    body = os.urandom(256 << 10)
    for _ in range(16):  # 4 MiB into a 1 MiB map
        await send_one(store, T1, "big", body, is_text=False)
    assert len(await receive_all(store, T1, "big")) == 16


async def test_map_grows_under_concurrent_readers(lmdb_factory: StoreFactory) -> None:
    # Growing the map needs no open read transaction in this process; readers must wait
    # for it, not crash or see MDB_MAP_RESIZED.
    store = await lmdb_factory.open(map_size=1 << 20, max_map_size=256 << 20)
    await store.create_queue(T1, q("big"), {"max_message_bytes": 1 << 20})
    body = os.urandom(64 << 10)
    writing = True

    async def reader() -> int:
        reads = 0
        while True:  # at least once, however fast the writes go
            await store.get_queue(T1, q("big"))
            await store.list_queues(T1)
            await store.meta_get("ns", "k")
            await store.next_visible_at(T1, q("big"))
            reads += 1
            if not writing:
                return reads

    readers = [asyncio.ensure_future(reader()) for _ in range(4)]
    try:
        sends = [store.send(T1, q("big"), [msg(body, is_text=False)] * 4) for _ in range(50)]
        results = [ok(r) for rs in await asyncio.gather(*sends) for r in rs]  # 12.5 MiB
    finally:
        writing = False
        reads = await asyncio.gather(*readers)
    assert sum(reads) >= len(readers)
    assert len(results) == 200
    got = await receive_all(store, T1, "big")
    assert len(got) == 200 and all(m.body == body for m in got)


async def test_a_closed_store_answers_unavailable(lmdb_factory: StoreFactory) -> None:
    store = await lmdb_factory.open()
    await store.create_queue(T1, q("orders"), {})
    await lmdb_factory.close(store)
    for call in (
        store.check_writable(),
        store.send(T1, q("orders"), [msg("a")]),
        store.receive(T1, q("orders"), 1),
        store.get_queue(T1, q("orders")),
        store.meta_get("ns", "k"),
    ):
        with pytest.raises(Unavailable):
            await call


async def test_full_map_is_unavailable_and_keeps_reads_and_acks(lmdb_factory: StoreFactory) -> None:
    store = await lmdb_factory.open(map_size=2 << 20, max_map_size=2 << 20)
    await store.create_queue(T1, q("big"), {"max_message_bytes": 1 << 20})
    body = os.urandom(64 << 10)
    stored: list[SendResult] = []
    failure: PushgateError | None = None
    for _ in range(200):  # 12.5 MiB: far past the map
        try:
            [result] = await store.send(T1, q("big"), [msg(body, is_text=False)])
        except PushgateError as exc:
            result = exc
        if isinstance(result, SendResult):
            stored.append(result)
            continue
        failure = result
        break
    assert isinstance(failure, Unavailable), f"expected unavailable, got {failure!r}"
    assert stored

    # Reads and acks still work, and every acknowledged send is there.
    got = await receive_all(store, T1, "big")
    assert {m.id for m in got} == {r.id for r in stored}
    assert all(m.body == body for m in got)
    # Nacks and visibility changes rewrite only the small state: they work on a full map
    # too (docs/store.md, "Full disk or map"), and the map is still full afterwards.
    nacked = await store.nack(T1, [m.receipt for m in got[4:6]], delay_s=3600)
    assert (nacked.acked, nacked.failed) == (2, [])
    await store.change_visibility(T1, q("big"), got[6].receipt, 3600)
    with pytest.raises(Unavailable):
        await store.send(T1, q("big"), [msg(body, is_text=False)])
    acked = await store.ack(T1, [m.receipt for m in got[:4]])
    assert acked.acked == 4
    # The nack's delay and the extension hold: nothing comes back until they end.
    assert await store.receive(T1, q("big"), 10, visibility_timeout_s=3600) == []
    # Space freed by acks is usable again.
    ok((await store.send(T1, q("big"), [msg(body, is_text=False)]))[0])
    store = await lmdb_factory.reopen(store, map_size=2 << 20, max_map_size=2 << 20)
    lmdb_factory.clock.advance(3601)  # what was received above is visible again
    assert len(await receive_all(store, T1, "big")) == len(stored) - 4 + 1


# ---------------------------------------------------------------------------
# A corrupt record
# ---------------------------------------------------------------------------


def corrupt_message(root: Path, nth: int, damage: Callable[[bytes], bytes]) -> None:
    """Rewrite the ``nth`` stored message record (in key order) of a closed store, as bad disk would."""
    import lmdb

    env = lmdb.open(str(root / "store"), max_dbs=len(Db), sync=True)
    try:
        msgs = env.open_db(Db.MSGS.name.lower().encode())
        with env.begin(write=True, db=msgs) as txn:
            key, value = list(txn.cursor())[nth]
            txn.put(key, damage(bytes(value)))
    finally:
        env.close()


def flip_last_body_bit(raw: bytes) -> bytes:
    from backend_store.lmdb_store.records import MessageRecord

    record = MessageRecord.decode(raw)
    record.body = record.body[:-1] + bytes([record.body[-1] ^ 1])
    return record.encode()


@pytest.mark.parametrize("sealed", [False, True], ids=["plain", "sealed"])
async def test_a_corrupt_record_is_skipped_and_the_queue_keeps_working(
    lmdb_factory: StoreFactory, tmp_path: Path, sealed: bool
) -> None:
    ring = keyring(k1=os.urandom(32)) if sealed else None
    store = await lmdb_factory.open(ring)
    await store.create_queue(T1, q("orders"), {})
    await store.send(T1, q("orders"), [msg("first"), msg("broken"), msg("third")])
    await lmdb_factory.close(store)
    if sealed:
        # Flip one bit of the sealed body: the record still decodes, authentication fails.
        corrupt_message(tmp_path, 1, flip_last_body_bit)
    else:
        corrupt_message(tmp_path, 1, lambda v: b"\xc1garbage")

    store = await lmdb_factory.open(ring)
    got = await receive_all(store, T1, "orders")
    assert [m.body for m in got] == [b"first", b"third"]
    assert (await store.ack(T1, [m.receipt for m in got])).acked == 2
    await send_one(store, T1, "orders", "after")
    assert [m.body for m in await store.receive(T1, q("orders"), 10)] == [b"after"]
    await store.get_queue(T1, q("orders"))
    await store.list_queues(T1)


async def test_a_sealed_body_moved_into_another_tenants_message_does_not_open(
    lmdb_factory: StoreFactory, tmp_path: Path
) -> None:
    # Someone who can write the file but holds no key copies tenant one's sealed body into a
    # message of a queue they consume from. Sealing must bind a body to its message (AES-GCM
    # associated data), or the gateway decrypts tenant one's secret for them.
    from backend_store.lmdb_store.records import MessageRecord

    ring = keyring(k1=os.urandom(32))
    store = await lmdb_factory.open(ring)
    await store.create_queue(T1, q("secrets"), {})
    await store.create_queue(T2, q("mine"), {})
    await send_one(store, T1, "secrets", "tenant one's secret")
    await send_one(store, T2, "mine", "decoy")
    await lmdb_factory.close(store)

    import lmdb

    env = lmdb.open(str(tmp_path / "store"), max_dbs=len(Db), sync=True)
    try:
        msgs = env.open_db(Db.MSGS.name.lower().encode())
        with env.begin(write=True, db=msgs) as txn:
            # Key order is (qid, seq): the secrets queue was created first.
            (_, v_secret), (k_decoy, v_decoy) = [(bytes(k), bytes(v)) for k, v in txn.cursor()]
            secret, decoy = MessageRecord.decode(v_secret), MessageRecord.decode(v_decoy)
            decoy.body = secret.body
            txn.put(k_decoy, decoy.encode())
    finally:
        env.close()

    store = await lmdb_factory.open(ring)
    got = await store.receive(T2, q("mine"), 10)
    assert b"tenant one's secret" not in [m.body for m in got]


async def test_early_listeners_hear_of_a_commit_before_its_callers_do(lmdb_factory: StoreFactory) -> None:
    # backend.EarlyChanges: other gateways on the data directory are told as the commit
    # begins (their receive waits for LMDB's one writer), so the wake-up's trip through Redis
    # overlaps the commit's fsyncs (push through a second gateway +0.8 -> +0.4 ms).
    store = engine(await lmdb_factory.open())
    assert isinstance(store, EarlyChanges)
    await store.create_queue(T1, q("a"), {})
    heard: list[str] = []
    store.add_early_listener(lambda tenant, queue: heard.append(f"early {tenant}/{queue}"))
    store.add_listener(lambda tenant, queue: heard.append(f"after {tenant}/{queue}"))
    await send_one(store, T1, q("a"), "m")
    heard.append("sent")
    assert heard == [f"early {T1}/a", f"after {T1}/a", "sent"]
    # Nothing made visible, nothing told.
    heard.clear()
    assert await store.receive(T1, q("a"), 1, 30)
    assert heard == []
