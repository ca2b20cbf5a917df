"""The embedded store's journal (lmdb_store/journal.py, checkpoint.py, meta_pages.py).

One fdatasync per commit at every load, counted through the syncer the store is built with;
and after a power cut, simulated over many seeds (the LMDB file as the disk could hold it,
the journal cut where its last sync left it or torn in an unsynced entry), recovery keeps
every acknowledged send and ack, and the store reads whole.
"""

from __future__ import annotations

import asyncio
import errno
import os
import random
import shutil
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import lmdb
import pytest

from backend_store import ReceivedMessage, open_backend
from backend_store.errors import Unavailable
from backend_store.lmdb_store import checkpoint, meta_pages
from backend_store.lmdb_store.environment import Db
from backend_store.lmdb_store.journal import Journal, entries_after
from backend_store.tested_versions import ReleaseCheck

from ..conftest import ManualClock, scaled
from .harness import T1, StoreFactory, lmdb_url, msg, q, receive_all, send_one
from .test_lmdb_engine import counted_syncs, engine

QUEUE = q("j")
PAGE = 4096


@pytest.fixture
async def lmdb_factory(tmp_path: Path, clock: ManualClock) -> AsyncIterator[StoreFactory]:
    factory = StoreFactory(kind="lmdb", url=lmdb_url(tmp_path), clock=clock)
    try:
        yield factory
    finally:
        await factory.close_all()


def counting_fdatasync() -> tuple[list[int], Callable[[int], None]]:
    calls: list[int] = []

    def fdatasync(fd: int) -> None:
        os.fdatasync(fd)
        calls.append(fd)

    return calls, fdatasync


async def test_one_sync_per_commit_idle_and_under_load(
    lmdb_factory: StoreFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    syncs, fdatasync = counting_fdatasync()
    # No sweeps: each sync counted here is one of the calls below.
    store = engine(
        await lmdb_factory.open(
            fdatasync=fdatasync, checkpoint_interval_s=3600, max_batch=5, sweep_interval_s=0
        )
    )
    env = store._require_env()
    flags = env.env.flags()
    assert not flags["sync"] and env.journaled, flags  # LMDB itself syncs nothing
    await store.create_queue(T1, QUEUE, {})
    lmdb_syncs = counted_syncs(store, monkeypatch)
    before = len(syncs)
    # Idle: each call is one commit and one sync, before it returns.
    await send_one(store, T1, QUEUE, "m1")
    await send_one(store, T1, QUEUE, "m2")
    assert len(syncs) - before == 2
    got = await store.receive(T1, QUEUE, 1, 30)
    assert len(got) == 1 and len(syncs) - before == 2  # a receive waits for no sync
    await store.ack(T1, [got[0].receipt])
    assert len(syncs) - before == 3
    # Under load: one sync per commit (at most five sends a commit here).
    writer = store._writer
    assert writer is not None
    batches, before = writer.batches, len(syncs)
    results = await asyncio.gather(*(send_one(store, T1, QUEUE, f"n{i}") for i in range(200)))
    assert len({r.id for r in results}) == 200
    commits = writer.batches - batches
    assert commits >= 40
    assert len(syncs) - before == commits
    assert lmdb_syncs == []  # no sync of the LMDB file: no checkpoint was due


async def test_a_checkpoint_is_taken_once_due_and_the_store_reopens_clean(lmdb_factory: StoreFactory) -> None:
    store = engine(await lmdb_factory.open(checkpoint_interval_s=0.05))
    await store.create_queue(T1, QUEUE, {})
    writer = store._writer
    assert writer is not None and writer._journaling is not None
    await send_one(store, T1, QUEUE, "m1")
    sent_at = writer._journaling.seq
    deadline = time.monotonic() + scaled(5)
    # Taken by the idle writer, no call needed: the checkpoint file then holds the send.
    while (saved := checkpoint.load(store.path)) is None or saved.seq < sent_at:
        assert time.monotonic() < deadline, "no checkpoint while idle"
        await asyncio.sleep(0.01)
    assert not saved.clean
    await lmdb_factory.close(store)
    saved = checkpoint.load(store.path)
    assert saved is not None and saved.clean
    store = engine(await lmdb_factory.open())
    assert [m.body for m in await receive_all(store, T1, "j")] == [b"m1"]


async def test_the_journal_between_checkpoints_is_bounded_by_the_reserve(lmdb_factory: StoreFactory) -> None:
    # Each journal file grows to what one round between checkpoints wrote and never shrinks:
    # on a small disk, rounds of a second's sends took room messages could have used
    # (tests/cluster/test_full_disks.py, session 52). With a reserve of 1 MiB a round ends
    # past 1 MiB of journal, however long the interval.
    store = engine(await lmdb_factory.open(checkpoint_interval_s=3600, disk_reserve_bytes=1 << 20))
    await store.create_queue(T1, QUEUE, {})
    body = os.urandom(16 * 1024)
    for _ in range(20):
        await asyncio.gather(*(send_one(store, T1, "j", body) for _ in range(16)))
    writer = store._writer
    assert writer is not None and writer._journaling is not None
    assert writer._journaling.checkpoints >= 3  # 5 MiB journaled, interval not reached
    sizes = [path.stat().st_size for path in writer._journaling.journal.paths]
    assert max(sizes) <= 2 << 20, sizes


def test_journal_reading_stops_at_a_torn_entry_a_gap_or_the_round_before(tmp_path: Path) -> None:
    path = tmp_path / "journal"
    journal = Journal((path, tmp_path / "journal.b"))
    for lsn in range(1, 6):
        journal.append(lsn, b"entry %d" % lsn)
    journal.rewind()  # a checkpoint at LSN 5: the next round overwrites from offset 0
    journal.append(6, b"six")
    journal.sync()
    journal.close()
    assert [lsn for lsn, _ in entries_after(path, 5)] == [6]  # not 2..5 of the round before
    assert list(entries_after(path, 6)) == []
    data = bytearray(path.read_bytes())
    data[17] ^= 1  # a bit of entry 6's payload (after its 16-byte header)
    path.write_bytes(bytes(data))
    assert list(entries_after(path, 5)) == []


def test_an_untested_lmdb_release_is_refused_by_the_meta_page_module() -> None:
    meta_pages.check_release(ReleaseCheck(lambda d: "3.0.0"), liblmdb=(0, 9, 36))
    with pytest.raises(meta_pages.UnsupportedFormat, match=r"py-lmdb 3\.1"):
        meta_pages.check_release(ReleaseCheck(lambda d: "3.1.0"), liblmdb=(0, 9, 36))
    with pytest.raises(meta_pages.UnsupportedFormat, match=r"liblmdb 0\.9\.37"):
        meta_pages.check_release(ReleaseCheck(lambda d: "3.0.0"), liblmdb=(0, 9, 37))
    with pytest.raises(meta_pages.UnsupportedFormat, match="magic"):
        page = bytearray(PAGE)
        page[10] = 0x08  # a meta page's flag, but no magic
        meta_pages.check_page(bytes(page), 0)


async def test_an_untested_lmdb_release_runs_on_lmdbs_own_syncs_and_says_so(
    lmdb_factory: StoreFactory, caplog: pytest.LogCaptureFixture
) -> None:
    store = engine(await lmdb_factory.open(releases=ReleaseCheck(lambda d: "99.0")))
    env = store._require_env()
    assert env.env.flags()["sync"] and not env.journaled
    assert "does not journal" in caplog.text
    assert checkpoint.load(store.path) is None


# Power loss --------------------------------------------------------------------


def crash_image(checkpointed: bytes, final: bytes, rng: random.Random) -> bytes:
    """The LMDB file a power cut could leave: the synced checkpoint's bytes, with any subset
    of the pages written since (the meta pages among them) reaching the disk."""
    pages = max(len(checkpointed), len(final)) // PAGE
    image = bytearray(checkpointed.ljust(pages * PAGE, b"\0"))
    for n in range(pages):
        start = n * PAGE
        new = final[start : start + PAGE].ljust(PAGE, b"\0")
        if image[start : start + PAGE] != new and rng.random() < 0.5:
            image[start : start + PAGE] = new
    return bytes(image)


async def test_power_loss_after_a_checkpoint_loses_nothing_acknowledged(
    lmdb_factory: StoreFactory, tmp_path: Path
) -> None:
    store = engine(await lmdb_factory.open(checkpoint_interval_s=3600))
    await store.create_queue(T1, QUEUE, {})
    for i in range(40):
        await send_one(store, T1, QUEUE, f"old-{i}")
    await lmdb_factory.close(store)  # a clean checkpoint: what the disk holds from here
    directory = store.path
    checkpointed = (directory / "data.mdb").read_bytes()

    store = engine(await lmdb_factory.open(checkpoint_interval_s=3600))
    acked_sends: set[bytes] = set()
    acked_acks: set[bytes] = set()
    for round_ in range(6):
        sent = await store.send(T1, QUEUE, [msg(f"new-{round_}-{i}".encode() * 40) for i in range(25)])
        assert all(not isinstance(r, Exception) for r in sent)
        acked_sends |= {f"new-{round_}-{i}".encode() * 40 for i in range(25)}
        got = await store.receive(T1, QUEUE, 10, 3600)
        await store.ack(T1, [m.receipt for m in got[:7]])
        acked_acks |= {m.body for m in got[:7]}
    synced_journal = (directory / "journal").read_bytes()
    synced_length = store._writer._journaling.journal.written  # type: ignore[union-attr]
    # One more receive: its entry is written, never synced (a receive waits for no sync).
    await store.receive(T1, QUEUE, 5, 3600)
    final = (directory / "data.mdb").read_bytes()
    unsynced_journal = (directory / "journal").read_bytes()
    assert unsynced_journal[:synced_length] == synced_journal[:synced_length]
    saved_checkpoint = (directory / "checkpoint").read_bytes()
    assert not checkpoint.load(directory).clean  # type: ignore[union-attr]
    await lmdb_factory.close(store)
    survivors = (acked_sends | {f"old-{i}".encode() for i in range(40)}) - acked_acks

    torn_states = 0
    for seed in range(40):
        rng = random.Random(seed)
        crashed = tmp_path / f"crash-{seed}"
        shutil.copytree(directory, crashed)
        image = crash_image(checkpointed, final, rng)
        torn_states += image[: 2 * PAGE] != checkpointed[: 2 * PAGE]
        (crashed / "data.mdb").write_bytes(image)
        # The journal as its last sync left it, then part of the unsynced entry (or of
        # its own bytes: a torn write), then whatever the file held before.
        cut = synced_length + rng.randrange(0, len(unsynced_journal) - synced_length + 1)
        (crashed / "journal").write_bytes(unsynced_journal[:cut] + bytes(rng.randrange(0, 64)))
        (crashed / "checkpoint").write_bytes(saved_checkpoint)
        (crashed / "lock.mdb").unlink()
        got = await everything(crashed, lmdb_factory)
        bodies = [m.body for m in got]
        assert len(bodies) == len(set(bodies)), f"seed {seed}: a message came back twice"
        missing = survivors - set(bodies)
        assert not missing, f"seed {seed}: {len(missing)} acknowledged sends lost"
        resurrected = acked_acks & set(bodies)
        assert not resurrected, f"seed {seed}: {len(resurrected)} acknowledged acks undone"
        assert_whole(crashed)
    assert torn_states, "no seed wrote a later meta page: the simulation proved little"


async def everything(directory: Path, factory: StoreFactory) -> list[ReceivedMessage]:
    later = factory.clock.now + 7200  # past every visibility timeout of the run
    store = open_backend(f"lmdb://{directory}", factory.options(clock=lambda: later))
    await store.start()
    try:
        return await receive_all(store, T1, QUEUE)
    finally:
        await store.close()


def assert_whole(directory: Path) -> None:
    """Every record of every database reads (a damaged tree raises, or worse)."""
    env = lmdb.open(str(directory), max_dbs=len(Db), readonly=True, lock=False)
    try:
        with env.begin() as txn:
            for db in Db:
                handle = env.open_db(db.name.lower().encode(), txn=txn, create=False)
                for _key, _value in txn.cursor(db=handle):
                    pass
    finally:
        env.close()


async def test_a_data_file_replaced_after_an_unclean_stop_is_refused_not_overwritten(
    lmdb_factory: StoreFactory, tmp_path: Path
) -> None:
    store = engine(await lmdb_factory.open(checkpoint_interval_s=3600))
    await store.create_queue(T1, QUEUE, {})
    await lmdb_factory.close(store)
    older = (store.path / "data.mdb").read_bytes()
    store = engine(await lmdb_factory.open(checkpoint_interval_s=0.01))
    for i in range(5):
        await send_one(store, T1, QUEUE, f"m{i}")
    writer = store._writer
    assert writer is not None and writer._journaling is not None
    deadline = time.monotonic() + scaled(5)
    while (saved := checkpoint.load(store.path)) is None or saved.seq < writer._journaling.seq:
        assert time.monotonic() < deadline, "no checkpoint while idle"
        await asyncio.sleep(0.01)
    unclean = (store.path / "checkpoint").read_bytes()
    await lmdb_factory.close(store)
    # An unclean stop, then someone copies an older data file over the store's.
    (store.path / "checkpoint").write_bytes(unclean)
    (store.path / "data.mdb").write_bytes(older)
    with pytest.raises(Unavailable, match="older than its checkpoint"):
        await lmdb_factory.open()
    assert (store.path / "data.mdb").read_bytes() == older  # left as it was found


async def test_a_failed_journal_sync_is_made_good_by_a_checkpoint_before_the_answer(
    lmdb_factory: StoreFactory,
) -> None:
    failures: list[OSError] = []

    def fdatasync(fd: int) -> None:
        if failures:
            raise failures.pop()
        os.fdatasync(fd)

    store = engine(await lmdb_factory.open(fdatasync=fdatasync, checkpoint_interval_s=3600))
    writer = store._writer
    assert writer is not None and writer._journaling is not None
    taken = writer._journaling.checkpoints
    failures.append(OSError(errno.EIO, "Input/output error"))
    await store.create_queue(T1, QUEUE, {})  # its journal sync fails: a checkpoint instead
    assert writer._journaling.checkpoints == taken + 1
    saved = checkpoint.load(store.path)
    assert saved is not None and saved.seq == writer._journaling.seq
    await send_one(store, T1, QUEUE, "m1")  # the journal works again: no checkpoint
    assert writer._journaling.checkpoints == taken + 1


async def test_a_store_told_not_to_journal_runs_on_lmdbs_own_syncs(lmdb_factory: StoreFactory) -> None:
    store = engine(await lmdb_factory.open(journal=False))
    env = store._require_env()
    assert env.env.flags()["sync"] and not env.journaled
    await store.create_queue(T1, QUEUE, {})
    assert checkpoint.load(store.path) is None


async def test_the_writer_commits_while_a_checkpoint_syncs_the_lmdb_file_and_power_loss_then_loses_nothing(
    lmdb_factory: StoreFactory, tmp_path: Path
) -> None:
    held = threading.Event()  # a checkpoint's sync of the LMDB file is under way, held
    release = threading.Event()
    holding = False

    def fdatasync(fd: int) -> None:
        if holding and os.readlink(f"/proc/self/fd/{fd}").endswith("data.mdb"):
            held.set()
            assert release.wait(scaled(30))
        os.fdatasync(fd)

    store = engine(await lmdb_factory.open(checkpoint_interval_s=3600))
    await store.create_queue(T1, QUEUE, {})
    for i in range(20):
        await send_one(store, T1, QUEUE, f"old-{i}")
    await lmdb_factory.close(store)  # a clean checkpoint: what the disk holds from here
    directory = store.path
    checkpointed = (directory / "data.mdb").read_bytes()

    store = engine(await lmdb_factory.open(fdatasync=fdatasync, checkpoint_interval_s=0.05))
    writer = store._writer
    assert writer is not None and writer._journaling is not None
    holding = True
    try:
        await send_one(store, T1, QUEUE, "first")  # a checkpoint is due 50 ms after it
        assert await asyncio.to_thread(held.wait, scaled(10)), "no checkpoint began"
        assert writer._journaling.in_flight
        # The LMDB file's sync is held: the writer commits and answers all the same.
        acked_sends = {b"first"}
        for round_ in range(5):
            bodies = [f"new-{round_}-{i}".encode() * 40 for i in range(10)]
            sent = await asyncio.wait_for(store.send(T1, QUEUE, [msg(b) for b in bodies]), scaled(10))
            assert all(not isinstance(r, Exception) for r in sent)
            acked_sends |= set(bodies)
        got = await asyncio.wait_for(store.receive(T1, QUEUE, 5, 3600), scaled(10))
        await asyncio.wait_for(store.ack(T1, [m.receipt for m in got]), scaled(10))
        acked_acks = {m.body for m in got}
        assert writer._journaling.in_flight and writer._journaling.checkpoints == 1
        # A power cut now: the checkpoint under way never saved.
        final = (directory / "data.mdb").read_bytes()
        journals = {name: (directory / name).read_bytes() for name in checkpoint.JOURNAL_FILES}
        saved_checkpoint = (directory / "checkpoint").read_bytes()
    finally:
        release.set()
    deadline = time.monotonic() + scaled(10)
    while writer._journaling.checkpoints < 2:  # saved once its sync is let go
        assert time.monotonic() < deadline, "the checkpoint never completed"
        await asyncio.sleep(0.01)
    await lmdb_factory.close(store)
    survivors = (acked_sends | {f"old-{i}".encode() for i in range(20)}) - acked_acks

    for seed in range(40):
        rng = random.Random(seed)
        crashed = tmp_path / f"crash-{seed}"
        shutil.copytree(directory, crashed)
        (crashed / "data.mdb").write_bytes(crash_image(checkpointed, final, rng))
        for name, content in journals.items():  # every entry was synced before its answer
            (crashed / name).write_bytes(content + bytes(rng.randrange(0, 64)))
        (crashed / "checkpoint").write_bytes(saved_checkpoint)
        (crashed / "lock.mdb").unlink()
        bodies = [m.body for m in await everything(crashed, lmdb_factory)]
        assert len(bodies) == len(set(bodies)), f"seed {seed}: a message came back twice"
        missing = survivors - set(bodies)
        assert not missing, f"seed {seed}: {len(missing)} acknowledged sends lost"
        assert not acked_acks & set(bodies), f"seed {seed}: acknowledged acks undone"
        assert_whole(crashed)
