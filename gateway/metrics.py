"""Prometheus metrics on a registry owned by the app (no global registry, no ``_created`` series).

Two kinds of families:

- counted as things happen: HTTP requests by route template, method and status (never a
  queue name), long-polls waiting, and message events by queue and transport (a sink of
  the observe point, :mod:`gateway.metrics_messages`);
- read at scrape time by :class:`StateCollector`: queue depths and totals from the
  sampler's latest snapshot (per-queue series for at most ``queue_series_limit`` queues,
  the rest summed under ``_other``), push engine figures, group-commit histograms, LMDB
  map use, alert state, cluster nodes.

Names, types, labels and help text come from :mod:`gateway.metrics_catalog`, which is
also what ``docs/metrics.md`` shows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from backend_store.commit_stats import CommitStats, FixedHistogram
from backend_store.tls_reload import TlsReloader
from web_console.alerts import AlertEngine
from web_console.monitor import QueueSample, Snapshot

from .metrics_catalog import help_of
from .metrics_messages import MessageCounts

__all__ = ["CONTENT_TYPE_LATEST", "GatewayMetrics", "ScrapeSources"]

_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0)
OTHER = "_other"


@dataclass(eq=False)
class ScrapeSources:
    """What the state collector reads; each part is optional (absent: its families are too)."""

    snapshot: Callable[[], Snapshot] | None = None
    commit_stats: Callable[[], CommitStats | None] | None = None
    push_stats: Callable[[], Mapping[str, Any]] | None = None
    alerts: AlertEngine | None = None
    tls_certificate: TlsReloader | None = None  # with --tls-cert (gateway/server.py)


class GatewayMetrics:
    def __init__(self, queue_series_limit: int = 100) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "pushgate_http_requests",
            help_of("pushgate_http_requests"),
            ("route", "method", "code"),
            registry=self.registry,
        )
        self.duration = Histogram(
            "pushgate_http_request_duration_seconds",
            help_of("pushgate_http_request_duration_seconds"),
            ("route",),
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self.throttled = Counter(
            "pushgate_http_throttled_requests",
            help_of("pushgate_http_throttled_requests"),
            ("route",),
            registry=self.registry,
        )
        self.auth_failures = Counter(
            "pushgate_http_auth_failures",
            help_of("pushgate_http_auth_failures"),
            ("code",),
            registry=self.registry,
        )
        self.waiting_receives = Gauge(
            "pushgate_receive_waiting", help_of("pushgate_receive_waiting"), registry=self.registry
        )
        # A sink of the observe point (push/observer.py): message events by queue and transport.
        self.messages = MessageCounts()
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        self.sources = ScrapeSources()
        self.state = StateCollector(self.sources, queue_series_limit, self.messages)
        self.registry.register(self.state)

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
            if status == 429:
                self.throttled.labels(route)  # the family shows the route from its first 429 on
        children[0].inc()
        children[1].observe(seconds)
        if status >= 400:
            if status == 429:
                self.throttled.labels(route).inc()
            elif status in (401, 403):
                self.auth_failures.labels(str(status)).inc()

    def render(self, tenant: str | None = None) -> bytes:
        """The exposition text; with ``tenant``, only that tenant's labelled series."""
        return generate_latest(_ScrapeView(self.registry, tenant))


class _ScrapeView:
    """A view of a registry without the ``_created`` samples (no one graphs them), and, for
    a tenant's scrape, without the series labelled with another tenant (``_other`` too: its
    sums cover other tenants). Series without a ``tenant`` label (HTTP by route template,
    the store, the process) stay.

    prometheus_client's switch for ``_created`` is process-global; this keeps it per registry.
    """

    def __init__(self, registry: CollectorRegistry, tenant: str | None) -> None:
        self._registry = registry
        self._tenant = tenant

    def collect(self) -> Iterator[Metric]:
        tenant = self._tenant
        for metric in self._registry.collect():
            metric.samples = [
                s
                for s in metric.samples
                if not s.name.endswith("_created")
                and (tenant is None or s.labels.get("tenant", tenant) == tenant)
            ]
            yield metric


class StateCollector(Collector):
    """Families read from state at scrape time (see the module docstring)."""

    def __init__(self, sources: ScrapeSources, queue_series_limit: int, messages: MessageCounts) -> None:
        self.sources = sources
        self.messages = messages
        self.limit = max(0, queue_series_limit)
        # Queues given their own series stay so (a counter that moved between series would
        # look like a reset); a deleted queue frees its place.
        self._admitted: set[tuple[str, str]] = set()

    def describe(self) -> Iterable[Metric]:
        return ()  # names vary with what is attached; nothing to check at registration

    def collect(self) -> Iterator[Metric]:
        src = self.sources
        if src.snapshot is not None:
            snapshot = src.snapshot()
            yield from self._queues(snapshot.queues, snapshot.at)
            yield from _storage(snapshot)
            yield from _cluster(snapshot)
        else:
            yield self.messages.transport_family()
            yield self.messages.errors_family()
        if src.commit_stats is not None and (stats := src.commit_stats()) is not None:
            yield _histogram("pushgate_store_commit_batch_size", stats.batch_size)
            yield _histogram("pushgate_store_commit_duration_seconds", stats.commit_seconds)
        if src.push_stats is not None:
            push = src.push_stats()
            connections = _gauge("pushgate_push_connections", ["transport"])
            for transport in ("websocket", "sse"):
                if f"connections_{transport}" in push:
                    connections.add_metric([transport], float(push[f"connections_{transport}"]))
            yield connections
            closes = _counter("pushgate_push_closes", ["transport", "code"])
            for (transport, code), n in sorted(push.get("closes", {}).items()):
                closes.add_metric([transport, str(code)], n)
            yield closes
            for key, name in (
                ("in_flight", "pushgate_push_in_flight"),
                ("dispatchers", "pushgate_push_dispatchers"),
                ("suspended_streams", "pushgate_push_suspended_streams"),
            ):
                if key in push:
                    yield GaugeMetricFamily(name, help_of(name), value=float(push[key]))
        if src.alerts is not None:
            yield from _alerts(src.alerts)
        if (certificate := src.tls_certificate) is not None:
            name = "pushgate_tls_certificate_expiry_timestamp_seconds"
            yield GaugeMetricFamily(name, help_of(name), value=certificate.not_after)
            reloads = _counter("pushgate_tls_certificate_reloads", [])
            reloads.add_metric([], certificate.loaded)
            yield reloads

    def _queues(self, queues: tuple[QueueSample, ...], sampled_at: float) -> Iterator[Metric]:
        present = {q.key for q in queues}
        self._admitted &= present
        for key in sorted(present - self._admitted):
            if len(self._admitted) >= self.limit:
                break
            self._admitted.add(key)
        labels = ["tenant", "queue"]
        depth = GaugeMetricFamily(
            "pushgate_queue_messages", help_of("pushgate_queue_messages"), labels=[*labels, "state"]
        )
        oldest = _gauge("pushgate_queue_oldest_message_age_seconds", labels)
        consumers = _gauge("pushgate_queue_consumers", labels)
        sent = _counter("pushgate_queue_sent", labels)
        acked = _counter("pushgate_queue_acked", labels)
        dead = _counter("pushgate_queue_dead_lettered", labels)
        other = [0, 0, 0, 0.0, 0, 0, 0, 0]
        folded = 0
        for q in queues:
            age = q.oldest_age_s or 0.0
            if q.key in self._admitted:
                lv = [q.tenant, q.name]
                depth.add_metric([*lv, "visible"], q.visible)
                depth.add_metric([*lv, "in_flight"], q.in_flight)
                depth.add_metric([*lv, "delayed"], q.delayed)
                oldest.add_metric(lv, age)
                consumers.add_metric(lv, q.consumers)
                sent.add_metric(lv, q.sent_total)
                acked.add_metric(lv, q.acked_total)
                dead.add_metric(lv, q.dead_lettered_total)
                continue
            folded += 1
            other[0] += q.visible
            other[1] += q.in_flight
            other[2] += q.delayed
            other[3] = max(other[3], age)
            other[4] += q.consumers
            other[5] += q.sent_total
            other[6] += q.acked_total
            other[7] += q.dead_lettered_total
        if folded:
            lv = [OTHER, OTHER]
            for i, state in enumerate(("visible", "in_flight", "delayed")):
                depth.add_metric([*lv, state], other[i])
            oldest.add_metric(lv, other[3])
            consumers.add_metric(lv, other[4])
            sent.add_metric(lv, other[5])
            acked.add_metric(lv, other[6])
            dead.add_metric(lv, other[7])
        yield GaugeMetricFamily("pushgate_queues", help_of("pushgate_queues"), value=len(queues))
        yield from (depth, oldest, consumers, sent, acked, dead)
        yield from self.messages.families(self._admitted, present, sampled_at)
        yield GaugeMetricFamily(
            "pushgate_queue_series_folded", help_of("pushgate_queue_series_folded"), value=folded
        )


def _gauge(name: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, help_of(name), labels=labels)


def _counter(name: str, labels: list[str]) -> CounterMetricFamily:
    return CounterMetricFamily(name, help_of(name), labels=labels)


def _histogram(name: str, h: FixedHistogram) -> HistogramMetricFamily:
    return HistogramMetricFamily(name, help_of(name), buckets=h.cumulative(), sum_value=h.total)


def _storage(snapshot: Snapshot) -> Iterator[Metric]:
    usage = snapshot.storage
    if usage is None:
        return
    yield GaugeMetricFamily(
        "pushgate_store_map_used_bytes", help_of("pushgate_store_map_used_bytes"), value=usage.used_bytes
    )
    yield GaugeMetricFamily(
        "pushgate_store_map_size_bytes", help_of("pushgate_store_map_size_bytes"), value=usage.map_size
    )
    yield GaugeMetricFamily(
        "pushgate_store_map_max_bytes", help_of("pushgate_store_map_max_bytes"), value=usage.max_map_size
    )
    yield GaugeMetricFamily(
        "pushgate_store_map_used_ratio", help_of("pushgate_store_map_used_ratio"), value=usage.used_ratio
    )


def _cluster(snapshot: Snapshot) -> Iterator[Metric]:
    if not snapshot.cluster:
        return
    up = _gauge("pushgate_cluster_node_up", ["node"])
    lag = _gauge("pushgate_cluster_node_replication_lag", ["node"])
    epoch = _gauge("pushgate_cluster_leader_epoch", ["node"])
    used = _gauge("pushgate_cluster_node_storage_used_bytes", ["node"])
    map_ratio = _gauge("pushgate_cluster_node_map_used_ratio", ["node"])
    disk_free = _gauge("pushgate_cluster_node_disk_free_bytes", ["node"])
    disk_total = _gauge("pushgate_cluster_node_disk_total_bytes", ["node"])
    strays = _gauge("pushgate_cluster_node_stray_replicas", ["node"])
    refused = _gauge("pushgate_cluster_node_refused", ["node"])
    for node in snapshot.nodes:
        up.add_metric([node.id], 1.0 if node.healthy else 0.0)
        refused.add_metric([node.id], 1.0 if node.state == "refused" else 0.0)
        strays.add_metric([node.id], node.strays)
        lag.add_metric([node.id], node.lag)
        if node.epoch is not None:
            epoch.add_metric([node.id], node.epoch)
        if (storage := node.storage) is not None:
            used.add_metric([node.id], storage.used_bytes)
            map_ratio.add_metric([node.id], storage.map_used_ratio)
            disk_free.add_metric([node.id], storage.disk_free_bytes)
            disk_total.add_metric([node.id], storage.disk_total_bytes)
    yield from (up, lag, epoch, used, map_ratio, disk_free, disk_total, strays, refused)
    if (identity := snapshot.identity) is not None:
        yield GaugeMetricFamily(
            "pushgate_cluster_metadata_trusted",
            help_of("pushgate_cluster_metadata_trusted"),
            value=1.0 if identity.trusted else 0.0,
        )


def _alerts(engine: AlertEngine) -> Iterator[Metric]:
    rules = engine.rules
    if rules:
        by_kind = _gauge("pushgate_alert_rules", ["kind"])
        counts: dict[str, int] = {}
        for rule in rules:
            counts[rule.kind] = counts.get(rule.kind, 0) + 1
        for kind, n in sorted(counts.items()):
            by_kind.add_metric([kind], n)
        yield by_kind
        firing = _gauge("pushgate_alerts_firing", ["rule", "kind", "tenant"])
        active: dict[str, int] = {}
        for alert in engine.active():
            active[alert.rule_id] = active.get(alert.rule_id, 0) + 1
        for rule in rules:
            firing.add_metric([rule.id, rule.kind, rule.tenant], active.get(rule.id, 0))
        yield firing
    transitions = _counter("pushgate_alert_transitions", ["kind", "state"])
    for (kind, state), n in sorted(engine.transitions.items()):
        transitions.add_metric([kind, state], n)
    yield transitions
    deliveries = _counter("pushgate_alert_webhook_deliveries", ["outcome"])
    for outcome, n in sorted(engine.webhook_outcomes().items()):
        deliveries.add_metric([outcome], n)
    yield deliveries
