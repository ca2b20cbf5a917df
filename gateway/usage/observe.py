"""The gateway's one observe point: every request and delivery outcome goes through here.

:class:`Observers` fans an outcome out to its sinks: the usage aggregator today, and the
Prometheus metrics can join as a second sink (anything with the
:class:`push.observer.Observer` methods). With no sink it costs one call.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from push.observer import Observer

from .record import OK


class Observers:
    """An :class:`~push.observer.Observer` that forwards to several."""

    __slots__ = ("sinks",)

    def __init__(self, sinks: Sequence[Observer] = ()) -> None:
        self.sinks = tuple(sinks)

    def add(self, sink: Observer) -> None:
        self.sinks = (*self.sinks, sink)

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
        for sink in self.sinks:
            sink.observe(tenant, queue, operation, transport, outcome, count, nbytes, latency_s)

    def observe_latencies(
        self,
        tenant: str,
        queue: str,
        operation: str,
        transport: str,
        nbytes: int,
        latencies_s: Iterable[float],
    ) -> None:
        if len(self.sinks) == 1:
            self.sinks[0].observe_latencies(tenant, queue, operation, transport, nbytes, latencies_s)
            return
        latencies = list(latencies_s)  # an iterator can be read once; every sink needs it
        for sink in self.sinks:
            sink.observe_latencies(tenant, queue, operation, transport, nbytes, latencies)
