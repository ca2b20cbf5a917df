"""Holds when another process opens the store (``hold_lock.py``): a real second process.

A message held in one process's memory looks visible on disk, so a process holds only while
it is alone with the store: when another one opens it, the holder writes what it holds as
ordinary in-flight receives (receipts stay valid) before the newcomer's start returns, and
holds nothing while the other process lives; alone again, it holds again.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import time
from pathlib import Path

import pytest

from backend_store import Backend
from backend_store.backend import InMemoryReceive
from backend_store.lmdb_store import checkpoint
from backend_store.lmdb_store.checkpoint import journal_paths
from backend_store.lmdb_store.engine import LmdbBackend
from backend_store.lmdb_store.journal import journaled_after

from ..conftest import scaled
from .harness import T1, StoreFactory, msg, q
from .test_held_receives import stored_counts

CHILD = Path(__file__).with_name("share_child.py")
REPO = Path(__file__).resolve().parents[2]


async def run_child(store_dir: Path) -> list[str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    child = await asyncio.create_subprocess_exec(
        sys.executable, str(CHILD), str(store_dir), T1, "jobs",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    out, err = await asyncio.wait_for(child.communicate(), scaled(60))
    assert child.returncode == 0, err.decode()
    bodies: list[str] = json.loads(out)
    return bodies


async def holding_again(store: Backend) -> None:
    assert isinstance(store, LmdbBackend)
    deadline = time.monotonic() + scaled(10)
    while not store._ops.allow_holds:
        assert time.monotonic() < deadline, "the store never held again once alone"
        await asyncio.sleep(0.05)


async def test_another_process_never_gets_a_held_message(
    store_factory: StoreFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="pushgate.store")
    # Real time: the child process keeps it too. No timed checkpoints: the journal below
    # holds every commit since the one taken on journaling again.
    store = await store_factory.open(clock=time.time, checkpoint_interval_s=3600)
    assert isinstance(store, InMemoryReceive)
    await store.create_queue(T1, q("jobs"), {"visibility_timeout_s": 300})
    await store.send(T1, q("jobs"), [msg("a"), msg("b"), msg("c")])
    held = await store.receive_in_memory(T1, q("jobs"), 2)
    assert await stored_counts(store, "jobs", held) == [0, 0]

    # Alone with its files, the store journals (docs/store.md, "Durability").
    assert isinstance(store, LmdbBackend) and store._require_env().journaled

    # The child's start waits until the holder wrote its holds: it gets only "c".
    assert await run_child(tmp_path / "store") == ["c"]
    # ... and stopped journaling: the child's commits are not in this process's journal, so
    # LMDB synced each commit here while it shared (the watch may have journaled again since
    # the child exited: the log says what happened, in order).
    assert "is shared: no journal, LMDB syncs each commit" in caplog.text
    assert await stored_counts(store, "jobs", held) == [1, 1]
    # The receipts handed out while held still work.
    assert (await store.ack(T1, [m.receipt for m in held])).acked == 2

    # Alone again: first deliveries are held (nothing written) once more, and it journals
    # again, after the LSN the child's commits left.
    await holding_again(store)
    env = store._require_env()
    assert env.journaled and not env.env.flags()["sync"]
    assert caplog.text.index("is shared") < caplog.text.index("is alone again: it journals")
    saved = checkpoint.load(tmp_path / "store")
    assert saved is not None and not saved.clean
    await store.send(T1, q("jobs"), [msg("d")])
    # The journal's entries follow the checkpoint's: what a recovery replays.
    writer = store._writer
    assert writer is not None and writer._journaling is not None
    journaled = [seq for seq, _ in journaled_after(journal_paths(tmp_path / "store"), saved.seq)]
    assert journaled == list(range(saved.seq + 1, writer._journaling.seq + 1)) and journaled
    [d] = await store.receive_in_memory(T1, q("jobs"), 1)
    assert await stored_counts(store, "jobs", [d]) == [0]
