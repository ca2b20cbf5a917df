"""A consumer's subscription to one queue: its credit and the messages it holds.

Credit is ``prefetch`` minus the messages delivered and not yet acked, nacked or timed
out. Auto-ack subscriptions hold nothing; their credit is bounded by the transport's
backlog instead, so a fast queue never floods a slow socket.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from backend_store.types import QueueName, ReceivedMessage, TenantId

if TYPE_CHECKING:
    from .transport import Transport

# Receipt -> (the message's number in its subscription, when its visibility ends).
InFlight = dict[str, tuple[int, float]]


class Subscription:
    """Per-(connection, queue) delivery state; a few small objects, no task."""

    __slots__ = (
        "active",
        "auto_ack",
        "batch",
        "delivered",
        "in_flight",
        "owners",
        "prefetch",
        "queue",
        "tenant",
        "transport",
        "visibility_timeout_s",
    )

    def __init__(
        self,
        tenant: TenantId,
        queue: QueueName,
        transport: Transport,
        owners: dict[str, Subscription],
        *,
        prefetch: int,
        auto_ack: bool,
        visibility_timeout_s: float | None,
        batch: int = 1,
    ) -> None:
        self.tenant = tenant
        self.queue = queue
        self.transport = transport
        # The engine's receipt -> subscription map, shared so acks from any path find us.
        self.owners = owners
        self.prefetch = prefetch
        self.auto_ack = auto_ack
        self.visibility_timeout_s = visibility_timeout_s
        self.batch = batch
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
        # Insertion order is visibility order (one timeout per subscription), so stop early.
        expired = []
        for receipt, (_, visible_at) in self.in_flight.items():
            if visible_at > now:
                break
            expired.append(receipt)
        for receipt in expired:
            del self.in_flight[receipt]
            if self.owners.get(receipt) is self:
                del self.owners[receipt]
        return len(expired)

    def deliver(self, messages: list[ReceivedMessage], payloads: list[bytes]) -> int:
        """Record and write messages; return the number of the first one."""
        first = self.delivered + 1
        self.delivered += len(messages)
        if not self.auto_ack:
            in_flight = self.in_flight
            owners = self.owners
            n = first
            for message in messages:
                receipt = message.receipt
                in_flight[receipt] = (n, message.visible_at)
                owners[receipt] = self
                n += 1
        if len(payloads) == 1:
            self.transport.write(self, payloads[0], first)
        else:
            self.transport.write_many(self, payloads, first)
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
        later = [receipt for receipt, (number, _) in self.in_flight.items() if number > n]
        for receipt in later:
            self.settle(receipt)
        return later

    def adopt(self, other: Subscription) -> None:
        """Take over another subscription's held messages (an SSE stream resumed)."""
        for receipt, (_, visible_at) in other.in_flight.items():
            self.delivered += 1
            self.in_flight[receipt] = (self.delivered, visible_at)
            self.owners[receipt] = self
        other.in_flight.clear()
