"""A small shared key-value cache with expiry: memory or Redis (the gateway's dedupe front).

It is a cache, never the truth: a miss (or Redis down) sends the caller to the store,
whose answer is authoritative. Values are opaque bytes.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import redis.asyncio as aioredis

from .errors import STORAGE_ERRORS
from .health import SharedStateHealth
from .url import SharedStateUrl, redis_options

KEY_PREFIX = "pushgate-cache:"


class SharedCache(Protocol):
    async def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        """The values of ``keys`` (None: absent, expired, or the cache is unreachable)."""

    async def put(self, key: str, value: bytes, ttl_s: float) -> None:
        """Store ``value`` for ``ttl_s`` seconds (best effort)."""

    async def close(self) -> None: ...


class MemoryCache:
    """This process only; at most ``max_entries`` (the oldest go first)."""

    def __init__(self, max_entries: int = 100_000, clock: Callable[[], float] = time.monotonic) -> None:
        self._entries: dict[str, tuple[float, bytes]] = {}
        self._max_entries = max_entries
        self._clock = clock

    async def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        now = self._clock()
        out: list[bytes | None] = []
        for key in keys:
            entry = self._entries.get(key)
            if entry is not None and entry[0] <= now:
                del self._entries[key]
                entry = None
            out.append(None if entry is None else entry[1])
        return out

    async def put(self, key: str, value: bytes, ttl_s: float) -> None:
        if ttl_s <= 0:
            return
        self._entries.pop(key, None)
        while len(self._entries) >= self._max_entries:
            del self._entries[next(iter(self._entries))]
        self._entries[key] = (self._clock() + ttl_s, value)

    async def close(self) -> None:
        self._entries.clear()


class RedisCache:
    """``MGET`` and ``SET PX``; every failure is a miss (and reported to ``health``)."""

    def __init__(self, url: SharedStateUrl, health: SharedStateHealth) -> None:
        self.health = health
        self._client: Any = aioredis.Redis.from_url(url.url, **redis_options(url))

    async def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        if not keys or not self.health.should_try():
            return [None] * len(keys)
        try:
            values: list[bytes | None] = await self._client.mget([KEY_PREFIX + k for k in keys])
        except STORAGE_ERRORS as exc:
            self.health.failed(exc)
            return [None] * len(keys)
        self.health.succeeded()
        return values

    async def put(self, key: str, value: bytes, ttl_s: float) -> None:
        if ttl_s <= 0 or not self.health.should_try():
            return
        try:
            await self._client.set(KEY_PREFIX + key, value, px=max(1, int(ttl_s * 1000)))
        except STORAGE_ERRORS as exc:
            self.health.failed(exc)
        else:
            self.health.succeeded()

    async def close(self) -> None:
        with contextlib.suppress(*STORAGE_ERRORS):
            await self._client.aclose()


def open_cache(url: SharedStateUrl, health: SharedStateHealth) -> SharedCache:
    if url.is_memory:
        return MemoryCache()
    return RedisCache(url, health)
