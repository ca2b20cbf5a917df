"""The rate limiter: "allowed, or retry after N seconds", with the numbers for the IETF headers.

Built on ``limits.aio`` so the event loop never blocks on Redis. Storage is chosen by
URL: ``memory://`` (this process only) or ``redis://host:port`` (shared by every gateway
that names the same Redis). The strategy is the sliding window counter by default (see
``docs/throttling.md`` for why and what it costs); ``moving-window`` is there for
comparison (``bench/throttle_bench.py``).

Every rule of a request is hit concurrently, and each hit is followed by a read of its
window, so an allowed answer also says how much is left. A refused request has still
consumed from the windows that did allow it (the rules are independent counters).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from limits import RateLimitItem
from limits.aio.storage import MemoryStorage, RedisStorage, Storage
from limits.aio.strategies import MovingWindowRateLimiter, RateLimiter, SlidingWindowCounterRateLimiter
from limits.errors import StorageError
from redis.exceptions import RedisError

from .errors import InvalidLimit, SharedStateUnavailable
from .health import SharedStateHealth
from .rates import Rate, window_seconds
from .url import SharedStateUrl, redis_options

Strategy = Literal["sliding-window-counter", "moving-window"]
STRATEGIES: tuple[Strategy, ...] = ("sliding-window-counter", "moving-window")
KEY_PREFIX = "pushgate-limits"
# Errors that mean "the shared store did not answer", not a bug.
STORAGE_ERRORS: tuple[type[BaseException], ...] = (StorageError, RedisError, OSError, TimeoutError)


@dataclass(frozen=True, slots=True)
class Rule:
    """One counter a request passes through: a named policy, its rate, and whose counter it is."""

    policy: str
    rate: Rate
    identifiers: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Window:
    """The state of one window after a request (the IETF fields' numbers)."""

    policy: str
    quota: int
    window_s: int
    remaining: int
    # Seconds until the window has room again (rounded up).
    reset_s: int


@dataclass(frozen=True, slots=True)
class Decision:
    """Allowed or not; ``retry_after_s`` > 0 only when refused.

    ``degraded``: the shared store did not answer and the limiter fails open, so the
    request was allowed without being counted (no windows to report).
    """

    allowed: bool
    windows: tuple[Window, ...] = ()
    retry_after_s: int = 0
    degraded: bool = False


ALLOWED = Decision(True)
DEGRADED = Decision(True, degraded=True)


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
        self._pipelined = (
            PipelinedSlidingWindow(self._storage)
            if isinstance(self._storage, RedisStorage) and strategy == "sliding-window-counter"
            else None
        )
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
            if self._pipelined is not None:
                outcomes = await self._pipelined.check(rules, cost)
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


def window_state(rule: Rule, item: RateLimitItem, remaining: int, reset_time: float) -> Window:
    """A :class:`Window` from a window's remaining count and reset time (epoch seconds)."""
    policy = rule.policy if len(rule.rate.items) == 1 else f"{rule.policy}-{window_seconds(item)}s"
    window_s = window_seconds(item)
    now = time.time()
    reset_s = math.ceil(reset_time - now)
    if reset_s <= 0:
        # The sliding window counter's reset time is "when the next hit frees", which is
        # now for a window with room: report when its current counter rolls over instead.
        reset_s = math.ceil(window_s - now % window_s)
    return Window(policy, item.amount, window_s, remaining, reset_s)


class PipelinedSlidingWindow:
    """The sliding window counter on Redis in one round trip per request, not two per rule.

    ``limits``' strategy calls its Lua scripts one at a time: an acquire and a window read
    per rule, so a request under three rules costs six round trips, which made the Redis
    limiter cost more than the request it guards (bench/throttle_bench.py). This runs the
    same registered scripts of the same storage, on the same keys, in one pipeline, and
    does the strategy's arithmetic (``SlidingWindowCounterRateLimiter.get_window_stats``)
    on the answers. The generic path and this one share their tests.
    """

    def __init__(self, storage: RedisStorage) -> None:
        self._storage = storage
        self._bridge: Any = storage.bridge

    async def check(self, rules: Sequence[Rule], cost: int) -> list[tuple[Window, bool]]:
        bridge = self._bridge
        storage: Any = self._storage
        pairs = [(rule, item) for rule in rules for item in rule.rate.items]
        async with bridge.get_connection().pipeline(transaction=False) as pipe:
            for rule, item in pairs:
                key = item.key_for(*rule.identifiers)
                keys = [
                    bridge.prefixed_key(storage._previous_window_key(key)),
                    bridge.prefixed_key(storage._current_window_key(key)),
                ]
                expiry = item.get_expiry()
                # A script called with a pipeline queues its EVALSHA there (and loads it if missing).
                await bridge.lua_acquire_sliding_window(keys, [item.amount, expiry, cost], client=pipe)
                await bridge.lua_sliding_window(keys, [expiry], client=pipe)
            answers = await pipe.execute()
        now = time.time()
        out: list[tuple[Window, bool]] = []
        for n, (rule, item) in enumerate(pairs):
            acquired, window = answers[2 * n], answers[2 * n + 1]
            previous, previous_ttl, current, current_ttl = (
                (int(window[0] or 0), max(0.0, float(window[1] or 0)) / 1000, int(window[2] or 0),
                 max(0.0, float(window[3] or 0)) / 1000)
                if window
                else (0, 0.0, 0, 0.0)
            )  # fmt: skip
            expiry = item.get_expiry()
            weighted = previous * previous_ttl / expiry + current
            remaining = max(0, item.amount - math.floor(weighted))
            reset_in = math.inf
            if previous:
                reset_in = previous_ttl % (expiry / previous)
            if current:
                reset_in = min(reset_in, current_ttl % expiry)
            reset_time = now if math.isinf(reset_in) else now + reset_in
            out.append((window_state(rule, item, remaining, reset_time), bool(acquired)))
        return out
