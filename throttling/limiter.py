"""The rate limiter: "allowed, or retry after N seconds", with the numbers for the IETF headers.

Built on ``limits.aio`` so the event loop never blocks on Redis. Storage is chosen by
URL: ``memory://`` (this process only) or ``redis://host:port`` (shared by every gateway
that names the same Redis). The strategy is the sliding window counter by default (see
``docs/throttling.md`` for why and what it costs); ``moving-window`` is there for
comparison (``bench/throttle_bench.py``).

Each rule's hit is followed by a read of its window, so an allowed answer also says how
much is left. A refused request has still consumed from the windows that did allow it
(the rules are independent counters).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Literal

from limits import RateLimitItem
from limits.aio.storage import MemoryStorage, RedisStorage, Storage
from limits.aio.strategies import MovingWindowRateLimiter, RateLimiter, SlidingWindowCounterRateLimiter
from limits.errors import StorageError
from redis.exceptions import RedisError

from .decision import ALLOWED, DEGRADED, Decision, Rule, Window, window_state
from .errors import InvalidLimit, SharedStateUnavailable
from .health import SharedStateHealth
from .sliding_window import SlidingWindowCounter
from .url import SharedStateUrl, redis_options

Strategy = Literal["sliding-window-counter", "moving-window"]
STRATEGIES: tuple[Strategy, ...] = ("sliding-window-counter", "moving-window")
KEY_PREFIX = "pushgate-limits"
# Errors that mean "the shared store did not answer", not a bug.
STORAGE_ERRORS: tuple[type[BaseException], ...] = (StorageError, RedisError, OSError, TimeoutError)


def open_storage(url: SharedStateUrl) -> Storage:
    """A ``limits`` async storage for a shared-state URL."""
    if url.is_memory:
        return MemoryStorage()
    return RedisStorage(
        "async+" + url.url,
        implementation="redispy",
        wrap_exceptions=True,
        key_prefix=KEY_PREFIX,
        **redis_options(url),
    )


class Limiter:
    """Checks requests against rules; one per gateway process.

    ``fail_closed``: when the shared store is down, refuse with
    :class:`SharedStateUnavailable` instead of allowing (the default is to allow).
    """

    def __init__(
        self,
        url: SharedStateUrl,
        health: SharedStateHealth,
        *,
        strategy: Strategy = "sliding-window-counter",
        fail_closed: bool = False,
    ) -> None:
        if strategy not in STRATEGIES:
            raise InvalidLimit(f"unknown rate-limit strategy {strategy!r}: one of {', '.join(STRATEGIES)}")
        self.url = url
        self.health = health
        self.fail_closed = fail_closed
        self.strategy = strategy
        self._storage = open_storage(url)
        # The default strategy goes to the storage directly (see sliding_window.py).
        self._sliding = SlidingWindowCounter(self._storage) if strategy == "sliding-window-counter" else None
        self._limiter: RateLimiter = (
            SlidingWindowCounterRateLimiter(self._storage)
            if strategy == "sliding-window-counter"
            else MovingWindowRateLimiter(self._storage)
        )

    async def check(self, rules: Sequence[Rule], cost: int = 1) -> Decision:
        """Count one request (of ``cost``) against every rule; say whether it may go on."""
        if not rules:
            return ALLOWED
        if not self.health.should_try():
            return self._unreachable()
        try:
            if self._sliding is not None:
                outcomes = await self._sliding.check(rules, cost)
            elif isinstance(self._storage, MemoryStorage):
                # In process, awaiting in turn is cheapest: gather's tasks cost more than the hits.
                outcomes = [await self._hit(rule, item, cost) for rule in rules for item in rule.rate.items]
            else:
                outcomes = list(
                    await asyncio.gather(
                        *(self._hit(rule, item, cost) for rule in rules for item in rule.rate.items)
                    )
                )
        except STORAGE_ERRORS as exc:
            self.health.failed(exc)
            return self._unreachable()
        self.health.succeeded()
        windows = tuple(window for window, _ in outcomes)
        refused = [window for window, allowed in outcomes if not allowed]
        if not refused:
            return Decision(True, windows)
        return Decision(False, windows, max(max(1, w.reset_s) for w in refused))

    async def _hit(self, rule: Rule, item: RateLimitItem, cost: int) -> tuple[Window, bool]:
        allowed = await self._limiter.hit(item, *rule.identifiers, cost=cost)
        stats = await self._limiter.get_window_stats(item, *rule.identifiers)
        return window_state(rule, item, stats.remaining, stats.reset_time), allowed

    def _unreachable(self) -> Decision:
        if self.fail_closed:
            raise SharedStateUnavailable("the rate limiter's shared store is unreachable")
        return DEGRADED

    async def clear(self, rule: Rule) -> None:
        """Forget a rule's counters (tests, and an operator resetting a tenant)."""
        for item in rule.rate.items:
            await self._limiter.clear(item, *rule.identifiers)

    async def close(self) -> None:
        storage: Any = self._storage
        if isinstance(storage, MemoryStorage):
            if storage.timer is not None and not storage.timer.done():
                storage.timer.cancel()
            return
        client = storage.bridge.get_connection()
        await client.aclose()
