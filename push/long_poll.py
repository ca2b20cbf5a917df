"""Long-poll receives: the HTTP fallback of push, on the same wake-ups as the dispatchers.

:meth:`LongPolls.receive` receives at once and, if nothing is there, parks until a
wake-up, the queue's next due message, the end of ``wait_s``, the client hanging up, the
server draining, or the caller's credentials being revoked, whichever comes first.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from backend_store.backend import QueueStore
from backend_store.errors import PushgateError
from backend_store.types import QueueName, ReceivedMessage

from .principal import PrincipalLike
from .wakeup import WakeupHub

# Never wait less than this for a message "due" now: a FIFO group's head can be due yet blocked.
_MIN_DUE_WAIT_S = 0.005


class ParkedPoll:
    """A long-poll waiting for messages; the watchdog may end it (revoked credentials)."""

    __slots__ = ("ended", "principal", "wake")

    def __init__(self, principal: PrincipalLike) -> None:
        self.principal = principal
        self.wake = asyncio.Event()
        self.ended: PushgateError | None = None

    def end(self, exc: PushgateError) -> None:
        self.ended = exc
        self.wake.set()


class LongPolls:
    """The long-polls of one engine: parked ones are counted, revocable and drained."""

    def __init__(self, backend: QueueStore, hub: WakeupHub, safety_poll_s: float) -> None:
        self.backend = backend
        self.hub = hub
        self.safety_poll_s = safety_poll_s
        self.parked: set[ParkedPoll] = set()
        self.draining = False

    async def receive(
        self,
        principal: PrincipalLike,
        queue: QueueName,
        max_messages: int,
        visibility_timeout_s: float | None,
        wait_s: float,
        hangup: Callable[[], Awaitable[None]],
    ) -> list[ReceivedMessage]:
        """Receive, waiting up to ``wait_s`` for a message; [] if none came or the client left.

        The hub's event is taken *before* each look, so a send that commits between the
        look and the wait still wakes us. Delayed and in-flight messages announce nothing
        when they become visible, so the wait also ends at the queue's next_visible_at.
        Raises the error that ended the poll (revoked credentials).
        """
        backend, hub, tenant = self.backend, self.hub, principal.tenant
        if wait_s <= 0:
            return await backend.receive(tenant, queue, max_messages, visibility_timeout_s)
        deadline = time.monotonic() + wait_s
        poll: ParkedPoll | None = None
        gone: asyncio.Task[None] | None = None
        try:
            while True:
                event = hub.event(tenant, queue)
                messages = await backend.receive(tenant, queue, max_messages, visibility_timeout_s)
                remaining = deadline - time.monotonic()
                if messages or remaining <= 0 or self.draining:
                    return messages
                if poll is not None and poll.ended is not None:
                    raise poll.ended
                timeout = min(remaining, self.safety_poll_s)
                next_visible = await backend.next_visible_at(tenant, queue)
                if next_visible is not None:
                    timeout = min(timeout, max(next_visible - time.time(), _MIN_DUE_WAIT_S))
                if poll is None or gone is None:
                    poll = ParkedPoll(principal)
                    self.parked.add(poll)
                    gone = asyncio.ensure_future(hangup())
                woken = asyncio.ensure_future(event.wait())
                stopped = asyncio.ensure_future(poll.wake.wait())
                try:
                    await asyncio.wait(
                        (woken, stopped, gone), timeout=timeout, return_when=asyncio.FIRST_COMPLETED
                    )
                finally:
                    woken.cancel()
                    stopped.cancel()
                if poll.ended is not None:
                    raise poll.ended
                if gone.done():
                    return []
        finally:
            if poll is not None:
                self.parked.discard(poll)
            if gone is not None:
                gone.cancel()

    def drain(self) -> None:
        """Shutdown: every parked poll answers now, with what it has (nothing)."""
        self.draining = True
        for poll in list(self.parked):
            poll.wake.set()
