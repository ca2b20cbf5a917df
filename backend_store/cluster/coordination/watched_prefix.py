"""A prefix of etcd kept in memory and followed through the coordinator's watch.

The gateway's metadata cache is made of these: one per prefix it reads on hot paths
(``meta/``, ``queues/``, ``partitions/``, ``leaders/``, ``nodes/``). The coordinator's watch
hands out whole consistent states (a read, then etcd's events applied a revision at a time;
a periodic re-read covers a broken watch), so a follower never holds a half-applied picture.
Each new state goes to the listeners with the keys that changed, on the event loop: the
keys the watch's events named when the state was made from the one held (``since``), else
a comparison of every key. Nodes, managers and gateways all follow etcd through this one
class.

A state older than the one held is either a read that lost a race with a newer one, or
etcd gone back in time (restored from a snapshot, or wiped and started afresh): a fresh
read tells them apart, since a read begun after the newer state was taken cannot be older
unless etcd went back. Then the older state is taken whole, and the listeners reload.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from .coordinator import Coordinator, CoordinatorUnavailable, Entry, PrefixState

log = logging.getLogger("pushgate.cluster")
# A read in flight ends by its own deadline (two etcd call timeouts at most).
_STOP_TIMEOUT_S = 10.0
# A confirming read that failed, or a follower that failed, tries again after this pause.
_CONFIRM_RETRY_S = 0.5

# Called with the new state and the keys (full etcd keys) added, changed or removed.
StateListener = Callable[[PrefixState, set[str]], None]


def changed_keys(old: PrefixState, new: PrefixState) -> set[str]:
    """Keys added, removed, or holding another entry between two states: the whole entry, as
    ``changed_in_pages`` compares it, not its mod revision alone. An etcd restored or replaced
    numbers its revisions again, and a key may hold another value at a mod revision it held
    before: a leader key restored from a snapshot, at the revision another node's key had
    been written at since, went unseen, and the node kept deleting "its" key, which etcd did
    not hold, while the manager waited for the restored key's holder to serve (simulation
    seed ``restore`` 1740213, session 74)."""
    keys = set(old.entries) ^ set(new.entries)
    for key in set(old.entries) & set(new.entries):
        if old.entries[key] != new.entries[key]:
            keys.add(key)
    return keys


class WatchedPrefix:
    """The latest state of one prefix; ``start`` returns once the first state is in."""

    def __init__(self, coordinator: Coordinator, prefix: str, *, reread_every_s: float = 5.0) -> None:
        self.prefix = prefix
        self.state = PrefixState(prefix, 0)
        self._coordinator = coordinator
        self._reread_every_s = reread_every_s
        self._listeners: list[StateListener] = []
        self._task: asyncio.Task[None] | None = None
        self._first = asyncio.Event()
        self._stopping = asyncio.Event()
        self._confirming: asyncio.Task[None] | None = None
        # Callers of ``caught_up``: the revision each waits for.
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []

    @property
    def loaded(self) -> bool:
        """Whether a first state is in."""
        return self._first.is_set()

    def add_listener(self, listener: StateListener) -> None:
        self._listeners.append(listener)

    def get(self, key: str) -> Entry | None:
        """An entry by its key relative to the prefix."""
        return self.state.entries.get(self.prefix + key)

    def begin(self) -> None:
        """Follow the prefix from now on (without waiting for its first state)."""
        if self._task is None:
            self._stopping.clear()
            self._task = asyncio.create_task(self._follow(), name=f"watch {self.prefix}")

    async def start(self, timeout_s: float = 10.0) -> None:
        """Follow the prefix; return once its first state is in (``CoordinatorUnavailable``
        if etcd did not answer within ``timeout_s``)."""
        self.begin()
        assert self._task is not None
        first = asyncio.ensure_future(self._first.wait())
        done, _ = await asyncio.wait(
            {first, self._task}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED
        )
        if first in done:
            return
        first.cancel()
        if self._task in done:
            self._task.result()  # the follower died before its first state: raise its error
        await self.close()
        raise CoordinatorUnavailable(f"no answer from etcd for {self.prefix} within {timeout_s:g}s")

    def apply(self, state: PrefixState) -> None:
        """Take a state newer than the one held (the watch's, or a fresh read of our own);
        an older one is checked with a fresh read (the module's docstring)."""
        if state.revision < self.state.revision:
            if self._confirming is None or self._confirming.done():
                self._confirming = asyncio.create_task(self._confirm(), name=f"confirm {self.prefix}")
            return
        self._take(state)

    async def caught_up(self, revision: int, timeout_s: float) -> bool:
        """Wait until the state held is as of ``revision`` at least (a write of our own,
        which the watch brings like any other); whether it is within ``timeout_s``.

        Read your writes without putting a state of our own in the held copy: such a state
        is newer than the watch's, so the watch's next state was compared key by key with
        it (O(keys)), and a watch state older than it sent for a confirming read of the
        whole prefix (issue 49, 11% of a gateway's samples creating queues at 10,000)."""
        if self.state.revision >= revision:
            return True
        if self._task is None:
            return False  # not following: nothing will bring it
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((revision, waiter))
        try:
            async with asyncio.timeout(timeout_s):
                await waiter
        except TimeoutError:
            return self.state.revision >= revision
        finally:
            self._waiters = [(r, w) for r, w in self._waiters if w is not waiter]
        return True

    def _take(self, state: PrefixState) -> None:
        first = not self._first.is_set()
        old, self.state = self.state, state
        if self._waiters:
            for revision, waiter in self._waiters:
                if revision <= state.revision and not waiter.done():
                    waiter.set_result(None)
        if state.changed is not None and state.since == old.revision and not first:
            keys = set(state.changed)  # the watch's events, applied to the state held
        else:
            keys = changed_keys(old, state)
        self._first.set()
        if keys or first:
            for listener in list(self._listeners):
                try:
                    listener(state, keys)
                except Exception:
                    log.exception("listener of %s failed", self.prefix)

    async def _confirm(self) -> None:
        """After an older state: read again until a read answers (or we stop)."""
        while not self._stopping.is_set():
            held = self.state.revision
            try:
                fresh = await self._coordinator.read_prefix(self.prefix)
            except CoordinatorUnavailable:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(_CONFIRM_RETRY_S):
                        await self._stopping.wait()
                continue
            if fresh.revision < held:
                self._went_back(held, fresh)
            else:
                self.apply(fresh)
            return

    async def refresh(self) -> None:
        """Read the prefix now (after a write of our own, or when a node says the map moved).

        The read begins after the held state was taken, so if it comes back older, etcd went
        back in time: it is taken at once, not left to a confirming read. A node that raised
        the incarnation after a restore otherwise read its own raise back as older than the
        record from before the restore, and decided on incarnation 0 until the confirming
        read landed: it led at its restored leader key's old epoch from an emptied copy
        (simulation seed ``all`` 150423, session 34, ``log-matching``)."""
        held = self.state.revision
        fresh = await self._coordinator.read_prefix(self.prefix)
        if fresh.revision < held:
            self._went_back(held, fresh)
        else:
            self.apply(fresh)

    def _went_back(self, held: int, fresh: PrefixState) -> None:
        """A read begun after the state of revision ``held`` was taken came back older: etcd
        went back in time (restored or replaced); the older state is taken whole."""
        log.warning(
            "etcd's revision went back from %d to %d under %s: etcd was restored or replaced;"
            " reloading everything under it",
            held,
            fresh.revision,
            self.prefix,
        )
        self._take(fresh)

    async def _follow(self) -> None:
        while not self._stopping.is_set():
            try:
                states = self._coordinator.watch_prefix(
                    self.prefix,
                    reread_every_s=self._reread_every_s,
                    stop=self._stopping,
                    held=lambda: self.state,
                )
                async for state in states:
                    self.apply(state)
            except Exception:  # a bug, or the client failing: follow again after a pause
                log.exception("watch of %s failed", self.prefix)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(_CONFIRM_RETRY_S):
                        await self._stopping.wait()

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        # Told to stop, not cancelled: a cancellation delivered inside the etcd client can
        # be lost, and the task would never end (see etcd_coordinator).
        self._stopping.set()
        if self._confirming is not None:
            await asyncio.wait({self._confirming}, timeout=_STOP_TIMEOUT_S)
        done, _ = await asyncio.wait({task}, timeout=_STOP_TIMEOUT_S)
        if not done:
            log.warning("watch of %s did not stop in %.0fs; cancelling it", self.prefix, _STOP_TIMEOUT_S)
            task.cancel()
        elif not task.cancelled() and task.exception() is not None:
            log.error("watch of %s failed", self.prefix, exc_info=task.exception())
