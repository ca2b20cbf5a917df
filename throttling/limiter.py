"""The rate limiter: "allowed, or retry after N seconds", with the numbers for the IETF headers.

Storage is chosen by URL: ``memory://`` (this process only) or ``redis://host:port``
(shared by every gateway that names the same Redis). The default strategy, the sliding
window counter, is this package's own code on both (``local_counters.py`` in memory,
``shared_budget.py`` on Redis, through local shares of each counter's budget); the
``limits`` library parses the rates and serves the ``moving-window`` strategy through its
public API (``moving_window.py``). docs/throttling.md says why, what each costs and how far
the Redis counters can be passed.

Every window of every rule is counted; an allowed answer also says how much is left. A
refused request has still consumed from the windows that did allow it (the rules are
independent counters).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Literal

from .decision import ALLOWED, DEGRADED, Decision, Rule
from .errors import STORAGE_ERRORS, InvalidLimit, SharedStateUnavailable
from .health import SharedStateHealth
from .local_counters import LocalCounters
from .moving_window import MovingWindow
from .shared_budget import LOCAL_SHARE, Pending, SharedBudget
from .url import SharedStateUrl

__all__ = ["STORAGE_ERRORS", "STRATEGIES", "Limiter", "Strategy"]

Strategy = Literal["sliding-window-counter", "moving-window"]
STRATEGIES: tuple[Strategy, ...] = ("sliding-window-counter", "moving-window")


class Limiter:
    """Checks requests against rules; one per gateway process.

    ``fail_closed``: when the shared store is down, refuse with
    :class:`SharedStateUnavailable` instead of allowing (the default is to allow).
    ``local_share``: the fraction of a Redis counter's amount a gateway may hold and spend
    without asking Redis (see docs/throttling.md, "How far a limit can be passed").
    ``clock``: seconds, for the counters' windows (tests move it by hand).
    """

    def __init__(
        self,
        url: SharedStateUrl,
        health: SharedStateHealth,
        *,
        strategy: Strategy = "sliding-window-counter",
        fail_closed: bool = False,
        local_share: float = LOCAL_SHARE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if strategy not in STRATEGIES:
            raise InvalidLimit(f"unknown rate-limit strategy {strategy!r}: one of {', '.join(STRATEGIES)}")
        if not 0 <= local_share < 1:
            raise InvalidLimit(f"local_share must be at least 0 and below 1, got {local_share!r}")
        self.url = url
        self.health = health
        self.fail_closed = fail_closed
        self.strategy = strategy
        self._local: LocalCounters | None = None
        self._shared: SharedBudget | None = None
        self._moving: MovingWindow | None = None
        if strategy == "moving-window":
            self._moving = MovingWindow(url)
        elif url.is_memory:
            self._local = LocalCounters(clock)
        else:
            self._shared = SharedBudget(url, health, local_share=local_share, clock=clock)

    @property
    def shared_budget(self) -> SharedBudget | None:
        """The Redis counters' shares (None in memory or with the moving window): for metrics and tests."""
        return self._shared

    async def check(self, rules: Sequence[Rule], cost: int = 1) -> Decision:
        """Count one request (of ``cost``) against every rule; say whether it may go on."""
        if not rules:
            return ALLOWED
        if self._local is not None:
            return self._local.check(rules, cost)
        if not self.health.should_try():
            return self._unreachable()
        if self._shared is not None:
            begun = self._shared.begin(rules, cost)
            if type(begun) is Decision:
                return begun
            assert isinstance(begun, Pending)
            decision = await self._shared.finish(begun, cost)
            return self._unreachable() if decision is None else decision
        assert self._moving is not None
        try:
            decision = await self._moving.check(rules, cost)
        except STORAGE_ERRORS as exc:
            self.health.failed(exc)
            return self._unreachable()
        self.health.succeeded()
        return decision

    def _unreachable(self) -> Decision:
        if self.fail_closed:
            raise SharedStateUnavailable("the rate limiter's shared store is unreachable")
        return DEGRADED

    async def clear(self, rule: Rule) -> None:
        """Forget a rule's counters (tests, and an operator resetting a tenant)."""
        if self._local is not None:
            self._local.clear(rule)
        elif self._shared is not None:
            await self._shared.clear(rule)
        elif self._moving is not None:
            await self._moving.clear(rule)

    async def close(self) -> None:
        if self._shared is not None:
            await self._shared.close()
        if self._moving is not None:
            await self._moving.close()
