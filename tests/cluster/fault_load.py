"""The load of the random-faults test on real processes (``test_random_faults.py``;
docs/testing.md, "Random faults on real processes"): producers and consumers over a set of
queues, and what they saw.

A :class:`Target` is one partition of one queue. A queue of its own partitions has a target
per partition; queues on a pool's partitions (docs/cluster.md, "Shared partitions") have one
each, many of them on one partition. Each producer goes round its targets, one send at a time
(through a gateway's ``ClusterBackend``, as users' sends go: its map watch, leader hints,
requests held at a replaced leader given up, its send batching), each send retried with its
dedupe id until acknowledged, so a FIFO group's sends are acknowledged in the order they
were made. Once stopped, each producer sends once more to every one of its targets: every
queue must take a send again after the faults. Each consumer goes round its targets through
``ClusterHarness.call`` on whoever leads the partition now, receiving (a short visibility
timeout, so a receive whose answer was lost in a failover comes back soon) and acking.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from backend_store.cluster.client.cluster_backend import ClusterBackend
from backend_store.errors import StaleEpoch, Unavailable
from backend_store.types import AckResult, NewMessage, QueueName, ReceivedMessage, SendResult, TenantId
from tests.conftest import scaled

from .processes import ClusterHarness

T = "tenant-faults"
VISIBILITY_S = 4.0  # a receive's answer lost in a failover: its messages come back after this
RETRYABLE = (Unavailable, StaleEpoch)  # no leader, not the leader, an unknown outcome


@dataclass(frozen=True, slots=True)
class Partition:
    """A partition the faults target (``leader:<label>``) and the cluster settles on."""

    label: str  # "orders/0", "fifo/1", "pool/2"
    pid: int


@dataclass(frozen=True, slots=True, order=True)
class Target:
    """One partition of one queue: where a producer's sends to it go, and a consumer reads."""

    queue: str
    pid: int

    def __str__(self) -> str:
        return f"{self.queue}@p{self.pid}"


@dataclass(frozen=True, slots=True)
class Producer:
    prefix: str  # of its messages' bodies (which are their dedupe ids)
    targets: tuple[Target, ...]  # sent to in turn
    group: str | None = None  # a FIFO group


@dataclass(frozen=True, slots=True)
class Delivery:
    body: str
    message: ReceivedMessage
    asked_at: float  # when the receive that delivered it was sent


@dataclass
class Load:
    """Producers and consumers on the targets, and what they saw."""

    h: ClusterHarness
    backend: ClusterBackend
    producer_specs: Sequence[Producer]
    consumer_specs: Sequence[tuple[Target, ...]]  # each consumer's targets, read in turn
    acknowledged: dict[str, SendResult] = field(default_factory=dict)
    sent_by_group: dict[str, list[str]] = field(default_factory=lambda: collections.defaultdict(list))
    sent_to: dict[Target, list[str]] = field(default_factory=lambda: collections.defaultdict(list))
    deliveries: list[Delivery] = field(default_factory=list)
    ack_confirmed_at: dict[str, float] = field(default_factory=dict)
    # Since the last report: seconds, body, when it began (time.monotonic()).
    slowest_send: tuple[float, str, float] = (0.0, "", 0.0)
    # What the fault stopped: the longest a send waited after the current fault began
    # (``fault_at``), so a send already slow before it is counted from the fault on.
    fault_at: float = 0.0
    longest_stop: tuple[float, str] = (0.0, "")
    under_way: dict[str, float] = field(default_factory=dict)  # body -> when its send began
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    consumers_stopping: asyncio.Event = field(default_factory=asyncio.Event)
    producers: list[asyncio.Task[None]] = field(default_factory=list)
    consumers: list[asyncio.Task[None]] = field(default_factory=list)

    @property
    def targets(self) -> list[Target]:
        """Every target some producer sends to."""
        return sorted({t for spec in self.producer_specs for t in spec.targets})

    def start(self) -> None:
        self.producers = [asyncio.create_task(self._produce(spec)) for spec in self.producer_specs]
        self.consumers = [asyncio.create_task(self._consume(spec)) for spec in self.consumer_specs]

    def raise_failures(self) -> None:
        """A producer or consumer that gave up fails the run now, not at the end."""
        for task in [*self.producers, *self.consumers]:
            if task.done() and not task.cancelled() and task.exception() is not None:
                task.result()

    async def _produce(self, spec: Producer) -> None:
        count = 0

        async def one(target: Target) -> None:
            nonlocal count
            body = f"{spec.prefix}{count}"
            count += 1
            self.acknowledged[body] = await self._send(target, body, spec.group)
            self.sent_to[target].append(body)
            if spec.group is not None:
                self.sent_by_group[spec.group].append(body)

        while not self.stopping.is_set():
            await one(spec.targets[count % len(spec.targets)])
            await asyncio.sleep(0.05)  # a steady load, not the most the machine takes
        for target in spec.targets:  # every queue takes a send once the faults are over
            await one(target)

    async def _send(self, target: Target, body: str, group: str | None) -> SendResult:
        began = time.monotonic()
        deadline = began + scaled(45)
        message = NewMessage(body.encode(), group_id=group, dedupe_id=body)
        self.under_way[body] = began
        while True:
            try:
                (result,) = await self.backend.send(TenantId(T), QueueName(target.queue), [message])
            except RETRYABLE as exc:
                result = exc
            if isinstance(result, SendResult):
                now = time.monotonic()
                del self.under_way[body]
                self.slowest_send = max(self.slowest_send, (now - began, body, began))
                self.longest_stop = max(self.longest_stop, (now - max(began, self.fault_at), body))
                return result
            assert isinstance(result, RETRYABLE), f"send of {body} to {target}: {result!r}"
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"send of {body} to {target} never acknowledged: {result!r}\n{self.h.logs()}"
                )
            await asyncio.sleep(0.05)

    async def _consume(self, targets: tuple[Target, ...]) -> None:
        while not self.consumers_stopping.is_set():
            got_any = False
            for target in targets:
                got_any = await self._receive(target) or got_any
            if not got_any:
                await asyncio.sleep(0.05)

    async def _receive(self, target: Target) -> bool:
        """One receive from the target, and the ack of what it got: whether it got any."""
        asked_at = time.monotonic()
        try:
            got: list[ReceivedMessage] = await self.h.call(
                target.pid,
                "receive",
                tenant=TenantId(T),
                queue=QueueName(target.queue),
                max_messages=10,
                visibility_timeout_s=VISIBILITY_S,
            )
        except RETRYABLE:
            return False
        self.deliveries += [Delivery(m.body.decode(), m, asked_at) for m in got]
        if got:
            await self._ack(target, got)
        return bool(got)

    async def _ack(self, target: Target, got: list[ReceivedMessage]) -> None:
        """Ack until answered; a receipt is counted as acked only on an answer saying so (a
        retry of an ack that took effect may be told its receipt is gone)."""
        deadline = time.monotonic() + scaled(VISIBILITY_S * 2)
        while time.monotonic() < deadline:
            try:
                result: AckResult = await self.h.call(
                    target.pid,
                    "ack",
                    tenant=TenantId(T),
                    receipts=[m.receipt for m in got],
                    queue=QueueName(target.queue),
                )
            except RETRYABLE:
                await asyncio.sleep(0.05)
                continue
            failed = {f.receipt for f in result.failed}
            now = time.monotonic()
            for m in got:
                if m.receipt not in failed:
                    self.ack_confirmed_at.setdefault(m.body.decode(), now)
            return
        # Not answered within two visibility windows: the messages come back to be received again.

    async def stop_producers(self) -> None:
        """Stop the producers, once each sent once more to every one of its targets."""
        self.stopping.set()
        await asyncio.gather(*self.producers)

    async def stop_consumers(self) -> None:
        self.consumers_stopping.set()
        await asyncio.gather(*self.consumers)

    def delivered(self) -> set[str]:
        return {d.body for d in self.deliveries}
