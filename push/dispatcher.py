"""One dispatcher per queue with subscribers: receive as much as they have credit for,
hand it out fairly, sleep on wake-ups when there is nothing to do.

The loop, in short::

    clear the kick; take the subscribers' credit, grouped by visibility timeout;
    receive min(credit, max_receive) per group in one backend call; deal the messages
    round-robin; if a receive came back full, go again; else sleep until a kick (a send,
    a nack, an ack that freed credit, a new subscriber) or the next message due
    (``next_visible_at``: delayed messages and visibility expiries), capped by the
    safety poll.

FIFO ordering is the store's: it hands out at most one message per group, so dealing
them across subscribers keeps each group in order.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from typing import Protocol

from backend_store.backend import DeliverCallback, InMemoryReceive, QueueStore, StandingReceive
from backend_store.errors import PushgateError, QueueNotFound
from backend_store.types import QueueName, ReceivedMessage, TenantId

from .messages import encode_message
from .observed import record_delivered
from .observer import Observer
from .settings import PushSettings
from .subscription import Subscription

logger = logging.getLogger("pushgate.push")

# After a store error, wait this long (or for a kick) before trying again.
ERROR_BACKOFF_S = 0.5


class DispatchHost(Protocol):
    """What a dispatcher needs of the engine that runs it (and nothing else of it)."""

    @property
    def backend(self) -> QueueStore: ...

    @property
    def standing(self) -> StandingReceive | None: ...

    @property
    def in_memory(self) -> InMemoryReceive | None: ...

    @property
    def settings(self) -> PushSettings: ...

    @property
    def draining(self) -> bool: ...

    def release(self, tenant: TenantId, receipts: list[str]) -> None:
        """Make messages visible again at once."""

    @property
    def observer(self) -> Observer: ...

    def ack_delivered(self, tenant: TenantId, queue: QueueName, transport: str, receipts: list[str]) -> None:
        """Delete messages handed to auto-ack subscriptions (recorded as acks)."""

    def dispatcher_idle(self, dispatcher: Dispatcher) -> None:
        """The dispatcher's loop ended."""

    def end_subscription(self, sub: Subscription, exc: PushgateError) -> None:
        """A subscription's queue went away."""


class Dispatcher:
    __slots__ = (
        "_due",
        "_engine",
        "_kick",
        "_local_due",
        "_look",
        "_next",
        "_notified",
        "_standing",
        "_task",
        "queue",
        "subs",
        "tenant",
    )

    def __init__(self, engine: DispatchHost, tenant: TenantId, queue: QueueName) -> None:
        self._engine = engine
        self.tenant = tenant
        self.queue = queue
        self.subs: list[Subscription] = []
        self._kick = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        # Where the next deal starts, so no subscriber is always served first.
        self._next = 0
        # Whether the queue may have visible messages: false after a receive came back
        # short, true again after a notify, a timeout or a new subscriber. Credit coming
        # back (acks) alone never makes a message visible, so it does not cost a receive.
        self._look = True
        self._notified = False
        # When the store said the next message becomes visible (None: nothing pending),
        # and the earliest visibility end of what this dispatcher dealt since it asked.
        self._due: float | None = None
        self._local_due: float | None = None
        # The callback of the standing receive registered while idle (None: none).
        self._standing: DeliverCallback | None = None

    def add(self, sub: Subscription) -> None:
        self.subs.append(sub)
        self._look = True
        self.ensure_running()

    def ensure_running(self) -> None:
        self._kick.set()
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    @property
    def running(self) -> bool:
        return self._task is not None

    def remove(self, sub: Subscription) -> None:
        try:
            self.subs.remove(sub)
        except ValueError:
            return
        # Others may now get what this one would have.
        self._kick.set()

    def kick(self) -> None:
        """The queue changed (a send, a nack, a release): look again."""
        self._look = True
        self._notified = True
        self._kick.set()

    def credit_kick(self) -> None:
        """A subscriber has credit again: deal if the queue may have more."""
        self._kick.set()

    async def stop(self, timeout: float = 5.0) -> None:
        """Let the loop finish its current receive (releasing what it got), then end it."""
        task = self._task
        if task is None:
            return
        self._kick.set()
        try:
            async with asyncio.timeout(timeout):
                await asyncio.shield(task)
        except TimeoutError:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _run(self) -> None:
        engine = self._engine
        timed_out = False
        try:
            while self.subs and not engine.draining:
                self._kick.clear()
                notified, self._notified = self._notified, False
                try:
                    received, again = await self._pump() if self._look else (0, False)
                    if again:
                        continue
                    # Ask the store when the next message is due only when it may have
                    # changed: nothing came for a notify (a delayed send, a delayed nack)
                    # or a wait ran out. Not per delivered message: that read is a thread
                    # hop that would sit in every message's latency.
                    if timed_out or (notified and received == 0) or self._due_passed():
                        self._local_due = None  # the store's answer covers our deliveries too
                        self._due = await engine.backend.next_visible_at(self.tenant, self.queue)
                    timeout = self._idle_timeout()
                except QueueNotFound:
                    self._end_all(QueueNotFound("the queue was deleted"))
                    break
                except PushgateError as exc:
                    logger.warning("dispatcher of %s: %s", self.queue, exc.code)
                    timeout = ERROR_BACKOFF_S
                except Exception:
                    logger.exception("dispatcher of %s failed", self.queue)
                    timeout = ERROR_BACKOFF_S
                timed_out = False
                if not self._kick.is_set() and self.subs:
                    self._stand()
                    try:
                        async with asyncio.timeout(timeout):
                            await self._kick.wait()
                    except TimeoutError:
                        timed_out = self._look = True
                    finally:
                        self._sit()
        finally:
            self._task = None
            engine.dispatcher_idle(self)

    def _stand(self) -> None:
        """While idle, ask the store to receive for us in the commit of the next send."""
        standing = self._engine.standing
        if standing is None:
            return
        groups = self._wanting(time.time())
        if len(groups) != 1:
            return  # mixed visibility timeouts: the plain receive path serves them
        ((timeout, wanting),) = groups.items()
        want = min(self._engine.settings.max_receive, sum(credit for _, credit in wanting))
        # A callback of its own per registration, so a late delivery of an older one is
        # never mistaken for the current one (and the current one is always withdrawn).
        self._standing = functools.partial(self._delivered, want)
        in_memory = self._engine.in_memory is not None
        standing.set_demand(self.tenant, self.queue, want, timeout, self._standing, in_memory)

    def _sit(self) -> None:
        standing = self._engine.standing
        if standing is not None and self._standing is not None:
            standing.clear_demand(self.tenant, self.queue, self._standing)
        self._standing = None

    def _delivered(self, want: int, messages: list[ReceivedMessage]) -> None:
        """A standing receive came back with the commit that made these visible: the
        commit's wake-up (docs/push.md, "One commit, one signal"). A short answer says the
        queue had nothing more to give at that commit, and no backend wakes its listeners
        for such a commit, so no pump follows unless something else kicked meanwhile (a
        kick is never cancelled here). After a full answer the store woke the listeners
        too, this dispatcher among them: the pump that follows is that wake-up's, and it
        needs no look at when the next message is due."""
        self._look = self._look or len(messages) >= want
        self._notified = False
        if not self.subs or self._engine.draining:
            self._engine.release(self.tenant, [m.receipt for m in messages])
            return
        wanting = [pair for group in self._wanting(time.time()).values() for pair in group]
        self._deal(messages, wanting)
        self._kick.set()

    def _wanting(self, now: float) -> dict[float | None, list[tuple[Subscription, int]]]:
        """Subscribers with credit by visibility timeout, in turn from where the
        last pump stopped, only until there is credit for one full receive: a queue with
        thousands of subscribers costs a pump a few of them, not all, and each gets its turn."""
        limit = self._engine.settings.max_receive
        groups: dict[float | None, list[tuple[Subscription, int]]] = {}
        subs = self.subs
        count = len(subs)
        start = self._next % count if count else 0
        wanted = 0
        scanned = 0
        while scanned < count and wanted < limit:
            sub = subs[(start + scanned) % count]
            scanned += 1
            credit = sub.credit(now)
            if credit > 0:
                groups.setdefault(sub.visibility_timeout_s, []).append((sub, credit))
                wanted += credit
        self._next = start + scanned
        return groups

    def _due_passed(self) -> bool:
        return self._due is not None and self._due <= time.time()

    def _idle_timeout(self) -> float:
        """Sleep until the next message is due: the store's answer, or the first of our own
        deliveries whose visibility ends; the safety poll caps it."""
        settings = self._engine.settings
        due, local = self._due, self._local_due
        if local is not None and (due is None or local < due):
            due = local
        if due is None:
            return settings.safety_poll_s
        return min(settings.safety_poll_s, max(settings.min_poll_s, due - time.time()))

    async def _pump(self) -> tuple[int, bool]:
        """Receive and deal once; return how many messages came and whether to go again
        at once (a receive came back full: the queue may have more right now)."""
        limit = self._engine.settings.max_receive
        groups = self._wanting(time.time())
        if not groups:
            return 0, False  # no credit: nothing learned about the queue, _look stays
        full = False
        received = 0
        in_memory = self._engine.in_memory
        for timeout, wanting in groups.items():
            want = min(limit, sum(credit for _, credit in wanting))
            if in_memory is not None:
                # First deliveries held in memory until acked: nothing to write for them
                # (backend_store/lmdb_store/holds.py; a cluster never offers this).
                messages = await in_memory.receive_in_memory(self.tenant, self.queue, want, timeout)
            else:
                messages = await self._engine.backend.receive(self.tenant, self.queue, want, timeout)
            if messages:
                received += len(messages)
                self._deal(messages, wanting)
            full = full or len(messages) == want
        # A notify that came during the receive keeps _look set.
        self._look = full or self._notified
        return received, full

    def _deal(self, messages: list[ReceivedMessage], wanting: list[tuple[Subscription, int]]) -> None:
        # Subscribers may have gone while the receive was under way.
        open_subs = [(sub, credit) for sub, credit in wanting if sub.active and not sub.transport.closed]
        if not open_subs:
            self._engine.release(self.tenant, [m.receipt for m in messages])
            return
        count = len(open_subs)
        hands: list[list[ReceivedMessage]]
        leftover: list[ReceivedMessage]
        if count == 1:
            # One subscriber (the common case): its credit's worth, in order; no dealing.
            credit = max(0, open_subs[0][1])
            hands, leftover = [messages[:credit]], messages[credit:]
        else:
            hands = [[] for _ in range(count)]
            credits = [credit for _, credit in open_subs]
            # Round-robin, one message at a time, while credit lasts; whatever is left over
            # (credit shrank meanwhile) goes back to the queue at once.
            leftover = []
            i = 0
            for message in messages:
                for _ in range(count):
                    if credits[i] > 0:
                        break
                    i = (i + 1) % count
                if credits[i] <= 0:
                    leftover.append(message)
                    continue
                hands[i].append(message)
                credits[i] -= 1
                i = (i + 1) % count
        now = time.time()
        for (sub, _), hand in zip(open_subs, hands, strict=True):
            if hand:
                sub.deliver(hand, [encode_message(m) for m in hand])
                record_delivered(
                    self._engine.observer, self.tenant, self.queue, sub.transport.kind, hand, now
                )
                if sub.auto_ack:
                    # At most once: deleted as soon as it is handed to the stream.
                    self._engine.ack_delivered(
                        self.tenant, self.queue, sub.transport.kind, [m.receipt for m in hand]
                    )
                else:
                    ends = hand[0].visible_at
                    if self._local_due is None or ends < self._local_due:
                        self._local_due = ends
        if leftover:
            self._engine.release(self.tenant, [m.receipt for m in leftover])

    def _end_all(self, exc: PushgateError) -> None:
        for sub in list(self.subs):
            self._engine.end_subscription(sub, exc)
