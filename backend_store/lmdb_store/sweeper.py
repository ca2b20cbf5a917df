"""The embedded store's sweeper: messages past ``retention_s`` and expired dedupe entries are
dropped every ``sweep_interval_s``, in small transactions (at most 1,000 deletions and
``SWEEP_QUEUES`` queues each) so that sends are never held behind a whole sweep."""

from __future__ import annotations

import asyncio
import functools
import logging
from pathlib import Path

from ..errors import PushgateError
from ..options import StoreOptions
from .environment import Writes
from .store_core import StoreCore

log = logging.getLogger("pushgate.store")
_SWEEP_BUDGET = 1000


class Sweeper(StoreCore):
    """A task that sweeps while the store runs (none with ``sweep_interval_s`` 0: a backend
    node sweeps the partitions it leads itself)."""

    def __init__(self, path: Path, options: StoreOptions) -> None:
        super().__init__(path, options)
        self._sweeper: asyncio.Task[None] | None = None

    def _start_sweeping(self) -> None:
        if self.options.sweep_interval_s > 0:
            self._sweeper = asyncio.create_task(self._sweep_forever(), name="pushgate-sweeper")

    async def _stop_sweeping(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.wait([self._sweeper])
            self._sweeper = None

    async def sweep(self) -> int:
        """Drop messages past retention and expired dedupe entries now; return how many.

        What the sweeper runs every ``sweep_interval_s``. A backend node sets the interval
        to 0 and calls this on partitions it leads only: a follower's store changes only
        through the leader's log.
        """
        done = 0
        start: bytes | None = b""
        while start is not None:
            # Small transactions, each going on where the last one stopped.
            count, start = await self._write(functools.partial(self._sweep_some, start))
            done += count
        return done

    def _sweep_some(self, start: bytes, w: Writes, now: float) -> tuple[int, bytes | None]:
        return self._ops.sweep(w, now, _SWEEP_BUDGET, start)

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(self.options.sweep_interval_s)
            try:
                await self.sweep()
            except PushgateError as exc:
                log.warning("sweep failed: %s", exc.detail)
