"""A test-only clock a test process moves for node processes: one float64 in a shared file.

Why: the Backend contract suite moves a ``ManualClock`` injected as ``StoreOptions.clock``
(``clock.advance(60)``, then a store call that must see the new time). On ``cluster://`` the
store's time is read in ``pushgate node`` processes, so the test's clock has to reach them.
A node started with ``PUSHGATE_TEST_CLOCK_FILE=PATH`` in its environment (the test harness's
dev cluster; never a production node) opens PATH and reads its time from it on every clock
call; nothing else changes. Without that variable a node's stores keep ``time.time``, exactly
as before: no extra cost on the production path.

Format: 8 bytes, a native float64 at offset 0 (page-aligned in the mapping, so one aligned
8-byte store and load: a reader never sees half a value). **0 means real time**, so one dev
cluster serves tests that hold the clock and tests that do not (the gateway and push suites).

Ordering: the writer stores the value in the shared mapping before it sends the request
that must see it; the node reads it after that request arrived (a socket write and read lie
between, and each is a system call), so a store call made right after ``advance`` sees the
new time on the leader. Followers never read it for data: they apply the leader's records.
A reading costs 0.3-0.5 us here (a struct unpack from the mapping; ``time.time`` 0.1 us).
"""

from __future__ import annotations

import asyncio
import mmap
import os
import struct
import time
from collections.abc import AsyncGenerator
from pathlib import Path

# The environment variable the node reads (test harnesses only: docs/cluster.md).
ENV_VAR = "PUSHGATE_TEST_CLOCK_FILE"
_VALUE = struct.Struct("d")  # native: one aligned 8-byte load or store


def _mapping(path: Path, writable: bool) -> mmap.mmap:
    fd = os.open(path, os.O_RDWR if writable else os.O_RDONLY)
    try:
        return mmap.mmap(fd, _VALUE.size, access=mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ)
    finally:
        os.close(fd)


class ClockFile:
    """The node's side: a clock (``StoreOptions.clock``) read from ``path``; 0 there: real time."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._map = _mapping(path, writable=False)
        self._unpack = _VALUE.unpack_from

    def __call__(self) -> float:
        (value,) = self._unpack(self._map, 0)
        return value or time.time()

    def held(self) -> float:
        """The value in the file (0.0: nobody holds the clock, real time)."""
        return float(self._unpack(self._map, 0)[0])

    async def moves(self, since: float, poll_s: float = 0.01) -> AsyncGenerator[float, None]:
        """Yield the file's value each time it differs from the last one (``since`` first);
        polled, since the writer is another process.

        What waits on time in a node (the leader's retention sweeps) waits on this too, as
        an embedded store's sweeper runs often under a test's ManualClock."""
        last = since
        while True:
            await asyncio.sleep(poll_s)
            value = self.held()
            if value != last:
                last = value
                yield value

    def close(self) -> None:
        self._map.close()


class ClockFileWriter:
    """The test's side: creates the file (real time) and publishes a clock's readings to it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.write_bytes(_VALUE.pack(0.0))
        self._map = _mapping(path, writable=True)

    def publish(self, now: float) -> None:
        """Every node reads ``now`` from here on (0.0: real time again)."""
        _VALUE.pack_into(self._map, 0, now)

    def close(self) -> None:
        self._map.close()
