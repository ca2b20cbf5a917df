"""The delivery engine: the one path to delivery state.

Connections, subscriptions, per-queue dispatchers, acks from any transport (WebSocket
frames and the HTTP routes), long-polls, drain, and a watchdog. It knows no transport: a
connection is a :class:`~push.transport.Transport` (write-only) and the subscriptions on
it. Everything a connection holds goes back to the queue at once when it closes,
unsubscribes, is too slow, loses its credentials or the server drains; a disconnected SSE
stream keeps its messages for a short grace so a reconnect with ``Last-Event-ID`` can
keep what it already read (see :meth:`PushEngine.suspend`).

The watchdog, every ``watchdog_interval_s``, closes with 4008 the connections whose socket
has not drained for ``write_timeout_s`` and those with a stalled subscription (see
:mod:`push.subscription`), closes with 4001 those whose token expired, and every
``recheck_interval_s`` checks the credentials of every open connection and parked
long-poll again (the injected ``recheck``): a revoked API key or a removed JWT key ends
them (4001, or 401 for a long-poll), a key that no longer covers a subscribed queue 4003.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from backend_store.backend import InMemoryReceive, QueueStore, StandingReceive
from backend_store.errors import Forbidden, InvalidRequest, PushgateError, Unavailable
from backend_store.types import AckResult, NewMessage, QueueInfo, QueueName, ReceivedMessage, TenantId

from .batching import AckBatcher
from .close_codes import CloseCode, close_code_for
from .dispatcher import Dispatcher
from .long_poll import LongPolls
from .observed import AckReply
from .observer import WS, Observer, Observers
from .principal import PrincipalLike, Recheck
from .send_group import SendGroup
from .send_path import SendItem, SendPath, SendReply
from .settings import PushSettings
from .subscription import Connection, EncodeFrames, Subscription
from .transport import SseTransport, Transport
from .wakeup import WakeupHub

logger = logging.getLogger("pushgate.push")


# A queue's name, attributes and creation time (raises ``QueueNotFound``); its stats are not read.
QueueInfoReader = Callable[[TenantId, QueueName], Awaitable[QueueInfo]]


class AlreadySubscribed(InvalidRequest):
    pass


class GoingAway(Unavailable):
    pass


class PushEngine:
    def __init__(
        self,
        backend: QueueStore,
        hub: WakeupHub,
        settings: PushSettings | None = None,
        recheck: Recheck | None = None,
        observer: Observer | None = None,
        sends: SendPath | None = None,
        queue_info: QueueInfoReader | None = None,
    ) -> None:
        self.backend = backend
        # A queue's attributes and existence, as a subscribe asks: the gateway's queue cache
        # (gateway/queue_cache.py), so that a reconnect storm's subscribes read no store; alone,
        # the store itself.
        self.queue_info: QueueInfoReader = queue_info or backend.get_queue
        # Where delivery outcomes are reported (usage records; see push/observer.py).
        self.observer: Observer = observer or Observers()
        # The one send path (push/send_path.py): the gateway gives its own, with the quota and
        # the dedupe front; alone, the engine sends straight to the store.
        self.sends = sends or SendPath(backend.send, backend.get_queue, self.observer)
        # Receive in the commit that makes messages visible, when the store can (one commit
        # from send to push instead of two).
        self.standing: StandingReceive | None = backend if isinstance(backend, StandingReceive) else None
        self.in_memory: InMemoryReceive | None = backend if isinstance(backend, InMemoryReceive) else None
        self.hub = hub
        self.settings = settings or PushSettings()
        self._recheck = recheck
        self.acks = AckBatcher(backend, self.observer)
        self.polls = LongPolls(backend, hub, self.settings.safety_poll_s)
        self.draining = False
        # Receipt -> the subscription holding it, so acks from any path (WS, HTTP) free credit.
        self.owners: dict[str, Subscription] = {}
        self._dispatchers: dict[tuple[TenantId, QueueName], Dispatcher] = {}
        self._connections: set[Connection] = set()
        # (transport, close code) -> connections closed so (metrics).
        self.closes: collections.Counter[tuple[str, int]] = collections.Counter()
        # Live SSE streams by stream id, for a reconnect that beats the old stream's disconnect.
        self._streams: dict[str, Connection] = {}
        # Disconnected SSE streams waiting for a resume: stream id -> (subscription, release timer).
        self._suspended: dict[str, tuple[Subscription, asyncio.TimerHandle]] = {}
        self._watchdog: asyncio.Task[None] | None = None

    # Connections --------------------------------------------------------------

    def open_connection(
        self,
        principal: PrincipalLike,
        transport: Transport,
        stream_id: str | None = None,
        close: Callable[[CloseCode, str], None] | None = None,
        end_subscription: Callable[[str, PushgateError], None] | None = None,
    ) -> Connection:
        """Register a connection; ``close`` is how the engine ends it (default: the transport's),
        ``end_subscription`` how it tells of a queue deleted under a subscription."""
        if self.draining:
            raise GoingAway("server is shutting down")
        conn = Connection(principal, transport, stream_id, close, end_subscription)
        self.observer.observe(conn.tenant, "", "connect", transport.kind)
        self._connections.add(conn)
        if stream_id is not None:
            self._streams[stream_id] = conn
        transport.bind(lambda code, reason: self._closed(conn, code), lambda: self._drained(conn))
        return conn

    def _closed(self, conn: Connection, code: CloseCode) -> None:
        # Every close of a transport passes here once, whoever closed it: counted by code
        # (slow consumers 4008, authentication 4001/4003, shutdown 1001) for /metrics.
        self.closes[transport_kind(conn.transport), int(code)] += 1
        self.close_connection(conn)

    def _drained(self, conn: Connection) -> None:
        # An auto-ack subscription's credit is the transport's backlog: it just emptied.
        if conn.auto_subs:
            for sub in conn.subs.values():
                if sub.auto_ack:
                    self._kick(sub)

    def _forget(self, conn: Connection) -> None:
        self._connections.discard(conn)
        if conn.stream_id is not None and self._streams.get(conn.stream_id) is conn:
            del self._streams[conn.stream_id]

    def close_connection(self, conn: Connection) -> None:
        """Forget a connection and release everything it holds, at once. Idempotent."""
        self._forget(conn)
        for sub in list(conn.subs.values()):
            self._drop(conn, sub)

    def suspend(self, conn: Connection) -> None:
        """An SSE client went away: stop delivering, but hold its messages for a resume."""
        self._forget(conn)
        for sub in list(conn.subs.values()):
            self._detach(conn, sub)
            if conn.stream_id is None or not sub.in_flight or self.draining:
                self.release(sub.tenant, sub.take_all())
                continue
            timer = asyncio.get_running_loop().call_later(
                self.settings.sse_resume_grace_s, self._expire_suspended, conn.stream_id
            )
            self._suspended[conn.stream_id] = (sub, timer)

    def _expire_suspended(self, stream_id: str) -> None:
        entry = self._suspended.pop(stream_id, None)
        if entry is not None:
            self.release(entry[0].tenant, entry[0].take_all())

    def resume(self, sub: Subscription, stream_id: str, last_n: int) -> int:
        """A stream reconnected with ``Last-Event-ID: <stream_id>.<last_n>``: release what the
        old stream sent after it, keep (and count against ``sub``) what it sent up to it.
        Return how many messages were released."""
        old = self._suspended.pop(stream_id, None)
        if old is None:
            # The old stream may not have noticed its client is gone yet.
            conn = self._streams.get(stream_id)
            if conn is not None and conn.tenant == sub.tenant:
                self.suspend(conn)
                conn.transport.close(CloseCode.NORMAL, "resumed elsewhere")
                old = self._suspended.pop(stream_id, None)
        if old is None:
            return 0
        old_sub, timer = old
        timer.cancel()
        if old_sub.tenant != sub.tenant or old_sub.queue != sub.queue:
            self.release(old_sub.tenant, old_sub.take_all())
            return 0
        later = old_sub.take_after(last_n)
        self.release(sub.tenant, later)
        sub.adopt(old_sub)
        return len(later)

    # Subscriptions --------------------------------------------------------------

    async def subscribe(
        self,
        conn: Connection,
        queue: QueueName,
        encode: EncodeFrames,
        *,
        prefetch: int,
        auto_ack: bool = False,
        visibility_timeout_s: float | None = None,
        batch: int = 1,
        start: bool = True,
    ) -> Subscription:
        """Add a subscription (the queue's own visibility timeout unless one is given);
        with ``start`` false the caller starts it later (after a resume).

        Raises QueueNotFound, AlreadySubscribed, InvalidRequest or GoingAway. Nothing is
        awaited once the subscription exists, so a reply written right after this returns
        precedes the first delivery."""
        self._check_open(conn, queue)
        info = await self.queue_info(conn.tenant, queue)
        self._check_open(conn, queue)
        sub = Subscription(
            conn,
            queue,
            encode,
            self.owners,
            prefetch=prefetch,
            auto_ack=auto_ack,
            visibility_timeout_s=info.attributes.visibility_timeout_s
            if visibility_timeout_s is None
            else visibility_timeout_s,
            batch=batch,
            stall_checks=self.settings.stall_grace_s is not None,
        )
        conn.subs[queue] = sub
        conn.auto_subs += auto_ack
        if start:
            self.start_subscription(sub)
        return sub

    def _check_open(self, conn: Connection, queue: str) -> None:
        if self.draining or conn.transport.closed:
            raise GoingAway("server is shutting down" if self.draining else "connection closed")
        if queue in conn.subs:
            raise AlreadySubscribed(f"already subscribed to {queue}")
        if len(conn.subs) >= self.settings.max_subscriptions_per_connection:
            raise InvalidRequest("too many subscriptions on one connection")

    def start_subscription(self, sub: Subscription) -> None:
        key = (sub.tenant, sub.queue)
        dispatcher = self._dispatchers.get(key)
        if dispatcher is None:
            dispatcher = self._dispatchers[key] = Dispatcher(self, sub.tenant, sub.queue)
            self.hub.watch(sub.tenant, sub.queue, dispatcher.kick)
        dispatcher.add(sub)

    def unsubscribe(self, conn: Connection, queue: str) -> bool:
        sub = conn.subs.get(queue)
        if sub is None:
            return False
        self._drop(conn, sub)
        return True

    def end_subscription(self, sub: Subscription, exc: PushgateError) -> None:
        """The queue went away under a subscription: drop it and tell the client."""
        conn = sub.conn
        if conn.subs.get(sub.queue) is sub:
            self._drop(conn, sub)
            conn.end_subscription(sub.queue, exc)

    def _detach(self, conn: Connection, sub: Subscription) -> None:
        sub.active = False
        if conn.subs.get(sub.queue) is sub:
            del conn.subs[sub.queue]
            conn.auto_subs -= sub.auto_ack
        dispatcher = self._dispatchers.get((sub.tenant, sub.queue))
        if dispatcher is not None:
            dispatcher.remove(sub)
            if not dispatcher.subs and not dispatcher.running:
                self.dispatcher_idle(dispatcher)

    def _drop(self, conn: Connection, sub: Subscription) -> None:
        self._detach(conn, sub)
        self.release(sub.tenant, sub.take_all())

    def dispatcher_idle(self, dispatcher: Dispatcher) -> None:
        """A dispatcher's loop ended; forget it unless someone subscribed meanwhile."""
        key = (dispatcher.tenant, dispatcher.queue)
        if dispatcher.subs and not self.draining:
            dispatcher.ensure_running()
            return
        if self._dispatchers.get(key) is dispatcher:
            del self._dispatchers[key]
            self.hub.unwatch(dispatcher.tenant, dispatcher.queue, dispatcher.kick)

    def consumers(self, tenant: TenantId, queue: QueueName) -> int:
        """How many subscriptions receive from a queue through this engine (queue stats)."""
        dispatcher = self._dispatchers.get((tenant, queue))
        return len(dispatcher.subs) if dispatcher is not None else 0

    def subscriptions(self, tenant: TenantId, queue: QueueName) -> list[tuple[str, int, int]]:
        """``(transport, unacked, prefetch)`` of each subscription of a queue (the console's list)."""
        dispatcher = self._dispatchers.get((tenant, queue))
        if dispatcher is None:
            return []
        return [(transport_kind(s.transport), len(s.in_flight), s.prefetch) for s in dispatcher.subs]

    def _kick(self, sub: Subscription) -> None:
        """A subscription got credit back."""
        dispatcher = self._dispatchers.get((sub.tenant, sub.queue))
        if dispatcher is not None:
            dispatcher.credit_kick()

    # Acks, nacks, sends, receives -----------------------------------------------------

    def settle(self, receipts: Sequence[str]) -> dict[str, str]:
        """Receipts were acked or nacked (by any path): free their subscriptions' credit.
        Returns the queue of each receipt this gateway delivered (for usage records)."""
        owners = self.owners
        queue_of: dict[str, str] = {}
        kicked: Subscription | None = None
        for receipt in receipts:
            sub = owners.get(receipt)
            if sub is None:
                continue
            queue_of[receipt] = sub.queue
            if sub.settle(receipt) and sub is not kicked:
                kicked = sub
                sub.conn.heard()
                self._kick(sub)
        return queue_of

    def release(self, tenant: TenantId, receipts: list[str]) -> None:
        """Make messages visible again at once (nack without delay)."""
        if receipts:
            self.acks.nack(tenant, receipts, 0)

    def ack_delivered(self, tenant: TenantId, queue: QueueName, transport: str, receipts: list[str]) -> None:
        """Delete messages handed to auto-ack subscriptions (at most once); each counts as an
        ``ack`` on ``transport`` once the store answers."""
        self.acks.ack(tenant, receipts, None, (transport, queue))

    def ack(self, tenant: TenantId, receipts: Sequence[str], reply: AckReply | None = None) -> None:
        """The WebSocket ack: coalesced with other acks of the tenant into one store call."""
        self.acks.ack(tenant, receipts, reply, (WS, self.settle(receipts)))

    def nack(
        self, tenant: TenantId, receipts: Sequence[str], delay_s: float = 0, reply: AckReply | None = None
    ) -> None:
        self.acks.nack(tenant, receipts, delay_s, reply, (WS, self.settle(receipts)))

    async def ack_now(self, tenant: TenantId, receipts: Sequence[str], queue: QueueName) -> AckResult:
        """The HTTP ack: through the store now, freeing the credit of the streams that held them."""
        self.settle(receipts)
        return await self.backend.ack(tenant, receipts, queue)

    async def nack_now(
        self, tenant: TenantId, receipts: Sequence[str], delay_s: float, queue: QueueName
    ) -> AckResult:
        self.settle(receipts)
        return await self.backend.nack(tenant, receipts, delay_s, queue)

    async def change_visibility(
        self, tenant: TenantId, queue: QueueName, receipt: str, timeout_s: float
    ) -> None:
        await self.backend.change_visibility(tenant, queue, receipt, timeout_s)
        if timeout_s == 0:
            # Visible again at once: it is no longer the stream's to count.
            self.settle([receipt])

    def send(
        self,
        tenant: TenantId,
        queue: QueueName,
        entries: list[NewMessage | PushgateError],
        reply: SendReply,
        transport: str = WS,
    ) -> None:
        """A send answered through ``reply`` (a WebSocket batch frame), on the one send path."""
        self.sends.submit(tenant, queue, SendItem(entries, reply, transport, time.perf_counter()))

    def send_group(self, tenant: TenantId, group: SendGroup) -> None:
        """Queue a WebSocket connection's single-message sends to one queue as one item;
        more join it until the send path takes it (see :mod:`push.send_group`)."""
        self.sends.submit(tenant, group.queue, group)

    async def receive(
        self,
        principal: PrincipalLike,
        queue: QueueName,
        max_messages: int,
        visibility_timeout_s: float | None,
        wait_s: float,
        hangup: Callable[[], Awaitable[None]],
    ) -> list[ReceivedMessage]:
        """A pull or long-poll receive (see :mod:`push.long_poll`)."""
        return await self.polls.receive(principal, queue, max_messages, visibility_timeout_s, wait_s, hangup)

    # The watchdog ------------------------------------------------------------------

    async def _watch(self) -> None:
        settings = self.settings
        next_recheck = time.monotonic() + settings.recheck_interval_s
        while True:
            await asyncio.sleep(settings.watchdog_interval_s)
            self._close_slow_and_expired()
            if self._recheck is not None and time.monotonic() >= next_recheck:
                next_recheck = time.monotonic() + settings.recheck_interval_s
                try:
                    await self._recheck_credentials(self._recheck)
                except PushgateError as exc:
                    # The store may be briefly unavailable: keep connections, try next round.
                    logger.warning("credential recheck skipped: %s", exc.code)

    def _close_slow_and_expired(self) -> None:
        settings = self.settings
        now, mono = time.time(), time.monotonic()
        for conn in list(self._connections):
            transport = conn.transport
            if transport.closed:
                continue
            expires_at = conn.principal.expires_at
            if expires_at is not None and expires_at <= now:
                conn.close(CloseCode.AUTH_FAILED, "token expired")
                continue
            blocked = transport.blocked_since
            if blocked is not None and mono - blocked > settings.write_timeout_s:
                conn.close(CloseCode.POLICY, "slow consumer: the socket is not draining")
                continue
            if settings.stall_grace_s is None:
                continue
            for sub in conn.subs.values():
                if sub.stalled(now, settings.stall_grace_s):
                    conn.close(CloseCode.POLICY, f"slow consumer: messages of {sub.queue} timed out unacked")
                    break

    async def _recheck_credentials(self, recheck: Recheck) -> None:
        principals = {conn.principal for conn in self._connections}
        principals.update(poll.principal for poll in self.polls.parked)
        if not principals:
            return
        verdicts = await recheck(principals)
        for conn in list(self._connections):
            verdict = verdicts.get(conn.principal)
            if verdict is None or conn.transport.closed:
                continue
            if isinstance(verdict, PushgateError):
                conn.close(close_code_for(verdict, CloseCode.AUTH_FAILED), verdict.detail)
                continue
            lost = [queue for queue in conn.subs if not verdict.can("receive", queue)]
            if lost:
                error = Forbidden(f"forbidden: the key can no longer receive from {lost[0]}")
                conn.close(close_code_for(error), error.detail)
        for poll in list(self.polls.parked):
            verdict = verdicts.get(poll.principal)
            if isinstance(verdict, PushgateError):
                poll.end(verdict)

    # Life ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the watchdog; dispatchers start with their first subscriber."""
        self._watchdog = asyncio.get_running_loop().create_task(self._watch())

    async def close(self) -> None:
        await self.drain()

    async def drain(self) -> None:
        """Stop accepting, close every connection with 1001 (ending SSE streams), answer
        parked long-polls, release every in-flight message and wait until the store has
        taken the releases."""
        self.draining = True
        if self._watchdog is not None:
            self._watchdog.cancel()
            await asyncio.wait([self._watchdog])
            self._watchdog = None
        self.polls.drain()
        for conn in list(self._connections):
            conn.close(CloseCode.GOING_AWAY, "server shutting down")
            self.close_connection(conn)
        for stream_id in list(self._suspended):
            self._suspended[stream_id][1].cancel()
            self._expire_suspended(stream_id)
        await asyncio.gather(*(d.stop() for d in list(self._dispatchers.values())))
        await self.sends.wait_idle()
        await self.acks.wait_idle()

    def stats(self) -> dict[str, Any]:
        sse = sum(1 for conn in self._connections if isinstance(conn.transport, SseTransport))
        return {
            "connections": len(self._connections),
            "connections_sse": sse,
            "connections_websocket": len(self._connections) - sse,
            "dispatchers": len(self._dispatchers),
            "in_flight": len(self.owners),
            "suspended_streams": len(self._suspended),
            "parked_polls": len(self.polls.parked),
            "closes": dict(self.closes),
        }


def transport_kind(transport: Transport) -> str:
    return "sse" if isinstance(transport, SseTransport) else "websocket"


__all__ = ["AlreadySubscribed", "Connection", "GoingAway", "PushEngine"]
