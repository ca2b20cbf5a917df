"""Every metric the gateway exports, once: name, type, labels, meaning.

The families in :mod:`gateway.metrics` take their help text from here, ``docs/metrics.md``
shows the table :func:`markdown_table` prints (``python -m gateway.metrics_catalog``), and a
test parses a live ``/metrics`` and checks both against this list.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class MetricDoc:
    name: str  # the family name, as prometheus_client's parser reports it (no _total)
    type: str  # counter, gauge, histogram, info
    labels: tuple[str, ...]
    help: str
    # "always", or the condition under which the family appears ("cluster", "alerts fired").
    when: str = "always"

    @property
    def exposed_name(self) -> str:
        return self.name + ("_total" if self.type == "counter" else "")


_Q = ("tenant", "queue")

CATALOG: tuple[MetricDoc, ...] = (
    # HTTP ------------------------------------------------------------------
    MetricDoc(
        "pushgate_http_requests",
        "counter",
        ("route", "method", "code"),
        "HTTP requests answered, by route template (never a queue name), method and status code.",
    ),
    MetricDoc(
        "pushgate_http_request_duration_seconds",
        "histogram",
        ("route",),
        "Time to answer an HTTP request, by route template.",
    ),
    MetricDoc(
        "pushgate_http_throttled_requests",
        "counter",
        ("route",),
        "Requests refused with 429 rate_limited, by route template.",
    ),
    MetricDoc(
        "pushgate_http_auth_failures",
        "counter",
        ("code",),
        "Requests refused with 401 (no or bad token) or 403 (scope), by status code.",
    ),
    MetricDoc(
        "pushgate_rate_limited",
        "counter",
        ("op",),
        "Requests refused by a rate limit, by operation (send, receive, connect).",
    ),
    MetricDoc(
        "pushgate_shared_state_up",
        "gauge",
        (),
        "1 while the shared state (Redis, or memory) answers, 0 during an outage.",
    ),
    MetricDoc(
        "pushgate_dedupe_front_hits",
        "counter",
        (),
        "Sends answered as duplicates by the shared dedupe cache, without a store commit.",
    ),
    MetricDoc(
        "pushgate_messages",
        "counter",
        ("event", "transport"),
        "Message events this gateway handled, by event (sent, deduplicated, delivered, acked, "
        "nacked, dead_lettered, expired) and transport (http, ws, sse; store for dead_lettered "
        "and expired). A series appears with its first event.",
    ),
    MetricDoc(
        "pushgate_operation_errors",
        "counter",
        ("operation", "transport", "code"),
        "Operations this gateway answered with an error, by operation (send, receive, ack, nack, "
        "throttled, ...), transport and the error's stable code (queue_not_found, "
        "invalid_receipt, rate_limited, ...), over HTTP and WebSocket alike. A series appears "
        "with its first error.",
    ),
    MetricDoc("pushgate_receive_waiting", "gauge", (), "Long-poll receives parked waiting for a message."),
    # Queues (read from the store at scrape time) ------------------------------
    MetricDoc("pushgate_queues", "gauge", (), "Queues in the store, all tenants."),
    MetricDoc(
        "pushgate_queue_messages",
        "gauge",
        (*_Q, "state"),
        "Messages a queue holds, by state: visible (ready), in_flight (received, not acked), "
        "delayed. Queues past the series limit are summed under tenant and queue `_other`.",
    ),
    MetricDoc(
        "pushgate_queue_oldest_message_age_seconds",
        "gauge",
        _Q,
        "Age of a queue's oldest message (0 when empty); `_other` carries the largest.",
    ),
    MetricDoc(
        "pushgate_queue_consumers",
        "gauge",
        _Q,
        "Push subscriptions (WebSocket and SSE) receiving from a queue through this gateway.",
    ),
    MetricDoc(
        "pushgate_queue_sent",
        "counter",
        _Q,
        "Messages stored in a queue since it was created: the store's durable total, the same "
        "on every gateway of the store (aggregate with max, not sum).",
    ),
    MetricDoc(
        "pushgate_queue_acked",
        "counter",
        _Q,
        "Messages of a queue acked (deleted) since it was created: durable, as pushgate_queue_sent.",
    ),
    MetricDoc(
        "pushgate_queue_dead_lettered",
        "counter",
        _Q,
        "Messages moved from a queue to its dead-letter queue after max_receives since it was "
        "created: durable, as pushgate_queue_sent.",
    ),
    MetricDoc(
        "pushgate_queue_message_events",
        "counter",
        (*_Q, "event"),
        "Message events of a queue counted by this gateway since it started (aggregate with "
        "sum): sent, deduplicated, delivered, acked, nacked, dead_lettered, expired. Queues past "
        "the series limit are summed under `_other`; a queue's own series starts when it gets one.",
    ),
    MetricDoc(
        "pushgate_queue_series_folded",
        "gauge",
        (),
        "Queues whose series are summed under `_other` because of the per-queue series limit.",
    ),
    # Push delivery ---------------------------------------------------------
    MetricDoc(
        "pushgate_push_connections",
        "gauge",
        ("transport",),
        "Open push connections by transport: websocket, sse (one per stream).",
    ),
    MetricDoc(
        "pushgate_push_closes",
        "counter",
        ("transport", "code"),
        "Push connections closed, by transport and close code: 4008 slow consumer, 4001 "
        "authentication failed or expired, 4003 forbidden, 4400 malformed, 1001 shutdown, "
        "1000 normal (client went away).",
    ),
    MetricDoc(
        "pushgate_push_in_flight",
        "gauge",
        (),
        "Messages delivered over push and not yet acked or released.",
    ),
    MetricDoc(
        "pushgate_push_dispatchers",
        "gauge",
        (),
        "Queues with a running dispatcher (at least one subscriber).",
    ),
    MetricDoc(
        "pushgate_push_suspended_streams",
        "gauge",
        (),
        "Disconnected SSE streams whose messages wait for a Last-Event-ID resume.",
    ),
    # Store -----------------------------------------------------------------
    MetricDoc(
        "pushgate_store_commit_batch_size",
        "histogram",
        (),
        "Operations per group commit (one fsync each), for commits that wrote.",
        "embedded store",
    ),
    MetricDoc(
        "pushgate_store_commit_duration_seconds",
        "histogram",
        (),
        "Time to commit a batch, fsync included.",
        "embedded store",
    ),
    MetricDoc(
        "pushgate_store_map_used_bytes",
        "gauge",
        (),
        "Bytes of the LMDB map in use (on a cluster: of the fullest partition environment on any node).",
        "embedded store, cluster",
    ),
    MetricDoc(
        "pushgate_store_map_size_bytes",
        "gauge",
        (),
        "Current LMDB map size (it doubles on demand up to the maximum).",
        "embedded store, cluster",
    ),
    MetricDoc(
        "pushgate_store_map_max_bytes",
        "gauge",
        (),
        "Largest map the store may grow to; past it, sends fail with 503.",
        "embedded store, cluster",
    ),
    MetricDoc(
        "pushgate_store_map_used_ratio",
        "gauge",
        (),
        "Used bytes over the maximum map size (0..1): what a map-full alert watches.",
        "embedded store, cluster",
    ),
    # Alerts ----------------------------------------------------------------
    MetricDoc(
        "pushgate_alert_rules", "gauge", ("kind",), "Alert rules defined, by kind.", "alert rules exist"
    ),
    MetricDoc(
        "pushgate_alerts_firing",
        "gauge",
        ("rule", "kind", "tenant"),
        "Subjects (queues, nodes, the store) an alert rule is firing for now.",
        "alert rules exist",
    ),
    MetricDoc(
        "pushgate_alert_transitions",
        "counter",
        ("kind", "state"),
        "Alerts that fired or resolved, by rule kind and new state.",
    ),
    MetricDoc(
        "pushgate_alert_webhook_deliveries",
        "counter",
        ("outcome",),
        "Alert webhook POSTs: delivered, failed (after every retry), dropped (queue full).",
    ),
    # Cluster ---------------------------------------------------------------
    MetricDoc(
        "pushgate_cluster_node_up", "gauge", ("node",), "1 when a cluster node is up, else 0.", "cluster"
    ),
    MetricDoc(
        "pushgate_cluster_node_replication_lag",
        "gauge",
        ("node",),
        "Replication log entries a node is behind its leaders.",
        "cluster",
    ),
    MetricDoc(
        "pushgate_cluster_leader_epoch",
        "gauge",
        ("node",),
        "Highest epoch among the partitions a node leads; `changes()` of it counts leader changes.",
        "cluster",
    ),
    MetricDoc(
        "pushgate_cluster_node_storage_used_bytes",
        "gauge",
        ("node",),
        "Bytes in use in a node's partition environments (LMDB pages, summed), as it last published.",
        "cluster",
    ),
    MetricDoc(
        "pushgate_cluster_node_map_used_ratio",
        "gauge",
        ("node",),
        "Use of its maximum map size by a node's fullest partition environment (0..1); writes to it fail at 1.",
        "cluster",
    ),
    MetricDoc(
        "pushgate_cluster_node_disk_free_bytes",
        "gauge",
        ("node",),
        "Free bytes on the file system of a node's data directory (whole MiB).",
        "cluster",
    ),
    MetricDoc(
        "pushgate_cluster_node_disk_total_bytes",
        "gauge",
        ("node",),
        "Size of the file system of a node's data directory (whole MiB).",
        "cluster",
    ),
    MetricDoc(
        "pushgate_cluster_metadata_trusted",
        "gauge",
        (),
        "1 when etcd holds the cluster this gateway trusts, else 0 (etcd wiped, replaced or of another cluster: /readyz and GET /v1/cluster say why).",
        "cluster",
    ),
    MetricDoc(
        "pushgate_cluster_node_refused",
        "gauge",
        ("node",),
        "1 when a node refuses etcd (it holds no cluster id, or another cluster's): the node serves and deletes nothing.",
        "cluster",
    ),
    MetricDoc(
        "pushgate_cluster_node_stray_replicas",
        "gauge",
        ("node",),
        "Replicas a node keeps but does not serve (the map does not place them there): never deleted without a tombstone.",
        "cluster",
    ),
    # Process (prometheus_client's own collectors) -----------------------------
    # TLS (with --tls-cert) ------------------------------------------------
    MetricDoc(
        "pushgate_tls_certificate_expiry_timestamp_seconds",
        "gauge",
        (),
        "When the certificate served now stops being valid (Unix seconds); renewals are loaded"
        " without a restart.",
        "--tls-cert",
    ),
    MetricDoc(
        "pushgate_tls_certificate_reloads",
        "counter",
        (),
        "Renewed certificates loaded since start (files changed, or SIGHUP).",
        "--tls-cert",
    ),
    MetricDoc("process_cpu_seconds", "counter", (), "CPU time of the gateway process."),
    MetricDoc("process_resident_memory_bytes", "gauge", (), "Resident memory of the gateway process."),
    MetricDoc("process_virtual_memory_bytes", "gauge", (), "Virtual memory of the gateway process."),
    MetricDoc("process_start_time_seconds", "gauge", (), "When the process started (Unix seconds)."),
    MetricDoc("process_open_fds", "gauge", (), "Open file descriptors (sockets included)."),
    MetricDoc("process_max_fds", "gauge", (), "The file descriptor limit."),
    MetricDoc(
        "python_info",
        "gauge",
        ("implementation", "major", "minor", "patchlevel", "version"),
        "Python version.",
    ),
    MetricDoc(
        "python_gc_objects_collected",
        "counter",
        ("generation",),
        "Objects collected by the garbage collector.",
    ),
    MetricDoc(
        "python_gc_objects_uncollectable",
        "counter",
        ("generation",),
        "Uncollectable objects found by the garbage collector.",
    ),
    MetricDoc("python_gc_collections", "counter", ("generation",), "Garbage collector runs per generation."),
)

BY_NAME: dict[str, MetricDoc] = {m.name: m for m in CATALOG}


def help_of(name: str) -> str:
    return BY_NAME[name].help


def markdown_table() -> str:
    """The table of docs/metrics.md (between its generated-table markers)."""
    lines = ["| metric | type | labels | meaning | present |", "|---|---|---|---|---|"]
    for m in CATALOG:
        labels = ", ".join(f"`{label}`" for label in m.labels) or "-"
        lines.append(f"| `{m.exposed_name}` | {m.type} | {labels} | {m.help} | {m.when} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(markdown_table())
