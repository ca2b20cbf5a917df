"""The embedded store's sweeper: messages past ``retention_s`` and expired dedupe entries are
dropped in small transactions (at most 1,000 deletions each), every ``sweep_interval_s``."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from ..errors import PushgateError
from ..options import StoreOptions
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
        # Small transactions: keep going only while a sweep hits its budget.
        while (count := await self._write(lambda w, now: self._ops.sweep(w, now, _SWEEP_BUDGET))) > 0:
            done += count
            if count < _SWEEP_BUDGET:
                break
        return done

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(self.options.sweep_interval_s)
            try:
                await self.sweep()
            except PushgateError as exc:
                log.warning("sweep failed: %s", exc.detail)
