"""The thread that commits: one for a store, or one for every replica a node holds.

A :class:`~.group_commit.GroupCommitWriter` owns one environment's batches; the thread it
runs on is a :class:`CommitThread`. An embedded store's writer has a thread of its own. A
backend node hands all its replicas' writers one thread (``StoreOptions.commit_thread``):
each round takes whatever every writer has queued, commits each writer's batch in its own
environment, then settles them, so that where the writers share a journal
(``JournalGroup`` in ``checkpoint.py``) one fdatasync makes the whole round durable. Why one thread: with a
writer thread per replica, a node at three partitions commits, syncs and hands the GIL over
once per replica per round trip; one thread commits the round's writes back to back and
hands over once (bench/README.md, "Session 72": a third of the futex calls, three
quarters of the syncs).

The cost is that the writers wait for each other: a slow commit (a map that grows, a
checkpoint taken on the thread) delays every replica of the node by as long, as it delays
every queue of a store now.
"""

from __future__ import annotations

import queue
import threading
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .checkpoint import JournalGroup

# Items a round takes at most, over every writer (so that however fast operations come, a
# round ends and its callers are answered).
_ROUND_ITEMS = 4096


class Member(Protocol):
    """A writer on a commit thread (``GroupCommitWriter``'s side of it)."""

    def wait_s(self) -> float | None:
        """How long this writer can wait for work (0: it has something to do now, when no
        item comes; None: nothing until an item does)."""

    def idle(self) -> None:
        """Its wait ran out with no item: do what it waits to do (a sync, a checkpoint)."""

    def take(self, items: list[Any]) -> list[Any]:
        """Commit this round's ``items`` (operations and controls, in order); return what
        :meth:`settle` must finish once every writer of the round has committed."""

    def settle(self, committed: list[Any]) -> bool:
        """Make the round's commits durable and answer their callers; True: this writer is
        done (stopped), and leaves the thread."""

    def left(self) -> None:
        """It has left the thread (its stop may return)."""


class CommitThread:
    """One thread for one or more writers, alive while any writer is attached. ``journal``:
    the journal its writers' stores share (a node's, ``JournalGroup.of_node``); None: each
    store journals in its own."""

    def __init__(self, name: str = "pushgate-writer", *, journal: JournalGroup | None = None) -> None:
        self._name = name
        self.journal = journal
        self._queue: queue.SimpleQueue[tuple[Member, Any]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._members: list[Member] = []
        self._thread: threading.Thread | None = None

    def attach(self, member: Member) -> None:
        """Run ``member`` on this thread (starting the thread if no writer is on it)."""
        with self._lock:
            self._members.append(member)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()

    def put(self, member: Member, item: Any) -> None:
        self._queue.put((member, item))

    @property
    def members(self) -> int:
        return len(self._members)

    def _run(self) -> None:
        while True:
            try:
                first = self._next()
            except queue.Empty:
                for member in list(self._members):
                    if member.wait_s() == 0:
                        member.idle()
                continue
            rounds: dict[Member, list[Any]] = {first[0]: [first[1]]}
            for _ in range(_ROUND_ITEMS - 1):
                try:
                    member, item = self._queue.get_nowait()
                except queue.Empty:
                    break
                rounds.setdefault(member, []).append(item)
            # An item of a writer that has left (a checkpoint's thread ending after its
            # stop) is nobody's any more.
            taken = [
                (member, member.take(items)) for member, items in rounds.items() if member in self._members
            ]
            last = False
            for member, committed in taken:
                if member.settle(committed):
                    last = self._leave(member)
                    member.left()
            if last:
                return

    def _next(self) -> tuple[Member, Any]:
        """The next item, waiting at most as long as the most impatient writer can."""
        waits = [wait for member in list(self._members) if (wait := member.wait_s()) is not None]
        if not waits:
            return self._queue.get()
        wait = min(waits)
        return self._queue.get(timeout=wait) if wait > 0 else self._queue.get_nowait()

    def _leave(self, member: Member) -> bool:
        """``member`` stopped; True: it was the last, and the thread ends (the next
        attach starts another)."""
        with self._lock:
            self._members.remove(member)
            if self._members:
                return False
            self._thread = None
            return True
