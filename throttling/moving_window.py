"""The moving-window strategy (``PUSHGATE_RATE_LIMIT_STRATEGY=moving-window``), through ``limits``' public API.

Exact (one timestamp per hit, kept for the whole window) and much slower than the default
(bench/throttle_bench.py): a ``limits`` strategy hit and window read per rule, two Redis
round trips each with Redis. It is kept for operators who want exactness over speed, and
as the comparison the benchmark prints. Only documented ``limits`` API is used: the async
storages (memory, or Redis over a connection pool this module owns and closes), the
``MovingWindowRateLimiter`` strategy and its ``WindowStats``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import redis.asyncio as aioredis
from limits import RateLimitItem
from limits.aio.storage import MemoryStorage, RedisStorage, Storage
from limits.aio.strategies import MovingWindowRateLimiter

from .decision import Decision, Rule, Window, policy_name
from .rates import window_seconds
from .url import SharedStateUrl, redis_options

KEY_PREFIX = "pushgate-limits"


class MovingWindow:
    def __init__(self, url: SharedStateUrl) -> None:
        self._pool: aioredis.ConnectionPool | None = None
        storage: Storage
        if url.is_memory:
            storage = MemoryStorage()
        else:
            self._pool = aioredis.ConnectionPool.from_url(url.url, **redis_options(url))
            storage = RedisStorage(
                "async+" + url.url,
                implementation="redispy",
                wrap_exceptions=True,
                key_prefix=KEY_PREFIX,
                connection_pool=self._pool,  # type: ignore[arg-type]  # limits types options as scalars
            )
        self._limiter = MovingWindowRateLimiter(storage)

    async def check(self, rules: Sequence[Rule], cost: int) -> Decision:
        windows: list[Window] = []
        retry_after = 0
        for rule in rules:
            for item in rule.rate.items:
                window, allowed = await self._hit(rule, item, cost)
                windows.append(window)
                if not allowed:
                    retry_after = max(retry_after, window.reset_s)
        return Decision(retry_after == 0, tuple(windows), retry_after)

    async def _hit(self, rule: Rule, item: RateLimitItem, cost: int) -> tuple[Window, bool]:
        allowed = await self._limiter.hit(item, *rule.identifiers, cost=cost)
        stats = await self._limiter.get_window_stats(item, *rule.identifiers)
        window_s = window_seconds(item)
        now = time.time()
        reset_s = math.ceil(stats.reset_time - now)
        if reset_s <= 0:
            # A window with room reports when its current period ends, as the default strategy does.
            reset_s = math.ceil(window_s - now % window_s)
        window = Window(policy_name(rule, window_s), item.amount, window_s, stats.remaining, max(1, reset_s))
        return window, allowed

    async def clear(self, rule: Rule) -> None:
        for item in rule.rate.items:
            await self._limiter.clear(item, *rule.identifiers)

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.aclose()
