"""The sliding window counter, straight on a ``limits`` storage: one Redis round trip per request.

``limits``' ``SlidingWindowCounterRateLimiter`` calls the storage once to acquire and once
to read, per rule, and builds each counter's key twice. A request under three rules thus
cost six Redis round trips, which made the Redis limiter cost several times the request it
guards (bench/throttle_bench.py). This class uses the same storages, the same keys and, on
Redis, the same registered Lua scripts, but sends every rule's acquire and read in **one
pipeline**, builds each key once, and does the strategy's arithmetic
(``SlidingWindowCounterRateLimiter.get_window_stats``) on the answers itself. In memory
it calls the storage's own methods in turn (gathering them as tasks cost more than they do).

It reaches into ``limits`` internals (the Redis bridge's scripts and key helpers), hence the
``limits<6`` pin; the throttling tests run it against a real Redis.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

from limits import RateLimitItem
from limits.aio.storage import MemoryStorage, RedisStorage, Storage

from .decision import Rule, Window, window_state

# (item, identifiers) -> the counter's key; bounded, cleared when full.
_MAX_KEYS = 100_000


class SlidingWindowCounter:
    def __init__(self, storage: Storage) -> None:
        self._storage: Any = storage
        self._redis = isinstance(storage, RedisStorage)
        if not self._redis and not isinstance(storage, MemoryStorage):
            raise TypeError(f"no sliding window counter for {type(storage).__name__}")
        self._keys: dict[tuple[RateLimitItem, tuple[str, ...]], str] = {}

    def _key(self, item: RateLimitItem, identifiers: tuple[str, ...]) -> str:
        cache_key = (item, identifiers)
        key = self._keys.get(cache_key)
        if key is None:
            if len(self._keys) >= _MAX_KEYS:
                self._keys.clear()
            key = self._keys[cache_key] = item.key_for(*identifiers)
        return key

    async def check(self, rules: Sequence[Rule], cost: int) -> list[tuple[Window, bool]]:
        """Acquire ``cost`` in every rule's windows; each window's state and whether it allowed it."""
        pairs = [(rule, item) for rule in rules for item in rule.rate.items]
        if self._redis:
            answers = await self._redis_round_trip(pairs, cost)
        else:
            answers = await self._memory(pairs, cost)
        now = time.time()
        return [
            _outcome(rule, item, acquired, window, now)
            for (rule, item), (acquired, window) in zip(pairs, answers, strict=True)
        ]

    async def _memory(
        self, pairs: list[tuple[Rule, RateLimitItem]], cost: int
    ) -> list[tuple[bool, tuple[int, float, int, float]]]:
        storage = self._storage
        out = []
        for rule, item in pairs:
            key, expiry = self._key(item, rule.identifiers), item.get_expiry()
            acquired = await storage.acquire_sliding_window_entry(key, item.amount, expiry, cost)
            out.append((acquired, await storage.get_sliding_window(key, expiry)))
        return out

    async def _redis_round_trip(
        self, pairs: list[tuple[Rule, RateLimitItem]], cost: int
    ) -> list[tuple[bool, tuple[int, float, int, float]]]:
        storage = self._storage
        bridge = storage.bridge
        async with bridge.get_connection().pipeline(transaction=False) as pipe:
            for rule, item in pairs:
                key = self._key(item, rule.identifiers)
                keys = [
                    bridge.prefixed_key(storage._previous_window_key(key)),
                    bridge.prefixed_key(storage._current_window_key(key)),
                ]
                expiry = item.get_expiry()
                # A script called with a pipeline queues its EVALSHA there (and loads it if missing).
                await bridge.lua_acquire_sliding_window(keys, [item.amount, expiry, cost], client=pipe)
                await bridge.lua_sliding_window(keys, [expiry], client=pipe)
            answers = await pipe.execute()
        out = []
        for n in range(len(pairs)):
            raw = answers[2 * n + 1]
            # As limits' bridge reads the script's answer: TTLs come in milliseconds.
            window = (
                (int(raw[0] or 0), max(0.0, float(raw[1] or 0)) / 1000, int(raw[2] or 0),
                 max(0.0, float(raw[3] or 0)) / 1000)
                if raw
                else (0, 0.0, 0, 0.0)
            )  # fmt: skip
            out.append((bool(answers[2 * n]), window))
        return out


def _outcome(
    rule: Rule, item: RateLimitItem, acquired: bool, window: tuple[int, float, int, float], now: float
) -> tuple[Window, bool]:
    """The strategy's ``get_window_stats`` arithmetic on a window read."""
    previous, previous_ttl, current, current_ttl = window
    expiry = item.get_expiry()
    weighted = previous * previous_ttl / expiry + current
    remaining = max(0, item.amount - math.floor(weighted))
    reset_in = math.inf
    if previous:
        reset_in = previous_ttl % (expiry / previous)
    if current:
        reset_in = min(reset_in, current_ttl % expiry)
    reset_time = now if math.isinf(reset_in) else now + reset_in
    return window_state(rule, item, remaining, reset_time), bool(acquired)
