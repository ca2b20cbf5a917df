"""The report as pure DataFrame-to-DataFrame transforms: no I/O, no session state.

Pipeline (``spark/report.py`` runs it)::

    usage records -> dedupe -> in_range -> with_period -> operation_usage (the one pass
    over every record) -> queue_usage (per queue) -> tenant_usage (per tenant)
    with_period_end and with_latency_percentiles on both; billing_lines from the tenants

Histograms stay arrays of bucket counts until the end, so tenant rows merge queue rows'
histograms (percentiles never average percentiles).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from .schema import (
    ACK,
    BUCKETS,
    CONNECT,
    DEAD_LETTERED,
    DEDUPLICATED,
    EXPIRED,
    LATENCY_BOUNDS_MS,
    NACK,
    OK,
    PUSH,
    RECEIVE,
    SEND,
    THROTTLED,
)

GRANULARITIES = {"hour": dt.timedelta(hours=1), "day": dt.timedelta(days=1)}
PERIOD_KEY_FORMAT = {"hour": "yyyy-MM-dd'T'HH", "day": "yyyy-MM-dd"}
QUANTILES = (("p50", 0.50), ("p95", 0.95), ("p99", 0.99))

# The counted measures: name -> (operations, which outcomes, summed column). Data, not
# Columns: a Column needs a running session, and this module is imported before one starts.
MEASURES: dict[str, tuple[tuple[str, ...], str, str]] = {
    "sent": ((SEND,), "ok", "count"),
    "delivered": ((PUSH, RECEIVE), "ok", "count"),
    "acked": ((ACK,), "ok", "count"),
    "nacked": ((NACK,), "ok", "count"),
    "bytes": ((SEND,), "ok", "bytes"),
    "delivered_bytes": ((PUSH, RECEIVE), "ok", "bytes"),
    "throttled": ((THROTTLED,), "any", "count"),
    "deduplicated": ((DEDUPLICATED,), "ok", "count"),
    "dead_lettered": ((DEAD_LETTERED,), "ok", "count"),
    "expired": ((EXPIRED,), "ok", "count"),
    "connections": ((CONNECT,), "ok", "count"),
    # Every failed operation, by any code; throttled requests are counted on their own.
    "errors": ((), "error", "count"),
}
# Latency histograms: send requests (time to answer) and pushes (time from send to delivery).
HISTOGRAMS: dict[str, tuple[str, ...]] = {"send_latency": (SEND,), "delivery_latency": (PUSH,)}


def _condition(operations: tuple[str, ...], outcomes: str) -> Column:
    ok = F.col("outcome") == OK
    if outcomes == "error":
        return ~ok & (F.col("operation") != THROTTLED)
    matches = F.col("operation").isin(*operations)
    return matches & ok if outcomes == "ok" else matches


def dedupe(records: DataFrame) -> DataFrame:
    """One row per ``record_id``: a record read twice (a copied file) counts once."""
    return records.dropDuplicates(["record_id"])


def in_range(
    records: DataFrame, start: dt.datetime, end: dt.datetime, tenant: str | None = None
) -> DataFrame:
    """Records whose window starts in [start, end) (UTC), of one tenant if given."""
    kept = records.where((F.col("window_start") >= F.lit(start)) & (F.col("window_start") < F.lit(end)))
    return kept if tenant is None else kept.where(F.col("tenant") == tenant)


def with_period(records: DataFrame, granularity: str) -> DataFrame:
    """Add ``period_start``, the UTC hour or day the window starts in (the session time
    zone must be UTC). Its text key is added after aggregation (:func:`with_period_end`):
    formatting a string per record cost more than the rest of the pass."""
    return records.withColumn("period_start", F.date_trunc(granularity, F.col("window_start")))


def operation_usage(records: DataFrame) -> DataFrame:
    """Per (tenant, queue, period_start, operation, outcome): records, count, bytes and the
    histogram summed bucket by bucket. The one pass over every record: plain sums only,
    so Spark compiles it into one tight loop.

    Only the records a report histogram reads (:data:`HISTOGRAMS`: successful sends and
    pushes) have their buckets summed; the others get zeros. Summing 17 buckets was about
    a third of the pass, and most records (receives, acks, connections, errors) carry none.
    """
    timed = F.col("outcome") == OK
    timed &= F.col("operation").isin(*sorted({op for ops in HISTOGRAMS.values() for op in ops}))
    return records.groupBy("tenant", "queue", "period_start", "operation", "outcome").agg(
        F.count(F.lit(1)).alias("records"),
        F.sum("count").alias("count"),
        F.sum("bytes").alias("bytes"),
        F.array(
            *(
                F.coalesce(F.sum(F.when(timed, F.col("latency_buckets")[i])), F.lit(0).cast("long"))
                for i in range(BUCKETS)
            )
        ).alias("latency_buckets"),
    )


def _zero_histogram() -> Column:
    return F.array_repeat(F.lit(0).cast("long"), BUCKETS)


def _merge_histograms(histogram: Column) -> Column:
    """Aggregate: the element-wise sum of a group's histograms. For small groups (the
    per-queue rows), where collecting the arrays is cheap."""
    return F.aggregate(
        F.collect_list(histogram), _zero_histogram(), lambda acc, h: F.zip_with(acc, h, lambda a, b: a + b)
    )


def queue_usage(operations: DataFrame) -> DataFrame:
    """Per (tenant, queue, period): every measure, the record count and the histograms,
    from :func:`operation_usage` rows."""
    aggregates = [F.sum("records").cast("long").alias("records")]
    for name, (ops, outcomes, column) in MEASURES.items():
        condition = _condition(ops, outcomes)
        aggregates.append(
            F.coalesce(F.sum(F.when(condition, F.col(column))), F.lit(0)).cast("long").alias(name)
        )
    for name, ops in HISTOGRAMS.items():
        chosen = F.when(_condition(ops, "ok"), F.col("latency_buckets"))
        aggregates.append(_merge_histograms(F.coalesce(chosen, _zero_histogram())).alias(f"{name}_histogram"))
    return operations.groupBy("tenant", "queue", "period_start").agg(*aggregates)


def tenant_usage(queues: DataFrame) -> DataFrame:
    """Per (tenant, period): queue rows added up, histograms merged bucket by bucket."""
    aggregates = [F.sum("records").cast("long").alias("records")]
    aggregates += [F.sum(name).cast("long").alias(name) for name in MEASURES]
    aggregates += [_merge_histograms(F.col(f"{h}_histogram")).alias(f"{h}_histogram") for h in HISTOGRAMS]
    return queues.groupBy("tenant", "period_start").agg(*aggregates)


def cumulative_counts(histogram: Column) -> Column:
    """Running totals of a bucket-count array: ``[h0, h0+h1, ...]``."""
    return F.transform(
        histogram,
        lambda _, i: F.aggregate(F.slice(histogram, 1, i + 1), F.lit(0).cast("long"), lambda a, y: a + y),
    )


def bucket_of_rank(cumulative: Column, q: float) -> Column:
    """0-based index of the bucket the ``q`` quantile's rank falls in: how many buckets end
    before it (``cumulative`` is :func:`cumulative_counts` of the histogram)."""
    rank = F.lit(q) * F.element_at(cumulative, -1)
    return F.size(F.filter(cumulative, lambda c: c < rank))


def histogram_quantile(histogram: Column, cumulative: Column, index: Column, q: float) -> Column:
    """The ``q`` quantile (ms) of a bucket-count array, interpolated linearly inside the
    bucket the rank falls in (as Prometheus' ``histogram_quantile``). Null for an empty
    histogram; the last finite bound when the rank falls in the overflow bucket.

    ``cumulative`` (:func:`cumulative_counts`) and ``index`` (:func:`bucket_of_rank`) are
    passed as columns of their own: inlined into each use, the expression grew so large
    that analysing and compiling it cost seconds per report (and once too big to compile).
    """
    bounds = F.array(*(F.lit(float(b)) for b in LATENCY_BOUNDS_MS))
    total = F.element_at(cumulative, -1)
    rank = F.lit(q) * total
    lower = F.when(index == 0, F.lit(0.0)).otherwise(bounds[index - 1])
    upper = bounds[index]
    before = F.when(index == 0, F.lit(0)).otherwise(cumulative[index - 1])
    inside = F.greatest(histogram[index], F.lit(1))
    value = lower + (upper - lower) * (rank - before) / inside
    overflow = index >= len(LATENCY_BOUNDS_MS)
    result = F.when(overflow, F.lit(float(LATENCY_BOUNDS_MS[-1]))).otherwise(value)
    return F.when(total > 0, F.round(result, 3))


def with_latency_percentiles(usage: DataFrame) -> DataFrame:
    """Add ``<histogram>_p50_ms``, ``_p95_ms``, ``_p99_ms`` for each histogram column.

    Three selects in all (running totals, the bucket of each rank, the quantiles), each
    step reading the last one's columns by name: a withColumn per quantile re-analyses the
    growing plan each time, and one select with everything inlined made an expression tree
    that took seconds to analyse and compile.
    """
    cumulative = {name: f"_{name}_cumulative" for name in HISTOGRAMS}
    index = {(name, label): f"_{name}_{label}_bucket" for name in HISTOGRAMS for label, _ in QUANTILES}
    with_totals = usage.select(
        "*", *(cumulative_counts(F.col(f"{name}_histogram")).alias(c) for name, c in cumulative.items())
    )
    with_index = with_totals.select(
        "*",
        *(
            bucket_of_rank(F.col(cumulative[name]), q).alias(index[(name, label)])
            for name in HISTOGRAMS
            for label, q in QUANTILES
        ),
    )
    quantiles = [
        histogram_quantile(
            F.col(f"{name}_histogram"), F.col(cumulative[name]), F.col(index[(name, label)]), q
        ).alias(f"{name}_{label}_ms")
        for name in HISTOGRAMS
        for label, q in QUANTILES
    ]
    return with_index.select(*(F.col(c) for c in usage.columns), *quantiles)


def with_period_end(usage: DataFrame, granularity: str, now: dt.datetime, settle: dt.timedelta) -> DataFrame:
    """Add ``period`` (the period's key, ``2026-11-22`` or ``2026-11-22T13``), ``period_end``
    and ``provisional``: true while data for the period may still arrive (its end plus
    ``settle``, the longest a gateway holds usage, is after ``now``)."""
    step = GRANULARITIES[granularity]
    return usage.select(
        "*",
        F.date_format("period_start", PERIOD_KEY_FORMAT[granularity]).alias("period"),
        (F.col("period_start") + F.lit(step)).alias("period_end"),
        ((F.col("period_start") + F.lit(step + settle)) > F.lit(now)).alias("provisional"),
    )


# Billable usage types: (usage_type, measure, unit). Like a cloud cost-and-usage report:
# one line per tenant x usage type x period, zero lines left out.
BILLING_TYPES: Sequence[tuple[str, str, str]] = (
    ("messages-sent", "sent", "messages"),
    ("messages-delivered", "delivered", "messages"),
    ("data-in", "bytes", "bytes"),
    ("data-out", "delivered_bytes", "bytes"),
    ("connections", "connections", "connections"),
)


def billing_lines(tenants: DataFrame) -> DataFrame:
    """One row per tenant x usage type x period with ``quantity`` and ``unit``."""
    pairs = ", ".join(
        f"'{usage}', CAST({measure} AS BIGINT), '{unit}'" for usage, measure, unit in BILLING_TYPES
    )
    lines = tenants.selectExpr(
        "tenant",
        "period",
        "period_start",
        "period_end",
        "provisional",
        f"stack({len(BILLING_TYPES)}, {pairs}) AS (usage_type, quantity, unit)",
    )
    return lines.where(F.col("quantity") > 0)


# Columns of the summary CSV, in order (the queue rows of every period).
SUMMARY_COLUMNS = (
    "tenant",
    "queue",
    "period_start",
    "period_end",
    "provisional",
    "sent",
    "delivered",
    "acked",
    "nacked",
    "bytes",
    "delivered_bytes",
    "throttled",
    "deduplicated",
    "dead_lettered",
    "expired",
    "errors",
    "connections",
    *(f"{h}_{label}_ms" for h in HISTOGRAMS for label, _ in QUANTILES),
)
