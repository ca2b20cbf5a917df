"""The usage file format as the pipeline reads it: a copy of the contract in
``gateway/usage/record.py`` (a test checks the two agree), never inferred from files.
"""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql.types import (
    ArrayType,
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

SCHEMA_VERSION = "1"

# Inclusive upper bounds (ms) of the latency buckets; one more bucket counts the rest.
LATENCY_BOUNDS_MS: tuple[float, ...] = (
    0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000,
)  # fmt: skip
BUCKETS = len(LATENCY_BOUNDS_MS) + 1

USAGE_SCHEMA = StructType(
    [
        StructField("record_id", StringType(), False),
        StructField("gateway_id", StringType(), False),
        StructField("window_start", TimestampType(), False),
        StructField("window_end", TimestampType(), False),
        StructField("tenant", StringType(), False),
        StructField("queue", StringType(), False),
        StructField("operation", StringType(), False),
        StructField("transport", StringType(), False),
        StructField("outcome", StringType(), False),
        StructField("count", LongType(), False),
        StructField("bytes", LongType(), False),
        StructField("latency_count", LongType(), False),
        StructField("latency_sum_ms", DoubleType(), False),
        StructField("latency_buckets", ArrayType(LongType(), False), False),
    ]
)

# What a usage file's Parquet schema must be (names and Arrow types; nullability and the
# list's item name are not checked, writers differ on them).
ARROW_TYPES: dict[str, pa.DataType] = {
    "record_id": pa.string(),
    "gateway_id": pa.string(),
    "window_start": pa.timestamp("us", tz="UTC"),
    "window_end": pa.timestamp("us", tz="UTC"),
    "tenant": pa.string(),
    "queue": pa.string(),
    "operation": pa.string(),
    "transport": pa.string(),
    "outcome": pa.string(),
    "count": pa.int64(),
    "bytes": pa.int64(),
    "latency_count": pa.int64(),
    "latency_sum_ms": pa.float64(),
    "latency_buckets": pa.list_(pa.int64()),
}

# Operation names and the ok outcome, as the gateway writes them (record.Operation).
SEND, DEDUPLICATED, RECEIVE, PUSH = "send", "deduplicated", "receive", "push"
ACK, NACK, CONNECT, THROTTLED = "ack", "nack", "connect", "throttled"
DEAD_LETTERED, EXPIRED = "dead_lettered", "expired"
OK = "ok"
