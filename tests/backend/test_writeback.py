"""Between checkpoints a journaling store has the kernel start writing its LMDB file back
(lmdb_store/writeback.py), at most every ``WRITEBACK_S``, so that a checkpoint's sync finds
little to write and the journal syncs callers wait for do not queue behind it: a store's own
file, and every replica's file on a node whose replicas share a journal.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from backend_store.lmdb_store import writeback
from backend_store.lmdb_store.checkpoint import DATA_FILE, JournalGroup
from backend_store.lmdb_store.commit_thread import CommitThread

from ..conftest import scaled
from .harness import T1, StoreFactory, msg, q, send_one
from .test_journal import lmdb_factory
from .test_lmdb_engine import engine
from .test_replica_store import Replicas, replicas
from .test_shared_journal import NAMES, QUEUE, open_replica

__all__ = ["lmdb_factory", "replicas"]  # fixtures, used by name


class CountingWriteback:
    """Records which file each writeback was started for, and when (monotonic seconds)."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, Path]] = []

    def __call__(self, fd: int) -> None:
        self.calls.append((time.monotonic(), Path(os.readlink(f"/proc/self/fd/{fd}"))))
        writeback.start_writeback(fd)


async def until_calls(counted: CountingWriteback, enough: int, send: Callable[[], Awaitable[None]]) -> None:
    """Send until ``enough`` writebacks were started."""
    deadline = time.monotonic() + scaled(10)
    while len(counted.calls) < enough:
        assert time.monotonic() < deadline, f"{len(counted.calls)} writebacks started"
        await send()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sync_file_range is Linux's")
def test_the_writeback_call_is_there_on_linux_and_a_bad_descriptor_is_ignored(tmp_path: Path) -> None:
    # Where the call is missing the hint silently does nothing: on the platform production
    # runs on it must be there.
    assert writeback.AVAILABLE
    path = tmp_path / "file"
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    try:
        os.pwrite(fd, b"x" * (1 << 20), 0)
        writeback.start_writeback(fd)  # returns at once; durability is never its job
    finally:
        os.close(fd)
    writeback.start_writeback(fd)  # closed now: -1 from the kernel, nothing raised


async def test_a_writing_store_starts_its_lmdb_files_writeback_at_most_every_interval(
    lmdb_factory: StoreFactory,
) -> None:
    counted = CountingWriteback()
    store = engine(await lmdb_factory.open(writeback=counted, checkpoint_interval_s=3600))
    await store.create_queue(T1, q("w"), {})
    writer = store._writer
    assert writer is not None
    batches = writer.batches

    async def send() -> None:
        await send_one(store, T1, "w", "m")

    await until_calls(counted, 3, send)
    assert {path for _at, path in counted.calls} == {(store.path / DATA_FILE).resolve()}
    gaps = [
        later - earlier for (earlier, _), (later, _) in zip(counted.calls, counted.calls[1:], strict=False)
    ]
    # The same monotonic clock times the rule and the record; the margin is the moments
    # between reading it for one and for the other.
    assert min(gaps) >= writeback.WRITEBACK_S - 0.005, gaps
    assert writer.batches - batches > len(counted.calls)


async def test_a_node_starts_the_writeback_of_every_replica_sharing_its_journal(replicas: Replicas) -> None:
    counted = CountingWriteback()
    thread = CommitThread(journal=JournalGroup.of_node(replicas.root, interval_s=3600, writeback=counted))
    stores = [await open_replica(replicas, replicas.root, name, thread) for name in NAMES]
    for store in stores:
        await store.create_queue(T1, q(QUEUE), {})

    async def send() -> None:
        # One replica written: the others' files are started too (one call a member).
        await stores[0].send(T1, q(QUEUE), [msg("m")])

    await until_calls(counted, 2 * len(NAMES), send)
    started = {path for _at, path in counted.calls}
    assert started == {(replicas.root / name / DATA_FILE).resolve() for name in NAMES}
    await asyncio.gather(*(store.close() for store in stores))
