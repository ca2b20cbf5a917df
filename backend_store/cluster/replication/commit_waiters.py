"""Writes waiting until a majority of the replica set holds their LSN.

A sync write waits once per request, so this is on every write's path: a plain future per
waiter, settled in LSN order from the left of a deque, and one timer for the whole queue
(armed at the oldest deadline) instead of a timeout scope and a shield per request.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

from ...errors import PushgateError
from ...types import Lsn


class CommitWaiters:
    def __init__(self, timed_out: Callable[[Lsn, float], PushgateError]) -> None:
        """``timed_out(lsn, timeout_s)``: the error a waiter gets when its time runs out."""
        self._timed_out = timed_out
        # (lsn, deadline, timeout_s, future), in the order the writes asked: LSNs do not go
        # down along it, since each write asks with the log's last LSN right after its commit.
        self._queue: deque[tuple[Lsn, float, float, asyncio.Future[None]]] = deque()
        self._timer: asyncio.TimerHandle | None = None

    def __len__(self) -> int:
        return len(self._queue)

    async def wait(self, lsn: Lsn, timeout_s: float) -> None:
        """Until :meth:`settle` reaches ``lsn``; raises what the queue was failed with, or
        ``timed_out(lsn, timeout_s)`` after ``timeout_s``."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        deadline = loop.time() + timeout_s
        self._queue.append((lsn, deadline, timeout_s, future))
        if self._timer is None or deadline < self._timer.when():
            if self._timer is not None:
                self._timer.cancel()
            self._timer = loop.call_at(deadline, self._expire)
        await future

    def settle(self, committed: Lsn) -> None:
        """Every write up to ``committed`` is on a majority: wake them."""
        queue = self._queue
        while queue and queue[0][0] <= committed:
            future = queue.popleft()[3]
            if not future.done():
                future.set_result(None)

    def fail(self, error: Callable[[Lsn], PushgateError]) -> None:
        """Fail every waiting write with ``error(its lsn)`` (the term ended)."""
        queue, self._queue = self._queue, deque()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for lsn, _, _, future in queue:
            if not future.done():
                future.set_exception(error(lsn))

    def _expire(self) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        keep: deque[tuple[Lsn, float, float, asyncio.Future[None]]] = deque()
        for waiter in self._queue:
            lsn, deadline, timeout_s, future = waiter
            if future.done():
                continue
            if deadline <= now:
                future.set_exception(self._timed_out(lsn, timeout_s))
            else:
                keep.append(waiter)
        self._queue = keep
        self._timer = loop.call_at(min(w[1] for w in keep), self._expire) if keep else None
