"""A warning in the log while connections fill the open-file limit.

Past the limit, uvloop (libuv) accepts each new connection and closes it at once, and nothing
is logged: clients see resets, and an operator without a Prometheus alert on
``process_open_fds`` (deploy/prometheus-alerts.yml) has nothing to go on. So the gateway
counts its open connections every few seconds, one ``len`` of uvicorn's set, and warns while
they hold more than 80% of the limit. The warning comes at most once a minute, and once more
when the count is back under.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

log = logging.getLogger("pushgate.gateway")

SHARE = 0.8  # as the PushgateOpenFilesFilling rule
EVERY_S = 5.0
REPEAT_S = 60.0


class OpenFilesWatch:
    """``count``: the connections open now; ``limit``: the process's open-file limit."""

    def __init__(
        self,
        count: Callable[[], int],
        limit: int,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._count = count
        self._limit = limit
        self._clock = clock
        self._warned_at: float | None = None  # while over the share

    def check(self) -> None:
        count = self._count()
        over = count >= SHARE * self._limit
        now = self._clock()
        if over and (self._warned_at is None or now - self._warned_at >= REPEAT_S):
            self._warned_at = now
            log.warning(
                "%d connections hold %d%% of the open-file limit (%d): past it, new connections"
                " are dropped without an answer; raise the limit (docs/http.md, 'Open files')",
                count,
                round(100 * count / self._limit),
                self._limit,
            )
        elif not over and self._warned_at is not None:
            self._warned_at = None
            log.warning(
                "%d connections, under %d%% of the open-file limit (%d) again",
                count,
                round(100 * SHARE),
                self._limit,
            )

    async def run(self) -> None:
        while True:
            await asyncio.sleep(EVERY_S)
            self.check()
