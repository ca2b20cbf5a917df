"""A small in-process cache whose entries expire after a fixed number of seconds, with
single-flight loads.

A miss used to be read by every request that met it: when a key record or a tenant's limits
expired under 64 concurrent producers, each of them read etcd (143 reads in 20 s where 4
would do, session 69), and a reconnect storm of devices sharing an API key read its record
once per handshake in flight. :meth:`TtlCache.load` reads a missing key once, however many
callers wait for it (Go's ``singleflight``; Caffeine's and Guava's loading caches).

A load that an invalidation (:meth:`TtlCache.pop`, :meth:`TtlCache.clear`) overtakes is
not cached: its read may predate the change that caused the invalidation, and caching it
would serve the old record for a whole TTL after the change. Callers who joined it before
the invalidation still get its value (they asked before the change, as a request whose own
read raced it would have); later callers start a load of their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

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
        # Loads in flight, each with the clock reading its value is trusted until.
        self._loads: dict[K, tuple[asyncio.Task[V], float]] = {}
        # Counts invalidations (pop, clear): see ``put``'s ``since``.
        self.generation = 0

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

    async def load(
        self, key: K, read: Callable[[], Awaitable[V]], *, keep: Callable[[V], bool] | None = None
    ) -> tuple[V, float]:
        """A fresh entry's value and its expiry, or else ``read()``'s, read once for every
        caller waiting meanwhile and cached (unless ``keep`` refuses the value, or an
        invalidation came while it was read). Its expiry counts from before the read: a
        value is never trusted past ``ttl_s`` after the moment it may have been read. A
        failed read fails every caller waiting for it and caches nothing."""
        found = self.lookup(key)
        if found is not None:
            return found
        flight = self._loads.get(key)
        if flight is None:
            until = self._clock() + self._ttl_s
            task = asyncio.create_task(self._read(key, read, keep, until))
            # A read whose every caller was cancelled must not log "never retrieved".
            task.add_done_callback(_retrieve)
            flight = self._loads[key] = (task, until)
        task, until = flight
        # One caller cancelled does not cancel the read the others wait for.
        return await asyncio.shield(task), until

    async def _read(
        self, key: K, read: Callable[[], Awaitable[V]], keep: Callable[[V], bool] | None, until: float
    ) -> V:
        current = asyncio.current_task()
        try:
            value = await read()
        finally:
            flight = self._loads.get(key)
            still_ours = flight is not None and flight[0] is current
            if still_ours:
                del self._loads[key]
        if still_ours and (keep is None or keep(value)):
            self._put_until(key, value, until)
        return value

    def put(self, key: K, value: V, ttl_s: float | None = None, *, since: int | None = None) -> None:
        """Store ``value`` for the cache's TTL, or for ``ttl_s`` if that is shorter; not if
        the cache was invalidated after ``since`` (its :attr:`generation` before ``value``
        was read: the invalidation may be for a change that read did not see)."""
        if since is not None and since != self.generation:
            return
        ttl = self._ttl_s if ttl_s is None else min(ttl_s, self._ttl_s)
        self._put_until(key, value, self._clock() + ttl)

    def _put_until(self, key: K, value: V, until: float) -> None:
        if until <= self._clock():
            return
        self._entries.pop(key, None)
        while len(self._entries) >= self._max_entries:
            del self._entries[next(iter(self._entries))]
        self._entries[key] = (until, value)

    def pop(self, key: K) -> None:
        """Forget ``key``, and any read of it in flight (see the module docstring)."""
        self.generation += 1
        self._entries.pop(key, None)
        self._loads.pop(key, None)

    def clear(self) -> None:
        self.generation += 1
        self._entries.clear()
        self._loads.clear()

    def __len__(self) -> int:
        return len(self._entries)


def _retrieve(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        with contextlib.suppress(BaseException):
            task.exception()
