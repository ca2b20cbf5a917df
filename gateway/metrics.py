"""Prometheus metrics of the HTTP front end, on a registry owned by the app (no globals).

Labels are bounded: the route template (``/v1/queues/{queue}/messages``, never the
queue name), the method and the status code. Message counts have no per-queue label.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

__all__ = ["CONTENT_TYPE_LATEST", "GatewayMetrics"]

_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0)


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "pushgate_http_requests",
            "HTTP requests answered, by route template, method and status code.",
            ("route", "method", "code"),
            registry=self.registry,
        )
        self.duration = Histogram(
            "pushgate_http_request_duration_seconds",
            "Time to answer an HTTP request, by route template.",
            ("route",),
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self.messages = Counter(
            "pushgate_messages",
            "Messages handled over HTTP, by operation (sent, duplicate, received, acked, nacked).",
            ("op",),
            registry=self.registry,
        )
        self.waiting_receives = Gauge(
            "pushgate_receive_waiting",
            "Long-poll receives parked waiting for a message.",
            registry=self.registry,
        )
        # Children resolved once: .labels() costs a dict lookup and a lock per call.
        self.sent = self.messages.labels("sent")
        self.duplicates = self.messages.labels("duplicate")
        self.received = self.messages.labels("received")
        self.acked = self.messages.labels("acked")
        self.nacked = self.messages.labels("nacked")

        # (route, method, status) -> its children; .labels() is a lock and a tuple build per call.
        self._children: dict[tuple[str, str, int], tuple[Any, Any]] = {}

    def observe(self, route: str, method: str, status: int, seconds: float) -> None:
        key = (route, method, status)
        children = self._children.get(key)
        if children is None:
            children = self._children[key] = (
                self.requests.labels(route, method, str(status)),
                self.duration.labels(route),
            )
        children[0].inc()
        children[1].observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
