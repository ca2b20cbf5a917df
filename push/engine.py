"""The delivery engine: connections, subscriptions, per-queue dispatchers, acks and drain.

It knows no transport: a connection is a :class:`~push.transport.Transport` (write-only)
and the subscriptions on it. Everything a connection holds goes back to the queue at
once when it closes, unsubscribes, is too slow or the server drains; a disconnected SSE
stream keeps its messages for a short grace so a reconnect with ``Last-Event-ID`` can
keep what it already read (see :meth:`PushEngine.suspend`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from backend_store.backend import Backend, StandingReceive
from backend_store.errors import InvalidRequest, StoreError, Unavailable
from backend_store.types import AckResult, NewMessage, QueueName, TenantId

from .batching import AckBatcher, AckReply, SendBatcher, SendReply
from .close_codes import CloseCode
from .dispatcher import Dispatcher
from .settings import PushSettings
from .subscription import Subscription
from .transport import Transport
from .wakeup import WakeupHub

logger = logging.getLogger("pushgate.push")


class Connection:
    """One consumer connection (a WebSocket, or one SSE stream) and its subscriptions."""

    __slots__ = ("auto_subs", "stream_id", "subs", "tenant", "transport")

    def __init__(self, tenant: TenantId, transport: Transport, stream_id: str | None = None) -> None:
        self.tenant = tenant
        self.transport = transport
        self.subs: dict[str, Subscription] = {}
        self.stream_id = stream_id
        self.auto_subs = 0


class AlreadySubscribed(InvalidRequest):
    pass


class GoingAway(Unavailable):
    pass


class PushEngine:
    def __init__(self, backend: Backend, hub: WakeupHub, settings: PushSettings | None = None) -> None:
        self.backend = backend
        # Receive in the commit that makes messages visible, when the store can (one commit
        # from send to push instead of two).
        self.standing: StandingReceive | None = backend if isinstance(backend, StandingReceive) else None
        self.hub = hub
        self.settings = settings or PushSettings()
        self.acks = AckBatcher(backend)
        self.sends = SendBatcher(backend)
        self.draining = False
        # Receipt -> the subscription holding it, so acks from any path (WS, HTTP) free credit.
        self.owners: dict[str, Subscription] = {}
        self._dispatchers: dict[tuple[TenantId, QueueName], Dispatcher] = {}
        self._connections: set[Connection] = set()
        # Live SSE streams by stream id, for a reconnect that beats the old stream's disconnect.
        self._streams: dict[str, Connection] = {}
        # Disconnected SSE streams waiting for a resume: stream id -> (subscription, release timer).
        self._suspended: dict[str, tuple[Subscription, asyncio.TimerHandle]] = {}

    # Connections --------------------------------------------------------------

    def open_connection(
        self, tenant: TenantId, transport: Transport, stream_id: str | None = None
    ) -> Connection:
        if self.draining:
            raise GoingAway("server is shutting down")
        conn = Connection(tenant, transport, stream_id)
        self._connections.add(conn)
        if stream_id is not None:
            self._streams[stream_id] = conn
        transport.bind(lambda code, reason: self.close_connection(conn), lambda: self._drained(conn))
        return conn

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

    def subscribe(
        self,
        conn: Connection,
        queue: QueueName,
        *,
        prefetch: int,
        auto_ack: bool = False,
        visibility_timeout_s: float | None = None,
        batch: int = 1,
        start: bool = True,
    ) -> Subscription:
        """Add a subscription; with ``start`` false the caller starts it later (after a resume)."""
        if self.draining:
            raise GoingAway("server is shutting down")
        if queue in conn.subs:
            raise AlreadySubscribed(f"already subscribed to {queue}")
        if len(conn.subs) >= self.settings.max_subscriptions_per_connection:
            raise InvalidRequest("too many subscriptions on one connection")
        sub = Subscription(
            conn.tenant,
            queue,
            conn.transport,
            self.owners,
            prefetch=prefetch,
            auto_ack=auto_ack,
            visibility_timeout_s=visibility_timeout_s,
            batch=batch,
        )
        conn.subs[queue] = sub
        conn.auto_subs += auto_ack
        if start:
            self.start_subscription(sub)
        return sub

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

    def end_subscription(self, sub: Subscription, code: str, detail: str) -> None:
        """The queue went away under a subscription: drop it and tell the client."""
        for conn in list(self._connections):
            if conn.subs.get(sub.queue) is sub:
                self._drop(conn, sub)
                conn.transport.end_subscription(sub.queue, code, detail)
                return

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

    def _kick(self, sub: Subscription) -> None:
        """A subscription got credit back."""
        dispatcher = self._dispatchers.get((sub.tenant, sub.queue))
        if dispatcher is not None:
            dispatcher.credit_kick()

    # Acks, nacks, sends ---------------------------------------------------------------

    def settle(self, receipts: Sequence[str]) -> None:
        """Receipts were acked or nacked (by any path): free their subscriptions' credit."""
        owners = self.owners
        kicked: Subscription | None = None
        for receipt in receipts:
            sub = owners.get(receipt)
            if sub is not None and sub.settle(receipt) and sub is not kicked:
                kicked = sub
                self._kick(sub)

    def release(self, tenant: TenantId, receipts: list[str]) -> None:
        """Make messages visible again at once (nack without delay)."""
        if receipts:
            self.acks.nack(tenant, receipts, 0)

    def ack(self, tenant: TenantId, receipts: Sequence[str], reply: AckReply | None = None) -> None:
        self.settle(receipts)
        self.acks.ack(tenant, receipts, reply)

    def nack(
        self, tenant: TenantId, receipts: Sequence[str], delay_s: float = 0, reply: AckReply | None = None
    ) -> None:
        self.settle(receipts)
        self.acks.nack(tenant, receipts, delay_s, reply)

    async def ack_now(
        self, tenant: TenantId, receipts: Sequence[str], queue: QueueName | None = None
    ) -> AckResult:
        """The HTTP ack path: ack through the backend and free the credit of SSE streams."""
        self.settle(receipts)
        return await self.backend.ack(tenant, receipts, queue)

    async def nack_now(
        self, tenant: TenantId, receipts: Sequence[str], delay_s: float = 0, queue: QueueName | None = None
    ) -> AckResult:
        self.settle(receipts)
        return await self.backend.nack(tenant, receipts, delay_s, queue)

    def send(
        self, tenant: TenantId, queue: QueueName, entries: list[NewMessage | InvalidRequest], reply: SendReply
    ) -> None:
        self.sends.send(tenant, queue, entries, reply)

    # Life ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Nothing to open: dispatchers start with their first subscriber."""

    async def close(self) -> None:
        await self.drain()

    async def drain(self) -> None:
        """Stop accepting, close every connection with 1001 (ending SSE streams), release
        every in-flight message and wait until the store has taken the releases."""
        self.draining = True
        for conn in list(self._connections):
            conn.transport.close(CloseCode.GOING_AWAY, "server shutting down")
            self.close_connection(conn)
        for stream_id in list(self._suspended):
            self._suspended[stream_id][1].cancel()
            self._expire_suspended(stream_id)
        await asyncio.gather(*(d.stop() for d in list(self._dispatchers.values())))
        await self.sends.wait_idle()
        await self.acks.wait_idle()

    def stats(self) -> dict[str, Any]:
        return {
            "connections": len(self._connections),
            "dispatchers": len(self._dispatchers),
            "in_flight": len(self.owners),
            "suspended_streams": len(self._suspended),
        }


__all__ = ["AlreadySubscribed", "Connection", "GoingAway", "PushEngine", "StoreError"]
