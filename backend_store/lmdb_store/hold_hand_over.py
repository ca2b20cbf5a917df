"""Receives held in memory, between processes: the store's side of ``hold_lock.py``.

At start the store holds in memory only if it is alone with its files (a store that keeps a
replication log, a node's partition replica, never holds); while it runs, a watch hands the
right over when another process opens the store (writing every hold as an ordinary in-flight
receive first) and takes it back once the store is alone again. The journal (checkpoint.py)
follows the same right: a store journals only while it holds.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

from ..errors import PushgateError
from ..options import StoreOptions
from ..private_files import private_dir
from ..tested_versions import RELEASES
from . import checkpoint, meta_pages
from .checkpoint import JournalGroup, Journaling
from .environment import Environment
from .hold_lock import HoldLock
from .room import journal_limit
from .store_core import StoreCore
from .writeback import start_writeback

log = logging.getLogger("pushgate.store")
# How often the holder looks for another process opening the store (that one's start waits
# for it, at most _HAND_OVER_WAIT_S), and how many looks between a sharer's tries to hold.
_HOLD_PROBE_S = 0.25
_REELECT_EVERY = 4
_HAND_OVER_WAIT_S = 30.0


class HoldHandOver(StoreCore):
    """The hold lock and its watch."""

    def __init__(self, path: Path, options: StoreOptions) -> None:
        super().__init__(path, options)
        self._hold_lock: HoldLock | None = None
        self._hold_watch: asyncio.Task[None] | None = None

    async def _elect_holder(self) -> bool:
        """At start, before the environment opens: whether this process is alone with the
        store's files, and so may hold receives in memory, and journal (checkpoint.py)."""
        # Hold in memory only while no other process has this store open (hold_lock.py). A
        # store that keeps a replication log is a node's partition replica: it never holds.
        self._ops.allow_holds = False
        if self._replication_log.keep:
            return False
        private_dir(self.path)
        lock = HoldLock(self.path)
        try:
            self._ops.allow_holds = await asyncio.to_thread(lock.elect)
        except BaseException:
            lock.close()
            raise
        self._hold_lock = lock
        return self._ops.allow_holds

    def _may_journal(self) -> bool:
        """Whether this store journals while alone with its files: not told otherwise, on
        the LMDB release the journal's checkpoints were tested with (if not, it runs on
        LMDB's own syncs, and says so)."""
        if not self.options.journal:
            return False
        try:
            meta_pages.check_release(self.options.releases or RELEASES)
        except meta_pages.UnsupportedFormat as exc:
            log.warning(
                "store %s does not journal (%s): LMDB syncs each commit, two fdatasyncs a "
                "commit when idle (docs/store.md, Durability)",
                self.path,
                exc,
            )
            return False
        return True

    def _node_journal(self) -> JournalGroup | None:
        """The journal this store shares with the other replicas of its node, if it does."""
        thread = self.options.commit_thread
        return thread.journal if thread is not None else None

    def _journaling_of(self, env: Environment) -> Journaling:
        group = self._node_journal()
        if group is not None:
            group.cap(journal_limit(self._reserve))
            return Journaling(env, group)
        return Journaling.alone(
            env,
            interval_s=self.options.checkpoint_interval_s,
            max_bytes=journal_limit(self._reserve),
            fdatasync=self.options.fdatasync or os.fdatasync,
            writeback=self.options.writeback or start_writeback,
        )

    async def _share_unless_holder(self, env: Environment) -> None:
        """At start, before the writer of a store that does not journal: a process that is
        not the holder waits until the holder has written its holds and stopped journaling;
        then a journaling run that did not stop cleanly is marked clean (checkpoint.py,
        ``mark_clean``). ``env`` is closed if that fails."""
        lock = self._hold_lock
        try:
            if lock is not None and not lock.holding:
                await asyncio.to_thread(lock.share, _HAND_OVER_WAIT_S)
            await asyncio.to_thread(checkpoint.mark_clean, env)
        except BaseException:
            self._release_hold_lock()
            await asyncio.to_thread(env.close)
            raise

    def _start_hold_watch(self) -> None:
        if self._hold_lock is not None:
            self._hold_watch = asyncio.create_task(self._watch_hold_lock(), name="pushgate-hold-lock")

    async def _stop_hold_watch(self) -> None:
        if self._hold_watch is not None:
            self._hold_watch.cancel()
            await asyncio.wait([self._hold_watch])
            self._hold_watch = None

    async def _stop_journaling(self) -> None:
        if self._writer is not None and self._env is not None and self._env.journaled:
            await asyncio.to_thread(self._writer.stop_journaling)

    async def _start_journaling(self) -> None:
        """Alone again: journal again, where this store may (engine.py)."""
        writer, env = self._writer, self._env
        if writer is not None and env is not None and not env.journaled and self._may_journal():
            await asyncio.to_thread(writer.start_journaling, lambda: self._journaling_of(env))

    def _release_hold_lock(self) -> None:
        if self._hold_lock is not None:
            self._hold_lock.close()
            self._hold_lock = None

    async def _watch_hold_lock(self) -> None:
        """Hand the right to hold over when another process opens the store (its start waits
        for it), and take it back once this process is alone again (hold_lock.py)."""
        lock = self._hold_lock
        assert lock is not None
        ticks = 0
        while True:
            await asyncio.sleep(_HOLD_PROBE_S)
            ticks += 1
            try:
                if lock.holding:
                    if lock.others_present():  # two non-blocking flock calls
                        self._ops.allow_holds = False  # no receive holds from here on
                        written = await self._write(self._ops.write_held_as_received)
                        # The newcomer's commits are not in this process's journal: from
                        # here on LMDB syncs each commit (docs/store.md, "Durability").
                        await self._stop_journaling()
                        await asyncio.to_thread(lock.hand_over)
                        log.info("another process opened the store: %d held messages written", written)
                elif ticks % _REELECT_EVERY == 0 and await asyncio.to_thread(lock.reelect):
                    await self._start_journaling()
                    self._ops.allow_holds = True
            except PushgateError as exc:
                log.warning("hold lock: %s", exc.detail)
            except Exception:
                # Keep watching: a holder that stops looking would keep a newcomer waiting.
                log.exception("hold lock watch failed")
