"""A consumer's connection and its subscriptions: credit, held messages, liveness.

A :class:`Connection` is one WebSocket or one SSE stream: a write-only transport, the
principal it authenticated as, and when the client was last heard from. A
:class:`Subscription` is one queue on it: credit is ``prefetch`` minus the messages
delivered and not yet acked, nacked or timed out. Auto-ack subscriptions hold nothing;
their credit is bounded by the transport's backlog instead, so a fast queue never floods
a slow socket.

A consumer that stops reading must not get credit back each time its messages' visibility
ends (it would soak up messages healthy consumers wait for): a timed-out message gives its
credit back only if the client was heard from after it was delivered (an ack, a nack, any
frame). Otherwise the subscription is *stalled*, and the engine closes it (4008).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from backend_store.errors import PushgateError
from backend_store.types import QueueName, ReceivedMessage, TenantId

from .close_codes import CloseCode
from .principal import PrincipalLike

if TYPE_CHECKING:
    from .transport import Transport

# Turns a subscription's encoded messages, numbered from ``first_n``, into transport frames.
EncodeFrames = Callable[[Sequence[bytes], int], list[Any]]

# Receipt -> (the message's number in its subscription, when its visibility ends, when it
# was delivered); wall-clock seconds, as the store's visible_at.
InFlight = dict[str, tuple[int, float, float]]


class Connection:
    """One consumer connection (a WebSocket, or one SSE stream) and its subscriptions."""

    __slots__ = (
        "auto_subs",
        "close",
        "end_subscription",
        "heard_at",
        "principal",
        "stream_id",
        "subs",
        "tenant",
        "transport",
    )

    def __init__(
        self,
        principal: PrincipalLike,
        transport: Transport,
        stream_id: str | None = None,
        close: Callable[[CloseCode, str], None] | None = None,
        end_subscription: Callable[[str, PushgateError], None] | None = None,
    ) -> None:
        self.principal = principal
        self.tenant: TenantId = principal.tenant
        self.transport = transport
        self.subs: dict[str, Subscription] = {}
        self.stream_id = stream_id
        self.auto_subs = 0
        # How the engine ends this connection (the WebSocket handler routes it through its
        # protocol so the protocol's state stays true); default: close the transport.
        self.close: Callable[[CloseCode, str], None] = close or transport.close
        # How a subscription that ended without the client asking (its queue was deleted)
        # is told; default: the connection ends (an SSE stream serves one queue).
        self.end_subscription: Callable[[str, PushgateError], None] = end_subscription or (
            lambda queue, exc: self.close(CloseCode.NORMAL, f"{exc.code}: {exc.detail}")
        )
        self.heard_at = time.time()

    def heard(self) -> None:
        """The client showed it is alive and reading (a frame, an ack)."""
        self.heard_at = time.time()


class Subscription:
    """Per-(connection, queue) delivery state; a few small objects, no task."""

    __slots__ = (
        "active",
        "auto_ack",
        "batch",
        "conn",
        "delivered",
        "encode",
        "in_flight",
        "owners",
        "prefetch",
        "queue",
        "stall_checks",
        "tenant",
        "transport",
        "visibility_timeout_s",
    )

    def __init__(
        self,
        conn: Connection,
        queue: QueueName,
        encode: EncodeFrames,
        owners: dict[str, Subscription],
        *,
        prefetch: int,
        auto_ack: bool,
        visibility_timeout_s: float,
        batch: int = 1,
        stall_checks: bool = True,
    ) -> None:
        self.conn = conn
        self.tenant = conn.tenant
        self.queue = queue
        self.transport = conn.transport
        self.encode = encode
        # The engine's receipt -> subscription map, shared so acks from any path find us.
        self.owners = owners
        self.prefetch = prefetch
        self.auto_ack = auto_ack
        self.visibility_timeout_s = visibility_timeout_s
        self.batch = batch
        # False: a timed-out message gives its credit back whether or not the client spoke.
        self.stall_checks = stall_checks
        self.in_flight: InFlight = {}
        self.delivered = 0
        self.active = True

    def credit(self, now: float) -> int:
        """How many more messages this subscription may receive now."""
        if not self.active or self.transport.closed:
            return 0
        if self.auto_ack:
            return self.prefetch - self.transport.backlog
        held = len(self.in_flight)
        if held >= self.prefetch:
            held -= self._forget_expired(now)
        return self.prefetch - held

    def _forget_expired(self, now: float) -> int:
        # Messages whose visibility ended are someone else's now: their receipts are dead.
        # Their credit comes back only if the client was heard from since they were sent.
        # Insertion order is visibility order (one timeout per subscription), so stop early.
        heard_at = self.conn.heard_at if self.stall_checks else now
        expired = []
        for receipt, (_, visible_at, sent_at) in self.in_flight.items():
            if visible_at > now or sent_at >= heard_at:
                break
            expired.append(receipt)
        for receipt in expired:
            del self.in_flight[receipt]
            if self.owners.get(receipt) is self:
                del self.owners[receipt]
        return len(expired)

    def stalled(self, now: float, grace_s: float) -> bool:
        """Whether the oldest held message timed out (``grace_s`` ago) with no word from the
        client since it was sent: the consumer is not reading."""
        for _, visible_at, sent_at in self.in_flight.values():
            return visible_at + grace_s <= now and sent_at >= self.conn.heard_at
        return False

    def deliver(self, messages: list[ReceivedMessage], payloads: list[bytes]) -> int:
        """Record and write messages; return the number of the first one."""
        first = self.delivered + 1
        self.delivered += len(messages)
        if not self.auto_ack:
            in_flight = self.in_flight
            owners = self.owners
            sent_at = time.time()
            n = first
            for message in messages:
                receipt = message.receipt
                in_flight[receipt] = (n, message.visible_at, sent_at)
                owners[receipt] = self
                n += 1
        self.transport.write(self.encode(payloads, first))
        return first

    def settle(self, receipt: str) -> bool:
        """Forget a receipt that was acked or nacked; return whether it was ours."""
        if self.in_flight.pop(receipt, None) is None:
            return False
        if self.owners.get(receipt) is self:
            del self.owners[receipt]
        return True

    def take_all(self) -> list[str]:
        """End the subscription's hold on everything; return the receipts to release."""
        receipts = list(self.in_flight)
        for receipt in receipts:
            if self.owners.get(receipt) is self:
                del self.owners[receipt]
        self.in_flight.clear()
        return receipts

    def take_after(self, n: int) -> list[str]:
        """Drop and return the receipts of messages numbered after ``n`` (SSE Last-Event-ID)."""
        later = [receipt for receipt, (number, _, _) in self.in_flight.items() if number > n]
        for receipt in later:
            self.settle(receipt)
        return later

    def adopt(self, other: Subscription) -> None:
        """Take over another subscription's held messages (an SSE stream resumed)."""
        for receipt, (_, visible_at, sent_at) in other.in_flight.items():
            self.delivered += 1
            self.in_flight[receipt] = (self.delivered, visible_at, sent_at)
            self.owners[receipt] = self
        other.in_flight.clear()
