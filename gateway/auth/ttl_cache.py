"""A small in-process cache whose entries expire after a fixed number of seconds."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class TtlCache(Generic[K, V]):
    """Maps keys to values for ``ttl_s`` seconds; holds at most ``max_entries`` (oldest go first).

    Not thread-safe: it lives on one event loop.
    """

    def __init__(
        self, ttl_s: float, max_entries: int = 10_000, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._ttl_s = ttl_s
        self._max_entries = max_entries
        self._clock = clock
        self._entries: dict[K, tuple[float, V]] = {}

    def get(self, key: K) -> tuple[bool, V | None]:
        """``(True, value)`` for a fresh entry, else ``(False, None)``."""
        entry = self._entries.get(key)
        if entry is None:
            return False, None
        if entry[0] <= self._clock():
            del self._entries[key]
            return False, None
        return True, entry[1]

    def lookup(self, key: K) -> tuple[V, float] | None:
        """A fresh entry's value and the clock reading at which it expires, else None."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry[0] <= self._clock():
            del self._entries[key]
            return None
        return entry[1], entry[0]

    def put(self, key: K, value: V, ttl_s: float | None = None) -> None:
        """Store ``value`` for the cache's TTL, or for ``ttl_s`` if that is shorter."""
        ttl = self._ttl_s if ttl_s is None else min(ttl_s, self._ttl_s)
        if ttl <= 0:
            return
        self._entries.pop(key, None)
        while len(self._entries) >= self._max_entries:
            del self._entries[next(iter(self._entries))]
        self._entries[key] = (self._clock() + ttl, value)

    def pop(self, key: K) -> None:
        self._entries.pop(key, None)

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)
