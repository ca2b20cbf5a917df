"""The ReplicaStore surface of the embedded LMDB engine: epochs in log entries, fencing in
storage, batched apply, truncation of an unacknowledged tail, and re-seeding from a snapshot.

Everything runs on real LMDB environments in temporary directories; "leader" and "follower"
are two stores that the test ships entries between, as a backend node will.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from backend_store import Backend, Lsn
from backend_store.backend import ReplicaStore
from backend_store.errors import PushgateError, ReplicationGap, StaleEpoch
from backend_store.lmdb_store.checkpoint import JOURNAL_SEQ
from backend_store.lmdb_store.engine import LmdbBackend
from backend_store.lmdb_store.environment import Db, View, Writes
from backend_store.types import Epoch, LogEntry

from ..conftest import ManualClock
from .harness import T1, StoreFactory, lmdb_url, msg, q, receive_all, send_one

LOG_KEEP = 1000
# Keys of the store's own bookkeeping, which differ between replicas by design.
_BOOKKEEPING = {b"\0sys\0last_lsn", b"\0sys\0epoch", JOURNAL_SEQ}


class Replicas:
    """Stores in sibling directories, each opened as a backend node opens one."""

    def __init__(self, root: Path, clock: ManualClock) -> None:
        self.root = root
        self.clock = clock
        self.factories: dict[str, StoreFactory] = {}

    def factory(self, name: str) -> StoreFactory:
        if name not in self.factories:
            # No sweeper: a follower writes only what its leader ships.
            self.factories[name] = StoreFactory(
                kind="lmdb", url=lmdb_url(self.root / name), clock=self.clock, sweep_interval_s=0
            )
        return self.factories[name]

    async def open(self, name: str, **overrides: Any) -> LmdbBackend:
        overrides.setdefault("replication_log_keep", LOG_KEEP)
        return engine(await self.factory(name).open(**overrides))

    async def close_all(self) -> None:
        for factory in self.factories.values():
            await factory.close_all()


@pytest.fixture
async def replicas(tmp_path: Path, clock: ManualClock) -> AsyncIterator[Replicas]:
    r = Replicas(tmp_path, clock)
    try:
        yield r
    finally:
        await r.close_all()


def engine(store: Backend) -> LmdbBackend:
    assert isinstance(store, LmdbBackend)
    return store


async def contents(store: LmdbBackend) -> dict[str, list[tuple[bytes, bytes]]]:
    """Every key and value of every database but the log and the replica's bookkeeping."""

    def dump(v: View) -> dict[str, list[tuple[bytes, bytes]]]:
        out: dict[str, list[tuple[bytes, bytes]]] = {}
        for db in Db:
            if db is Db.REPLOG:
                continue
            out[db.name] = [(bytes(k), bytes(val)) for k, val in v.cursor(db) if bytes(k) not in _BOOKKEEPING]
        return out

    return await store._read(dump)


async def ship(leader: LmdbBackend, follower: LmdbBackend) -> Lsn:
    """Ship everything the follower lacks in one apply (one commit), as a node does."""
    entries = await leader.read_replication_log(follower.last_lsn, limit=100_000)
    return await follower.apply_replicated(entries)


async def busy_workload(store: LmdbBackend, tag: str) -> None:
    """A bit of everything, with concurrent operations so batches hold several of them."""
    await store.create_queue(T1, q(f"w-{tag}"), {"visibility_timeout_s": 50})
    await store.create_queue(T1, q(f"f-{tag}"), {"ordering": "fifo"})
    await asyncio.gather(
        *(send_one(store, T1, f"w-{tag}", f"{tag}{i}", dedupe_id=f"{tag}-d{i}") for i in range(12)),
        send_one(store, T1, f"f-{tag}", "g0", group_id="g"),
        send_one(store, T1, f"f-{tag}", "g1", group_id="g"),
        store.meta_put("tenants", f"t-{tag}", b"{}"),
    )
    got = await store.receive(T1, q(f"w-{tag}"), 5)
    await asyncio.gather(
        store.ack(T1, [got[0].receipt, got[1].receipt]),
        store.nack(T1, [got[2].receipt], delay_s=5),
        store.meta_delete("tenants", f"t-{tag}"),
        store.receive(T1, q(f"f-{tag}"), 1),
    )
    await store.purge_queue(T1, q(f"f-{tag}"))


# ---------------------------------------------------------------------------
# Epochs in entries, and the fence
# ---------------------------------------------------------------------------


async def test_the_lmdb_engine_is_a_replica_store(replicas: Replicas) -> None:
    assert isinstance(await replicas.open("a"), ReplicaStore)


async def test_entries_carry_the_epoch_of_the_term_that_wrote_them(replicas: Replicas) -> None:
    store = await replicas.open("a")
    assert store.epoch == 0
    await store.create_queue(T1, q("orders"), {})
    assert await store.raise_epoch(Epoch(5)) == 5
    first_of_five = store.last_lsn + 1
    await send_one(store, T1, "orders", "a")
    await store.raise_epoch(Epoch(9))
    await send_one(store, T1, "orders", "b")

    entries = await store.read_replication_log(Lsn(0))
    assert [e.epoch for e in entries] == [0] * (first_of_five - 1) + [5, 9]
    # Raising the epoch writes no entry of its own.
    assert [e.lsn for e in entries] == list(range(1, store.last_lsn + 1))


async def test_the_fence_refuses_an_older_epoch_and_survives_a_restart(replicas: Replicas) -> None:
    store = await replicas.open("a")
    await store.raise_epoch(Epoch(7))
    assert await store.raise_epoch(Epoch(7)) == 7, "confirming the current term is allowed"
    with pytest.raises(StaleEpoch) as caught:
        await store.raise_epoch(Epoch(6))
    assert caught.value.code == "stale_epoch"

    store = engine(await replicas.factory("a").reopen(store, replication_log_keep=LOG_KEEP))
    assert store.epoch == 7
    with pytest.raises(StaleEpoch):
        await store.raise_epoch(Epoch(3))


async def test_a_follower_applies_a_batch_in_one_commit_and_ends_up_equal(replicas: Replicas) -> None:
    leader = await replicas.open("leader")
    follower = await replicas.open("follower")
    await leader.raise_epoch(Epoch(3))
    await busy_workload(leader, "x")

    batches_before = follower.stats["batches"]
    assert await ship(leader, follower) == leader.last_lsn
    assert follower.last_lsn == leader.last_lsn
    assert follower.epoch == 3, "the fence follows the entries a follower applies"
    assert await contents(follower) == await contents(leader)
    # Applying commits through the writer but is not a local batch: no entry of its own.
    assert follower.stats["batches"] == batches_before
    assert await follower.read_replication_log(Lsn(0), limit=100_000) == await leader.read_replication_log(
        Lsn(0), limit=100_000
    )


async def test_a_fenced_follower_refuses_a_deposed_leaders_entries(replicas: Replicas) -> None:
    old_leader = await replicas.open("old")
    follower = await replicas.open("follower")
    await old_leader.raise_epoch(Epoch(4))
    await old_leader.create_queue(T1, q("orders"), {})
    await ship(old_leader, follower)
    # A new term starts on the follower (it was told of a new leader, or became one).
    await follower.raise_epoch(Epoch(5))
    before = await contents(follower)

    await send_one(old_leader, T1, "orders", "written by a frozen leader that woke up")
    stale = await old_leader.read_replication_log(follower.last_lsn)
    with pytest.raises(StaleEpoch):
        await follower.apply_replicated(stale)
    assert follower.last_lsn == old_leader.last_lsn - 1
    assert await contents(follower) == before


async def test_a_new_leader_ships_older_terms_to_a_follower_already_fenced_at_its_term(
    replicas: Replicas,
) -> None:
    old = await replicas.open("old")
    new = await replicas.open("new")
    lagging = await replicas.open("lagging")
    await old.raise_epoch(Epoch(5))
    await old.create_queue(T1, q("orders"), {})
    await ship(old, lagging)
    for i in range(3):
        await send_one(old, T1, "orders", f"epoch5-{i}")
    await ship(old, new)  # the new leader has all of epoch 5; the lagging follower does not
    # The new term starts: the lagging follower is told of it before it has caught up.
    await new.raise_epoch(Epoch(6))
    await lagging.raise_epoch(Epoch(6))
    await send_one(new, T1, "orders", "epoch6")

    missing = await new.read_replication_log(lagging.last_lsn)
    assert [e.epoch for e in missing] == [5, 5, 5, 6]
    # Checked against the sender's term, not each entry's: epoch 5 history is taken.
    assert await lagging.apply_replicated(missing, Epoch(6)) == new.last_lsn
    assert await contents(lagging) == await contents(new)
    # The deposed leader's term is refused even for entries that would follow the log.
    await send_one(old, T1, "orders", "from the deposed leader")
    tail = await old.read_replication_log(Lsn(new.last_lsn - 1))
    with pytest.raises(StaleEpoch):
        await lagging.apply_replicated(tail, Epoch(5))
    # Entries newer than their sender are refused too.
    with pytest.raises(StaleEpoch):
        await lagging.apply_replicated([LogEntry(Lsn(lagging.last_lsn + 1), Epoch(7), b"\x90")], Epoch(6))
    # An empty shipment from a newer term raises the fence (a leader's heartbeat).
    assert await lagging.apply_replicated([], Epoch(8)) == lagging.last_lsn
    assert lagging.epoch == 8


async def test_a_refused_batch_applies_nothing_and_keeps_the_fence(replicas: Replicas) -> None:
    leader = await replicas.open("leader")
    follower = await replicas.open("follower")
    await leader.create_queue(T1, q("orders"), {})
    await leader.raise_epoch(Epoch(8))
    for i in range(3):
        await send_one(leader, T1, "orders", f"m{i}")
    entries = await leader.read_replication_log(Lsn(0))

    # A gap after two good entries of a newer epoch: nothing of the batch lands.
    with pytest.raises(ReplicationGap) as caught:
        await follower.apply_replicated([*entries[:-2], entries[-1]])
    assert caught.value.code == "replication_gap"
    assert (follower.last_lsn, follower.epoch) == (0, 0)
    # An epoch that goes down inside one batch is refused as a whole too.
    shuffled = [LogEntry(e.lsn, Epoch(8 if e.lsn == 1 else 2), e.record) for e in entries]
    with pytest.raises(StaleEpoch):
        await follower.apply_replicated(shuffled)
    assert (follower.last_lsn, follower.epoch) == (0, 0)
    # Garbage as a record.
    with pytest.raises(PushgateError):
        await follower.apply_replicated([LogEntry(Lsn(1), Epoch(8), b"\xc1 not msgpack")])
    assert (follower.last_lsn, follower.epoch) == (0, 0)

    await follower.apply_replicated(entries)
    assert (follower.last_lsn, follower.epoch) == (leader.last_lsn, 8)


# ---------------------------------------------------------------------------
# Truncation: a deposed leader rejoins as a follower
# ---------------------------------------------------------------------------


async def test_a_deposed_leader_truncates_its_unacknowledged_tail_and_rejoins(replicas: Replicas) -> None:
    old = await replicas.open("old")
    new = await replicas.open("new")
    await old.raise_epoch(Epoch(1))
    await busy_workload(old, "acked")
    await ship(old, new)
    acked_lsn = old.last_lsn
    acked_state = await contents(old)

    # The old leader commits more locally, but nobody acknowledges it before it is deposed.
    await busy_workload(old, "lost")
    await send_one(old, T1, "w-acked", "also lost")
    assert old.last_lsn > acked_lsn
    # The follower becomes leader in epoch 2 and writes on its own.
    await new.raise_epoch(Epoch(2))
    await send_one(new, T1, "w-acked", "new term")

    # The old leader learns of epoch 2 and truncates back to what the new leader had.
    await old.raise_epoch(Epoch(2))
    dropped = await old.truncate_after(Lsn(acked_lsn))
    assert dropped > 1
    assert old.last_lsn == acked_lsn
    assert old.epoch == 2, "truncation keeps the fence"
    assert await contents(old) == acked_state
    assert await old.read_replication_log(Lsn(acked_lsn)) == []

    await ship(new, old)
    assert await contents(old) == await contents(new)
    # The deposed leader's history is gone from its log; it holds the new term's entry.
    assert [e.epoch for e in await old.read_replication_log(Lsn(acked_lsn))] == [2]
    bodies = sorted(m.body for m in await receive_all(old, T1, "w-acked"))
    assert b"new term" in bodies and b"also lost" not in bodies


async def logged_tail_epoch(store: LmdbBackend) -> Epoch | None:
    entries = await store.read_replication_log(Lsn(store.last_lsn - 1), 1)
    return entries[0].epoch if entries and entries[0].lsn == store.last_lsn else None


def last_entry(store: LmdbBackend) -> tuple[Lsn, Epoch | None]:
    """Read through a call: asserting on ``store.last_entry`` itself would let mypy narrow it for good."""
    return store.last_entry


async def test_the_last_entry_epoch_is_the_logs_through_every_change(replicas: Replicas) -> None:
    # A follower checks a shipment's prev against it instead of reading its log: it must
    # be exactly what the log says after appends, applies, new terms, truncation, restart.
    old = await replicas.open("old")
    new = await replicas.open("new")

    async def check(*stores: LmdbBackend) -> None:
        for store in stores:
            assert store.last_entry == (store.last_lsn, await logged_tail_epoch(store))

    await check(old, new)
    assert last_entry(old) == (0, None), "an empty log has no tail"
    await old.raise_epoch(Epoch(3))
    await busy_workload(old, "a")
    await ship(old, new)
    await check(old, new)
    assert new.last_entry[1] == 3
    keep = old.last_lsn
    await old.raise_epoch(Epoch(4))
    await check(old)
    assert old.last_entry[1] == 3, "a new term writes no entry"
    await send_one(old, T1, "w-a", "b")
    await check(old)
    assert old.last_entry[1] == 4
    await new.raise_epoch(Epoch(5))
    await old.truncate_after(keep, Epoch(5))
    await check(old)
    assert old.last_entry[1] == 3
    old = engine(await replicas.factory("old").reopen(old, replication_log_keep=LOG_KEEP))
    await check(old)
    assert old.last_entry[1] == 3
    await send_one(new, T1, "w-a", "c")
    await ship(new, old)
    await check(old, new)
    assert old.last_entry[1] == 5


async def test_a_batch_that_changes_a_key_twice_is_undone_to_its_first_value(replicas: Replicas) -> None:
    store = await replicas.open("a")
    await store.meta_put("ns", "k", b"original")
    keep_lsn = store.last_lsn

    def twice(w: Writes, now: float) -> None:
        key = b"ns\0k"
        w.put(Db.META, key, b"first")
        w.put(Db.META, key, b"second")
        w.delete(Db.META, key)
        w.put(Db.META, b"ns\0new", b"x")

    await store._write(twice)
    assert await store.meta_get("ns", "k") is None
    assert await store.truncate_after(keep_lsn) == 1
    assert await store.meta_get("ns", "k") == b"original"
    assert await store.meta_get("ns", "new") is None


async def test_only_a_current_or_newer_term_may_truncate(replicas: Replicas) -> None:
    store = await replicas.open("a")
    await store.create_queue(T1, q("orders"), {})
    keep_lsn = store.last_lsn
    await store.raise_epoch(Epoch(5))
    await send_one(store, T1, "orders", "tail")
    with pytest.raises(StaleEpoch):
        await store.truncate_after(keep_lsn, Epoch(4))
    assert store.last_lsn == keep_lsn + 1
    # A newer term's truncation raises the fence in the same transaction.
    assert await store.truncate_after(keep_lsn, Epoch(6)) == 1
    assert (store.last_lsn, store.epoch) == (keep_lsn, 6)


async def test_truncation_survives_a_restart(replicas: Replicas) -> None:
    store = await replicas.open("a")
    await store.create_queue(T1, q("orders"), {})
    keep_lsn = store.last_lsn
    before = await contents(store)
    await send_one(store, T1, "orders", "unacknowledged")
    assert await store.truncate_after(keep_lsn) == 1
    assert await store.truncate_after(keep_lsn) == 0, "nothing past it any more"

    store = engine(await replicas.factory("a").reopen(store, replication_log_keep=LOG_KEEP))
    assert store.last_lsn == keep_lsn
    assert await contents(store) == before
    # The next entry reuses the freed LSN.
    await send_one(store, T1, "orders", "b")
    assert store.last_lsn == keep_lsn + 1


async def test_a_tail_that_was_trimmed_cannot_be_truncated(replicas: Replicas) -> None:
    store = await replicas.open("a", replication_log_keep=3)
    await store.create_queue(T1, q("orders"), {})
    for i in range(10):
        await send_one(store, T1, "orders", f"m{i}")
    with pytest.raises(ReplicationGap):
        await store.truncate_after(Lsn(1))
    assert store.last_lsn == 11

    standalone = await replicas.open("b", replication_log_keep=0)
    await standalone.create_queue(T1, q("orders"), {})
    with pytest.raises(ReplicationGap):
        await standalone.truncate_after(Lsn(0))


# ---------------------------------------------------------------------------
# Log retention and re-seeding
# ---------------------------------------------------------------------------


async def test_a_hold_keeps_entries_a_slow_follower_needs(replicas: Replicas) -> None:
    store = await replicas.open("a", replication_log_keep=3)
    await store.create_queue(T1, q("orders"), {})
    store.hold_log_from(Lsn(2))
    for i in range(10):
        await send_one(store, T1, "orders", f"m{i}")
    assert await store.first_retained_lsn() == 2
    store.hold_log_from(None)
    await send_one(store, T1, "orders", "release")
    assert await store.first_retained_lsn() == store.last_lsn - 3 + 1


async def test_a_follower_too_far_behind_is_reseeded_from_a_snapshot(
    replicas: Replicas, tmp_path: Path
) -> None:
    leader = await replicas.open("leader", replication_log_keep=4)
    await leader.raise_epoch(Epoch(6))
    await leader.create_queue(T1, q("orders"), {})
    for i in range(10):
        await send_one(leader, T1, "orders", f"m{i}")
    lagging = await replicas.open("lagging")
    # The leader no longer has the entries the lagging follower needs.
    first = await leader.first_retained_lsn()
    assert first is not None and first > lagging.last_lsn + 1
    with pytest.raises(ReplicationGap):
        await ship(leader, lagging)

    await leader.snapshot(tmp_path / "seeded" / "store")
    seeded = await replicas.open("seeded")
    assert (seeded.last_lsn, seeded.epoch) == (leader.last_lsn, 6)
    assert await contents(seeded) == await contents(leader)
    # Then it catches up from the log.
    await send_one(leader, T1, "orders", "after the snapshot")
    await ship(leader, seeded)
    assert await contents(seeded) == await contents(leader)
    assert len(await receive_all(seeded, T1, "orders")) == 11


# ---------------------------------------------------------------------------
# Early shipping: entries handed out before their own commit
# ---------------------------------------------------------------------------


async def test_each_entry_is_offered_before_its_commit_exactly_as_it_is_logged(
    replicas: Replicas,
) -> None:
    store = await replicas.open("a")
    await store.create_queue(T1, q("orders"), {})
    await store.raise_epoch(Epoch(3))
    offered: list[tuple[LogEntry, list[LogEntry]]] = []
    loop = asyncio.get_running_loop()

    def offer(entry: LogEntry) -> None:
        # In the writer thread: what a reader finds at this LSN now says whether it is committed.
        read = store.read_replication_log(Lsn(entry.lsn - 1), 1)
        offered.append((entry, asyncio.run_coroutine_threadsafe(read, loop).result(10)))

    store.ship_early(offer, lambda lsn: None)
    await send_one(store, T1, "orders", "a")
    await store.send(T1, q("orders"), [msg("b"), msg("c")])
    [got] = await store.receive(T1, q("orders"), 1)
    await store.ack(T1, [got.receipt])
    store.ship_early(None, None)
    await send_one(store, T1, "orders", "d")

    logged = await store.read_replication_log(Lsn(offered[0][0].lsn - 1))
    # One offer per logged entry while it was on, the same bytes, each before it committed here.
    assert [entry for entry, _ in offered] == logged[:-1]
    assert all(readable == [] for _, readable in offered)
    assert {entry.epoch for entry, _ in offered} == {3}
    # A follower applying the offered entries ends up equal.
    follower = await replicas.open("b")
    await follower.apply_replicated(await store.read_replication_log(Lsn(0), offered[0][0].lsn - 1))
    await follower.apply_replicated([entry for entry, _ in offered])
    assert follower.last_lsn == offered[-1][0].lsn
