"""Wake-ups: a queue changed, so whoever waits on it (dispatchers, long-polls) looks again.

The in-process hub is registered as a backend listener. Waiting is by event, never by
busy polling; callers still pass a timeout so a lost wake-up costs at most that long.
Long-lived waiters (the push dispatchers) register a callback with :meth:`watch`
instead of taking a fresh event each time.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from backend_store.types import QueueName, TenantId

_Key = tuple[TenantId, QueueName]

logger = logging.getLogger("pushgate.push")


class WakeupHub:
    """One event per watched queue; :meth:`notify` wakes every current waiter of it."""

    def __init__(self) -> None:
        self._events: dict[_Key, asyncio.Event] = {}
        self._watchers: dict[_Key, list[Callable[[], None]]] = {}

    def notify(self, tenant: TenantId, queue: QueueName) -> None:
        key = (tenant, queue)
        event = self._events.pop(key, None)
        if event is not None:
            event.set()
        watchers = self._watchers.get(key)
        if watchers:
            for callback in watchers:
                try:
                    callback()
                except Exception:
                    logger.exception("wake-up callback failed")

    def notify_all(self) -> None:
        """Wake every waiter of every queue (wake-ups from elsewhere may have been lost)."""
        for tenant, queue in {*self._events, *self._watchers}:
            self.notify(tenant, queue)

    def event(self, tenant: TenantId, queue: QueueName) -> asyncio.Event:
        """The event the next :meth:`notify` of this queue sets. Take it *before* looking."""
        key = (tenant, queue)
        event = self._events.get(key)
        if event is None:
            event = self._events[key] = asyncio.Event()
        return event

    def watch(self, tenant: TenantId, queue: QueueName, callback: Callable[[], None]) -> None:
        """Call ``callback`` (cheap, synchronous) on every notify of a queue until :meth:`unwatch`."""
        self._watchers.setdefault((tenant, queue), []).append(callback)

    def unwatch(self, tenant: TenantId, queue: QueueName, callback: Callable[[], None]) -> None:
        key = (tenant, queue)
        watchers = self._watchers.get(key)
        if watchers is None:
            return
        try:
            watchers.remove(callback)
        except ValueError:
            return
        if not watchers:
            del self._watchers[key]
