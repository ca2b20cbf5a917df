"""Prometheus as a sink of the observe point: messages by queue and by transport.

:class:`MessageCounts` is an :class:`~push.observer.Observer` next to the usage aggregator
(the gateway's :class:`~push.observer.Observers` feeds both), so the metrics and the usage
files count the same outcomes the same way. It keeps plain integers per key on the event
loop; the families are built at scrape time:

- ``pushgate_messages_total{event, transport}``: this gateway's message events;
- ``pushgate_operation_errors_total{operation, transport, code}``: operations that failed,
  by the error's stable code (the usage files' "errors by code"; a refusal by a rate limit
  is ``throttled`` with code ``rate_limited``);
- ``pushgate_queue_message_events_total{tenant, queue, event}``: the same per queue, for
  the queues that have series of their own (the per-queue series limit), the rest summed
  under ``_other`` (see :meth:`MessageCounts.queue_family`).

Events: ``sent``, ``deduplicated``, ``delivered`` (pushed over WebSocket or SSE, or returned
by an HTTP receive), ``acked``, ``nacked``, ``dead_lettered``, ``expired`` (the last two
reported by the store after the commit that made them, once across gateways). Failed
operations are not message events: they are counted by operation and code.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence

from prometheus_client.core import CounterMetricFamily

from push.observer import ACK, DEAD_LETTERED, DEDUPLICATED, EXPIRED, NACK, OK, PUSH, RECEIVE, SEND

from .metrics_catalog import help_of

# Operation of the observe point -> the event it counts as (others are not message events).
EVENT_OF = {
    SEND: "sent",
    DEDUPLICATED: "deduplicated",
    PUSH: "delivered",
    RECEIVE: "delivered",
    ACK: "acked",
    NACK: "nacked",
    DEAD_LETTERED: "dead_lettered",
    EXPIRED: "expired",
}
EVENTS = tuple(dict.fromkeys(EVENT_OF.values()))
OTHER = "_other"

QueueKey = tuple[str, str]


class MessageCounts:
    """Counts of message events by queue and by transport; an Observer sink."""

    __slots__ = (
        "_baseline",
        "_by_queue",
        "_by_transport",
        "_clock",
        "_errors",
        "_first_at",
        "_retired",
        "_shown",
    )

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._by_queue: dict[QueueKey, dict[str, int]] = {}
        # When each queue was first counted (the clock of the store's samples): a sample
        # taken before that cannot know the queue, so its absence there says nothing.
        self._first_at: dict[QueueKey, float] = {}
        self._by_transport: dict[tuple[str, str], int] = {}
        # (operation, transport, code) -> failures: codes are a fixed set, so is this.
        self._errors: dict[tuple[str, str, str], int] = {}
        # What a scrape last showed of each queue summed under _other, and, once a queue has
        # a series of its own, what stays in _other of it (its own series counts the rest):
        # so neither series ever goes down (which Prometheus would read as a reset).
        self._shown: dict[QueueKey, dict[str, int]] = {}
        self._baseline: dict[QueueKey, dict[str, int]] = {}
        # Counts of queues gone from the store while summed under _other (kept in the sum).
        self._retired: dict[str, int] = dict.fromkeys(EVENTS, 0)

    def observe(
        self,
        tenant: str,
        queue: str,
        operation: str,
        transport: str,
        outcome: str = OK,
        count: int = 1,
        nbytes: int = 0,
        latency_s: float | None = None,
    ) -> None:
        if outcome != OK:
            key = (operation, transport, outcome)
            self._errors[key] = self._errors.get(key, 0) + count
            return
        event = EVENT_OF.get(operation)
        if event is not None:
            self._add(tenant, queue, event, transport, count)

    def observe_latencies(
        self,
        tenant: str,
        queue: str,
        operation: str,
        transport: str,
        nbytes: int,
        latencies_s: Sequence[float],
    ) -> None:
        event = EVENT_OF.get(operation)
        if event is not None and latencies_s:
            self._add(tenant, queue, event, transport, len(latencies_s))

    def _add(self, tenant: str, queue: str, event: str, transport: str, count: int) -> None:
        counts = self._by_queue.get((tenant, queue))
        if counts is None:
            counts = self._by_queue[(tenant, queue)] = {}
            self._first_at.setdefault((tenant, queue), self._clock())
        counts[event] = counts.get(event, 0) + count
        key = (event, transport)
        self._by_transport[key] = self._by_transport.get(key, 0) + count

    # Scrape time -------------------------------------------------------------------------

    def count(self, tenant: str, queue: str, event: str) -> int:
        """Everything counted for one queue and event since the gateway started."""
        return self._by_queue.get((tenant, queue), {}).get(event, 0)

    def transport_family(self) -> CounterMetricFamily:
        family = CounterMetricFamily(
            "pushgate_messages", help_of("pushgate_messages"), labels=["event", "transport"]
        )
        for (event, transport), n in sorted(self._by_transport.items()):
            family.add_metric([event, transport], n)
        return family

    def errors_family(self) -> CounterMetricFamily:
        family = CounterMetricFamily(
            "pushgate_operation_errors",
            help_of("pushgate_operation_errors"),
            labels=["operation", "transport", "code"],
        )
        for (operation, transport, code), n in sorted(self._errors.items()):
            family.add_metric([operation, transport, code], n)
        return family

    def queue_family(
        self, admitted: set[QueueKey], present: set[QueueKey], sampled_at: float = float("inf")
    ) -> CounterMetricFamily:
        """The per-queue family: a series per event for each ``admitted`` queue, the rest
        summed under ``_other``. ``present`` is the store's queues as sampled at
        ``sampled_at``: a queue counted since then is kept as it is (the sample is older
        than the queue); one absent from a later sample is forgotten (its own series ends;
        what it had in ``_other`` stays there)."""
        newer = {k for k in self._by_queue if k not in present and self._first_at[k] > sampled_at}
        for key in [k for k in self._baseline if k not in admitted and k not in newer]:
            # It had a series of its own and is gone from the store: that series ends; the
            # part counted before it got one stays in _other.
            for event, n in self._baseline.pop(key).items():
                self._retired[event] += n
            self._by_queue.pop(key, None)
            self._first_at.pop(key, None)
        for key in [k for k in self._by_queue if k not in present and k not in admitted and k not in newer]:
            # Summed under _other and not a queue of the store: kept in the sum without a
            # dict entry per deleted queue.
            for event, n in self._by_queue.pop(key).items():
                self._retired[event] += n
            self._shown.pop(key, None)
            del self._first_at[key]
        family = CounterMetricFamily(
            "pushgate_queue_message_events",
            help_of("pushgate_queue_message_events"),
            labels=["tenant", "queue", "event"],
        )
        other = dict(self._retired)
        folded = False
        for key, counts in sorted(self._by_queue.items()):
            if key in newer:
                continue  # not in the sample yet: shown once it is, whole, in its own series or folded
            if key in admitted:
                baseline = self._baseline.get(key)
                if baseline is None:
                    baseline = self._baseline[key] = self._shown.pop(key, {})
                for event in EVENTS:
                    family.add_metric([*key, event], counts.get(event, 0) - baseline.get(event, 0))
                for event, n in baseline.items():
                    other[event] += n
            else:
                folded = True
                self._shown[key] = dict(counts)
                for event, n in counts.items():
                    other[event] += n
        # Admitted queues that have counted nothing yet still get their series (at 0).
        for key in sorted(admitted - self._by_queue.keys()):
            self._baseline.setdefault(key, {})
            for event in EVENTS:
                family.add_metric([*key, event], 0)
        if folded or any(other.values()):
            for event in EVENTS:
                family.add_metric([OTHER, OTHER, event], other[event])
        return family

    def families(
        self, admitted: set[QueueKey], present: set[QueueKey], sampled_at: float
    ) -> Iterator[CounterMetricFamily]:
        yield self.transport_family()
        yield self.errors_family()
        yield self.queue_family(admitted, present, sampled_at)
