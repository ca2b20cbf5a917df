"""The usage record: one row of a usage file, and the file's schema.

A usage file holds one record per (tenant, queue, operation, transport, outcome) seen in
one flush window. The format is a contract with ``spark/`` (which keeps its own copy of
the schema, checked equal by a test): change both, and bump :data:`SCHEMA_VERSION`.

Latency is a histogram with fixed bucket bounds, the same in every file, so histograms
of any windows, gateways or queues merge by adding counts bucket by bucket; percentiles
are read off the merged histogram.
"""

from __future__ import annotations

import bisect
import enum
from dataclasses import dataclass

import pyarrow as pa

SCHEMA_VERSION = "1"
# Parquet key-value metadata naming the file: every record id in it is "<file id>-<row>".
FILE_ID_KEY = b"pushgate.usage.file_id"

# Upper bounds (milliseconds, inclusive) of the latency buckets; one more bucket past the
# last bound counts everything slower. Roughly 1-2.5-5 steps from 0.5 ms to 60 s.
LATENCY_BOUNDS_MS: tuple[float, ...] = (
    0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000,
)  # fmt: skip
BUCKETS = len(LATENCY_BOUNDS_MS) + 1
LATENCY_BOUNDS_S = tuple(b / 1000 for b in LATENCY_BOUNDS_MS)


def latency_bucket(seconds: float) -> int:
    """The index of the bucket ``seconds`` falls in (bounds are inclusive upper bounds)."""
    return bisect.bisect_left(LATENCY_BOUNDS_S, seconds)


class Operation(enum.StrEnum):
    """What a record counts. ``count`` is messages unless said otherwise.

    An operation that failed is recorded under its own name with ``outcome`` set to the
    error code (``send`` / ``queue_not_found``): errors by code are the records whose
    outcome is not ``ok``.
    """

    SEND = "send"  # messages stored; bytes: their bodies; latency: the request
    DEDUPLICATED = "deduplicated"  # sends answered as duplicates, nothing stored
    RECEIVE = "receive"  # messages returned by HTTP receive (pull); no latency (long-polls wait)
    PUSH = "push"  # messages delivered over WebSocket or SSE; latency: sent -> delivered
    ACK = "ack"  # messages acked
    NACK = "nack"  # messages nacked (made visible again)
    CONNECT = "connect"  # push connections (WebSocket) and streams (SSE) opened
    THROTTLED = "throttled"  # requests, frames, connections refused by a rate limit
    DEAD_LETTERED = "dead_lettered"  # messages moved to a dead-letter queue (reported by the store)
    EXPIRED = "expired"  # messages dropped past the queue's retention (reported by the store)


class Transport(enum.StrEnum):
    HTTP = "http"
    WS = "ws"
    SSE = "sse"
    STORE = "store"  # dead_lettered and expired: no client asked, the store did it
    SQS = "sqs"  # the SQS API (gateway/sqs/)


OK = "ok"


@dataclass(frozen=True, slots=True)
class UsageRecord:
    """One row of a usage file.

    ``record_id`` is unique across every file any gateway writes (gateway id, file
    sequence, row), so a reader that sees the same record twice (a copied file, an
    overlapping re-read) counts it once. ``window_start_us``/``window_end_us`` are the
    flush window (UTC, microseconds since the epoch, start inclusive, end exclusive);
    the window never crosses an hour boundary, so a record belongs to exactly one hour.
    """

    record_id: str
    gateway_id: str
    window_start_us: int
    window_end_us: int
    tenant: str
    queue: str
    operation: str
    transport: str
    outcome: str
    count: int
    bytes: int
    latency_count: int
    latency_sum_ms: float
    latency_buckets: tuple[int, ...]


SCHEMA = pa.schema(
    [
        pa.field("record_id", pa.string(), nullable=False),
        pa.field("gateway_id", pa.string(), nullable=False),
        pa.field("window_start", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("window_end", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("tenant", pa.string(), nullable=False),
        pa.field("queue", pa.string(), nullable=False),
        pa.field("operation", pa.string(), nullable=False),
        pa.field("transport", pa.string(), nullable=False),
        pa.field("outcome", pa.string(), nullable=False),
        pa.field("count", pa.int64(), nullable=False),
        pa.field("bytes", pa.int64(), nullable=False),
        pa.field("latency_count", pa.int64(), nullable=False),
        pa.field("latency_sum_ms", pa.float64(), nullable=False),
        pa.field(
            "latency_buckets", pa.list_(pa.field("element", pa.int64(), nullable=False)), nullable=False
        ),
    ],
    metadata={
        b"pushgate.usage.schema_version": SCHEMA_VERSION.encode(),
        b"pushgate.usage.latency_bounds_ms": ",".join(f"{b:g}" for b in LATENCY_BOUNDS_MS).encode(),
    },
)


def to_table(records: list[UsageRecord]) -> pa.Table:
    """The records as an Arrow table with :data:`SCHEMA`, column by column."""
    return pa.table(
        {
            "record_id": [r.record_id for r in records],
            "gateway_id": [r.gateway_id for r in records],
            "window_start": [r.window_start_us for r in records],
            "window_end": [r.window_end_us for r in records],
            "tenant": [r.tenant for r in records],
            "queue": [r.queue for r in records],
            "operation": [r.operation for r in records],
            "transport": [r.transport for r in records],
            "outcome": [r.outcome for r in records],
            "count": [r.count for r in records],
            "bytes": [r.bytes for r in records],
            "latency_count": [r.latency_count for r in records],
            "latency_sum_ms": [r.latency_sum_ms for r in records],
            "latency_buckets": [list(r.latency_buckets) for r in records],
        },
        schema=SCHEMA,
    )
