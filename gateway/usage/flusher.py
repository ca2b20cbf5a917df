"""The usage flusher: a gateway component that writes the aggregator out every few seconds.

Guarantees (docs/usage.md):

- every ``interval_s`` seconds, and at each UTC hour boundary, the aggregator's window is
  closed and written as one file, so a record's window never spans two hours;
- ``close`` (the app's shutdown, which SIGTERM starts) writes the last window after the
  push engine and the routes have recorded their final outcomes (the flusher is the
  first component registered, so it is closed last);
- a crash (SIGKILL, power loss) loses at most the window being aggregated, never a file
  already written (files are written whole and fsynced, see ``writer.py``);
- a failed write (disk full) is retried at the next flush, keeping at most
  ``max_pending`` windows in memory; older ones are dropped with an error logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable

from .aggregator import UsageAggregator
from .record import UsageRecord
from .writer import UsageWriter

log = logging.getLogger("pushgate.usage")


class UsageFlusher:
    """A :class:`~gateway.services.Component`: start, drain, close."""

    def __init__(
        self,
        aggregator: UsageAggregator,
        writer: UsageWriter,
        interval_s: float,
        *,
        clock: Callable[[], float] = time.time,
        max_pending: int = 60,
    ) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be positive")
        self.aggregator = aggregator
        self.writer = writer
        self.interval_s = interval_s
        self.clock = clock
        self.max_pending = max_pending
        self.files_written = 0
        self._sequence = 0
        self._pending: list[tuple[int, list[UsageRecord]]] = []
        self._lock = asyncio.Lock()
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def next_delay(self) -> float:
        """Seconds to the next flush: the interval, or less to stop at the hour boundary."""
        now = self.clock()
        next_hour = (math.floor(now / 3600) + 1) * 3600
        return max(0.0, min(self.interval_s, next_hour - now))

    async def start(self) -> None:
        removed = await asyncio.to_thread(self.writer.remove_stale_temps)
        if removed:
            log.warning("removed %d unfinished usage file(s) left by a crash", removed)
        self._task = asyncio.create_task(self._run(), name="usage-flusher")

    async def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.next_delay()):
                    await self._stop.wait()
            if not self._stop.is_set():
                await self.flush()

    async def flush(self) -> None:
        """Close the current window and write it (and any window a failed write left)."""
        async with self._lock:
            window = self.aggregator.end_window()
            if window.cells:
                # Built off the event loop: a window of 10,000 queues' usage held a gateway's
                # loop, and its requests, 40-60 ms (session 85).
                records = await asyncio.to_thread(window.records, self.writer.gateway_id, self._sequence)
                self._pending.append((self._sequence, records))
                self._sequence += 1
            while self._pending:
                sequence, batch = self._pending[0]
                try:
                    await asyncio.to_thread(self.writer.write, batch, sequence)
                except OSError:
                    log.exception("could not write usage file %d; will retry", sequence)
                    self._drop_excess()
                    return
                self._pending.pop(0)
                self.files_written += 1

    def _drop_excess(self) -> None:
        while len(self._pending) > self.max_pending:
            sequence, batch = self._pending.pop(0)
            log.error("dropped usage window %d (%d records): writes keep failing", sequence, len(batch))

    async def drain(self) -> None:
        """Nothing to do yet: connections still close after this, and their usage counts."""

    async def close(self) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task
            self._task = None
        await self.flush()
