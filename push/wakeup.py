"""Wake-ups: a queue changed, so whoever waits on it (dispatchers, long-polls) looks again.

The in-process hub is registered as a backend listener. Waiting is by event, never by
busy polling; callers still pass a timeout so a lost wake-up costs at most that long.
"""

from __future__ import annotations

import asyncio

from backend_store.types import QueueName, TenantId

_Key = tuple[TenantId, QueueName]


class WakeupHub:
    """One event per watched queue; :meth:`notify` wakes every current waiter of it."""

    def __init__(self) -> None:
        self._events: dict[_Key, asyncio.Event] = {}

    def notify(self, tenant: TenantId, queue: QueueName) -> None:
        event = self._events.pop((tenant, queue), None)
        if event is not None:
            event.set()

    def event(self, tenant: TenantId, queue: QueueName) -> asyncio.Event:
        """The event the next :meth:`notify` of this queue sets. Take it *before* looking."""
        key = (tenant, queue)
        event = self._events.get(key)
        if event is None:
            event = self._events[key] = asyncio.Event()
        return event

    async def wait(self, event: asyncio.Event, timeout: float) -> bool:
        """Wait for an event from :meth:`event`; return whether it fired."""
        if event.is_set():
            return True
        try:
            async with asyncio.timeout(timeout):
                await event.wait()
        except TimeoutError:
            return False
        return True
