"""Standing receives on ``cluster://``, the gateway's side (:class:`StandingDemands`).

An idle push dispatcher registers one demand for its queue
(:class:`~backend_store.backend.StandingReceive`); the cluster backend sends it as a
:class:`~.wire.Demand` frame to the leader of each partition holding the queue's messages,
all under one registration id. Each of those partitions may serve it, up to the demand's
size each, so a demand of N over P partitions may bring up to P x N messages: the
dispatcher deals what its subscribers have credit for and releases the rest, as it does
with a late delivery on the embedded store. Nodes push what they received as
:class:`~.wire.Delivery` frames; those are matched to the registration by id (receipts get
the partition prefix first, as ``receive`` does).

Registrations withdrawn (or replaced) are kept for ``late_grace_s``: a partition may have
served one just before the withdrawal reached it (a node pushes once the commit is
replicated, within its request timeout), and its delivery still goes to the callback that
asked (the dispatcher copes with late deliveries). A delivery for an id no longer known is
released by the caller.

One more rule keeps wake-ups from being lost when several partitions are involved: a short
delivery tells the dispatcher that the queue had nothing more *on that partition* at that
commit, and the dispatcher then skips its next receive. If another partition's ``Notify``
for the queue arrived since the registration was made, that wake-up is not covered by it, so
:meth:`StandingDemands.look_again` says to wake the dispatcher once more; after a short late
delivery it always does (what was notified since is not tracked for withdrawn
registrations: a cheap extra receive on a rare path). (A node holds its own later wake-ups
for a queue behind a delivery it has not sent, so one partition's frames never contradict
each other: ``node_demands.py``.)
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ...backend import DeliverCallback
from ...types import Epoch, QueueName, TenantId
from ..protocol.wire import Delivery, Demand
from .node_pool import NodeClient

_Key = tuple[TenantId, QueueName]


@dataclass(eq=False, slots=True)
class Registration:
    """One ``set_demand`` call: the frames it sent and what came back for it."""

    id: int
    tenant: TenantId
    queue: QueueName
    max_messages: int
    deliver: DeliverCallback
    # The partitions its Demand frame went to, and on which connection (for withdrawing).
    sent: dict[int, NodeClient] = field(default_factory=dict)
    # Partitions whose Notify for the queue arrived since it was made.
    notified: set[int] = field(default_factory=set)
    withdrawn_at: float | None = None


@dataclass(frozen=True, slots=True)
class Target:
    """Where one partition's demand goes: its id, its leader's epoch and connection."""

    partition: int
    epoch: Epoch
    client: NodeClient


class StandingDemands:
    def __init__(self, *, late_grace_s: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.late_grace_s = late_grace_s
        self._clock = clock
        self._ids = itertools.count(1)
        self._current: dict[_Key, Registration] = {}
        self._by_id: dict[int, Registration] = {}
        self._late: deque[Registration] = deque()

    def register(
        self,
        tenant: TenantId,
        queue: QueueName,
        max_messages: int,
        visibility_timeout_s: float | None,
        deliver: DeliverCallback,
        targets: Sequence[Target],
    ) -> Registration:
        """Register (or replace) the queue's demand and send it to ``targets``."""
        self._prune()
        key = (tenant, queue)
        previous = self._current.pop(key, None)
        if previous is not None:
            self._retire(previous)
        registration = Registration(next(self._ids), tenant, queue, int(max_messages), deliver)
        for target in targets:
            demand = Demand(
                registration.id,
                target.partition,
                target.epoch,
                tenant,
                queue,
                int(max_messages),
                visibility_timeout_s,
            )
            if target.client.demand(demand):
                registration.sent[target.partition] = target.client
        self._current[key] = registration
        self._by_id[registration.id] = registration
        return registration

    def withdraw(self, tenant: TenantId, queue: QueueName, deliver: DeliverCallback) -> None:
        """Withdraw the queue's demand if it is the one registered with ``deliver``."""
        key = (tenant, queue)
        registration = self._current.get(key)
        if registration is None or registration.deliver != deliver:
            return
        del self._current[key]
        self._retire(registration)

    def saw_notify(self, partition: int, tenant: str, queue: str) -> None:
        registration = self._current.get((TenantId(tenant), QueueName(queue)))
        if registration is not None:
            registration.notified.add(partition)

    def delivered(self, delivery: Delivery) -> Registration | None:
        """The registration a delivery answers (None: unknown or long gone)."""
        registration = self._by_id.get(delivery.id)
        if registration is None or (registration.tenant, registration.queue) != (
            delivery.tenant,
            delivery.queue,
        ):
            return None
        # That partition's demand is used up: nothing to withdraw there.
        registration.sent.pop(delivery.partition, None)
        return registration

    @staticmethod
    def look_again(registration: Registration, partition: int, count: int) -> bool:
        """After handing over ``count`` messages from ``partition``: whether to wake the
        dispatcher once more (a short delivery says nothing of the other partitions that
        notified meanwhile; after a late delivery, always)."""
        if count >= registration.max_messages:
            return False
        return registration.withdrawn_at is not None or bool(registration.notified - {partition})

    def sent_to(self, node_id: str) -> list[tuple[TenantId, QueueName]]:
        """The queues whose waiting demand went (in part) to ``node_id``."""
        return [
            key
            for key, registration in self._current.items()
            if any(client.node_id == node_id for client in registration.sent.values())
        ]

    @property
    def current(self) -> int:
        """Registrations waiting now (for tests)."""
        return len(self._current)

    def _retire(self, registration: Registration) -> None:
        for partition, client in registration.sent.items():
            client.withdraw(registration.id, partition)
        registration.sent.clear()
        registration.withdrawn_at = self._clock()
        self._late.append(registration)

    def _prune(self) -> None:
        horizon = self._clock() - self.late_grace_s
        while self._late and (self._late[0].withdrawn_at or 0.0) <= horizon:
            registration = self._late.popleft()
            self._by_id.pop(registration.id, None)
