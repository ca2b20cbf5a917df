"""The report's transforms, DataFrame to DataFrame, checked with assertDataFrameEqual."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from pyspark.sql import Row, SparkSession
from pyspark.testing import assertDataFrameEqual

from spark import transforms as T
from spark.schema import BUCKETS, USAGE_SCHEMA
from tests.spark.records import DAY, at, row

# Histogram with 10 observations in bucket 1 ((0.5, 1] ms) and 10 in bucket 3 ((2.5, 5] ms).
H = {1: 10, 3: 10}


def _records(spark: SparkSession, rows: list[tuple[Any, ...]]) -> Any:
    return spark.createDataFrame(rows, USAGE_SCHEMA)


def _hist(buckets: dict[int, int]) -> list[int]:
    return [buckets.get(i, 0) for i in range(BUCKETS)]


def test_dedupe_counts_a_record_seen_twice_once(spark: SparkSession) -> None:
    records = _records(spark, [row("a", at(1)), row("a", at(1)), row("b", at(1))])
    assertDataFrameEqual(T.dedupe(records).select("record_id"), [Row(record_id="a"), Row(record_id="b")])


def test_in_range_is_start_inclusive_end_exclusive_and_filters_a_tenant(spark: SparkSession) -> None:
    records = _records(
        spark,
        [
            row("before", at(-0.01)),
            row("start", at(0)),
            row("other", at(0), tenant="beta"),
            row("last", at(23.99)),
            row("end", at(24)),
        ],
    )
    kept = T.in_range(records, DAY, DAY + dt.timedelta(days=1))
    assertDataFrameEqual(kept.select("record_id"), [Row(record_id=r) for r in ("start", "other", "last")])
    only = T.in_range(records, DAY, DAY + dt.timedelta(days=1), tenant="beta")
    assertDataFrameEqual(only.select("record_id"), [Row(record_id="other")])


@pytest.mark.parametrize(
    ("granularity", "period", "start"),
    [("hour", "2026-11-20T13", at(13)), ("day", "2026-11-20", DAY)],
)
def test_with_period_cuts_utc_hours_and_days(
    spark: SparkSession, granularity: str, period: str, start: dt.datetime
) -> None:
    records = _records(spark, [row("a", at(13.5))])
    out = T.with_period(records, granularity).select("period_start")
    assertDataFrameEqual(out, [Row(period_start=start.replace(tzinfo=None))])
    now = start + dt.timedelta(days=2)
    keyed = T.with_period_end(out, granularity, now, dt.timedelta(0)).select("period")
    assertDataFrameEqual(keyed, [Row(period=period)])


def test_queue_and_tenant_usage_measures_and_merged_histograms(spark: SparkSession) -> None:
    rows = [
        row("1", at(1), operation="send", count=5, nbytes=50, buckets={1: 10}),
        row("2", at(2), operation="send", count=3, nbytes=30, buckets={3: 10}),
        row("3", at(1), operation="send", outcome="message_too_large", count=2),
        row("4", at(1), operation="push", count=6, nbytes=60, transport="ws", buckets={5: 6}),
        row("5", at(1), operation="receive", count=1, nbytes=10),
        row("6", at(1), operation="ack", count=6, transport="ws"),
        row("7", at(1), operation="nack", count=1),
        row("8", at(1), operation="deduplicated", count=4, nbytes=40),
        row("9", at(1), operation="throttled", outcome="rate_limited", count=7),
        row("10", at(1), operation="connect", count=2, transport="ws"),
        row("11", at(1), operation="dead_lettered", count=1),
        row("12", at(1), queue="jobs", operation="send", count=1, nbytes=5, buckets={3: 5}),
        row("13", at(3), operation="expired", count=3, transport="store"),
    ]
    periods = T.with_period(_records(spark, rows), "day")
    queues = T.queue_usage(T.operation_usage(periods))
    zero = _hist({})
    base = {"period_start": DAY.replace(tzinfo=None)}
    orders = Row(
        tenant="acme",
        queue="orders",
        **base,
        records=12,
        sent=8,
        delivered=7,
        acked=6,
        nacked=1,
        bytes=80,
        delivered_bytes=70,
        throttled=7,
        deduplicated=4,
        dead_lettered=1,
        expired=3,
        connections=2,
        errors=2,
        send_latency_histogram=_hist(H),
        delivery_latency_histogram=_hist({5: 6}),
    )
    jobs = Row(
        tenant="acme",
        queue="jobs",
        **base,
        records=1,
        sent=1,
        delivered=0,
        acked=0,
        nacked=0,
        bytes=5,
        delivered_bytes=0,
        throttled=0,
        deduplicated=0,
        dead_lettered=0,
        expired=0,
        connections=0,
        errors=0,
        send_latency_histogram=_hist({3: 5}),
        delivery_latency_histogram=zero,
    )
    assertDataFrameEqual(queues, [orders, jobs])
    tenants = T.tenant_usage(queues)
    assert tenants.count() == 1
    tenant = tenants.first()
    assert tenant is not None
    assert (tenant["sent"], tenant["bytes"], tenant["expired"], tenant["records"]) == (9, 85, 3, 13)
    assert tenant["send_latency_histogram"] == _hist({1: 10, 3: 15})  # merged, not averaged


def test_percentiles_interpolate_inside_the_bucket(spark: SparkSession) -> None:
    frame = spark.createDataFrame(
        [(_hist(H), _hist({})), (_hist({16: 3}), _hist({0: 1}))],
        "send_latency_histogram array<bigint>, delivery_latency_histogram array<bigint>",
    )
    out = T.with_latency_percentiles(frame).select(
        "send_latency_p50_ms", "send_latency_p95_ms", "send_latency_p99_ms", "delivery_latency_p50_ms"
    )
    # Rank 10 of 20 ends bucket (0.5, 1]: 1.0; rank 19 is 9/10 into (2.5, 5]: 4.75;
    # rank 19.8: 4.95. All in the overflow bucket: the last bound. Empty: null.
    assertDataFrameEqual(
        out,
        [
            Row(
                send_latency_p50_ms=1.0,
                send_latency_p95_ms=4.75,
                send_latency_p99_ms=4.95,
                delivery_latency_p50_ms=None,
            ),
            Row(
                send_latency_p50_ms=60000.0,
                send_latency_p95_ms=60000.0,
                send_latency_p99_ms=60000.0,
                delivery_latency_p50_ms=0.25,
            ),
        ],
    )


def test_provisional_until_the_period_has_settled(spark: SparkSession) -> None:
    frame = spark.createDataFrame([(DAY,), (DAY + dt.timedelta(days=1),)], "period_start timestamp")
    now = DAY + dt.timedelta(days=1, minutes=10)
    out = T.with_period_end(frame, "day", now, dt.timedelta(minutes=15))
    assertDataFrameEqual(
        out,
        [
            Row(
                period_start=DAY.replace(tzinfo=None),
                period="2026-11-20",
                period_end=at(24).replace(tzinfo=None),
                provisional=True,
            ),
            Row(
                period_start=at(24).replace(tzinfo=None),
                period="2026-11-21",
                period_end=at(48).replace(tzinfo=None),
                provisional=True,
            ),
        ],
    )
    later = T.with_period_end(frame, "day", now + dt.timedelta(minutes=6), dt.timedelta(minutes=15))
    assert [r["provisional"] for r in later.orderBy("period_start").collect()] == [False, True]


def test_billing_lines_one_per_tenant_usage_type_and_period_without_zeros(spark: SparkSession) -> None:
    tenants = spark.createDataFrame(
        [("acme", "2026-11-20", DAY, at(24), False, 9, 7, 85, 70, 0)],
        "tenant string, period string, period_start timestamp, period_end timestamp, provisional boolean, "
        "sent bigint, delivered bigint, bytes bigint, delivered_bytes bigint, connections bigint",
    )
    lines = T.billing_lines(tenants).select("tenant", "period", "usage_type", "quantity", "unit")
    assertDataFrameEqual(
        lines,
        [
            Row(tenant="acme", period="2026-11-20", usage_type="messages-sent", quantity=9, unit="messages"),
            Row(
                tenant="acme",
                period="2026-11-20",
                usage_type="messages-delivered",
                quantity=7,
                unit="messages",
            ),
            Row(tenant="acme", period="2026-11-20", usage_type="data-in", quantity=85, unit="bytes"),
            Row(tenant="acme", period="2026-11-20", usage_type="data-out", quantity=70, unit="bytes"),
        ],
    )
