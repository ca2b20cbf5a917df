"""Who may hold messages in memory when several processes open one store.

Holds (``holds.py``) live in one process's memory: another process sharing the store (a
second ``pushgate serve`` on the same data directory, ``pushgate admin``) sees a held message
as visible and would hand it out again. So a process holds only while it is the only one
with the store open, and hands over when another one arrives. Two lock files in the store's
directory (``flock``: released by the kernel when a process dies, crash included):

- ``hold.lock``: the holder keeps it exclusive; every other process keeps it shared, and
  may receive only while it has it (so never while another process holds).
- ``users.lock``: every process but the holder keeps it shared: that is how a newcomer
  announces itself, and why no second holder can be elected while anyone shares.

A newcomer takes ``users.lock`` shared, then waits for ``hold.lock`` shared. The holder
probes ``users.lock`` a few times a second; when someone else has it, it stops holding,
writes every hold as an ordinary in-flight receive (receipts stay valid), and only then lets
go of ``hold.lock``. A process left alone again (the other one exited) takes the holder's
place the same way it would at start. Never a lock conversion: ``flock`` converts by
unlocking first, so every change here is a fresh lock taken while another one still keeps
others out.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

from ..errors import Unavailable


class HoldLock:
    """The two lock files of one store, as seen by this process (call from worker threads)."""

    def __init__(self, directory: Path) -> None:
        self._hold = os.open(directory / "hold.lock", os.O_RDWR | os.O_CREAT, 0o600)
        self._users = os.open(directory / "users.lock", os.O_RDWR | os.O_CREAT, 0o600)
        self.holding = False

    def elect(self) -> bool:
        """Become the holder if no other process has the store open; return whether so.

        Called with no lock taken (at start)."""
        if not _try(self._hold, fcntl.LOCK_EX):
            return False
        if not _try(self._users, fcntl.LOCK_EX):  # someone else is here
            fcntl.flock(self._hold, fcntl.LOCK_UN)
            return False
        fcntl.flock(self._users, fcntl.LOCK_UN)
        self.holding = True
        return True

    def share(self, timeout_s: float) -> None:
        """Announce this process and wait until no other process holds (the holder writes its
        holds and lets go); from then on the store may be received from here."""
        fcntl.flock(self._users, fcntl.LOCK_SH)
        self._wait_shared(timeout_s)

    def others_present(self) -> bool:
        """(Holder.) Whether another process has announced itself."""
        if _try(self._users, fcntl.LOCK_EX):
            fcntl.flock(self._users, fcntl.LOCK_UN)
            return False
        return True

    def hand_over(self) -> None:
        """(Holder, its holds written.) Share from now on: announce first, so no one else can
        be elected while ``hold.lock`` changes hands."""
        fcntl.flock(self._users, fcntl.LOCK_SH)
        self.holding = False
        fcntl.flock(self._hold, fcntl.LOCK_UN)
        self._wait_shared(30.0)

    def reelect(self) -> bool:
        """(Sharer.) Become the holder if every other process has gone; return whether so.

        While ``users.lock`` is still ours nobody else can be elected, so letting go of
        ``hold.lock`` for a moment opens no window for a second holder."""
        fcntl.flock(self._hold, fcntl.LOCK_UN)
        if not _try(self._hold, fcntl.LOCK_EX):  # other sharers
            self._wait_shared(30.0)
            return False
        fcntl.flock(self._users, fcntl.LOCK_UN)
        if _try(self._users, fcntl.LOCK_EX):
            fcntl.flock(self._users, fcntl.LOCK_UN)
            self.holding = True
            return True
        # Someone announced themselves meanwhile: back to sharing (announce, then share).
        fcntl.flock(self._users, fcntl.LOCK_SH)
        fcntl.flock(self._hold, fcntl.LOCK_UN)
        self._wait_shared(30.0)
        return False

    def close(self) -> None:
        self.holding = False
        os.close(self._hold)
        os.close(self._users)

    def _wait_shared(self, timeout_s: float) -> None:
        # Polled, not blocking: a blocked flock cannot be given up on.
        deadline = time.monotonic() + timeout_s
        while not _try(self._hold, fcntl.LOCK_SH):
            if time.monotonic() > deadline:
                raise Unavailable("another process keeps in-flight messages of this store in memory")
            time.sleep(0.005)


def _try(fd: int, operation: int) -> bool:
    try:
        fcntl.flock(fd, operation | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True
