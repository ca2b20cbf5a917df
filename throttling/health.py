"""Whether the shared store (Redis) answers: logged once per outage, retried with a pause.

Every user of Redis in this package (the limiter, the broadcaster, the dedupe front)
reports to one :class:`SharedStateHealth`. While Redis is down, callers skip it until
``retry_interval_s`` has passed since the last failure, so an outage costs one failed
attempt per interval instead of a connect timeout on every request; the first call
after the interval probes it, and a success marks it up again by itself.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

log = logging.getLogger("pushgate.throttling")

HealthListener = Callable[[bool], None]


class SharedStateHealth:
    """Up or down, since when, and why (for ``/readyz`` and a metric)."""

    def __init__(
        self,
        name: str = "redis",
        *,
        retry_interval_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.retry_interval_s = retry_interval_s
        self._clock = clock
        self.up = True
        self.error: str | None = None
        self.down_since: float | None = None
        self._retry_at = 0.0
        self._listeners: list[HealthListener] = []

    def add_listener(self, listener: HealthListener) -> None:
        """Call ``listener(up)`` now and on every change."""
        self._listeners.append(listener)
        listener(self.up)

    def should_try(self) -> bool:
        """Whether to call Redis now: always when up, once per retry interval when down."""
        return self.up or self._clock() >= self._retry_at

    def failed(self, exc: BaseException) -> None:
        """A call failed: mark down (logged once per outage) and pause calls for a while."""
        self._retry_at = self._clock() + self.retry_interval_s
        if not self.up:
            return
        self.up = False
        self.down_since = time.time()
        self.error = f"{type(exc).__name__}: {exc}"[:200]
        log.warning("%s unreachable (%s); serving without it until it returns", self.name, self.error)
        self._changed()

    def succeeded(self) -> None:
        """A call worked: mark up (logged once) if it was down."""
        if self.up:
            return
        self.up = True
        log.warning("%s reachable again after %.1f s", self.name, time.time() - (self.down_since or 0))
        self.error = None
        self.down_since = None
        self._changed()

    def detail(self) -> dict[str, object]:
        """What ``/readyz`` shows."""
        out: dict[str, object] = {"status": "up" if self.up else "down"}
        if not self.up:
            out["since"] = self.down_since
            out["error"] = self.error
        return out

    def _changed(self) -> None:
        for listener in self._listeners:
            try:
                listener(self.up)
            except Exception:
                log.exception("health listener failed")
