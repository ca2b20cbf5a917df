"""Usage records for the Spark tests, made the way the gateway makes them."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from gateway.usage.aggregator import UsageAggregator
from gateway.usage.record import BUCKETS, UsageRecord
from gateway.usage.writer import UsageWriter
from tests.conftest import ManualClock

DAY = dt.datetime(2026, 11, 20, tzinfo=dt.UTC)


def at(hours: float) -> dt.datetime:
    return DAY + dt.timedelta(hours=hours)


def row(
    record_id: str,
    when: dt.datetime,
    tenant: str = "acme",
    queue: str = "orders",
    operation: str = "send",
    outcome: str = "ok",
    count: int = 1,
    nbytes: int = 0,
    buckets: dict[int, int] | None = None,
    transport: str = "http",
) -> tuple[Any, ...]:
    """A tuple in USAGE_SCHEMA's column order."""
    histogram = [0] * BUCKETS
    for index, n in (buckets or {}).items():
        histogram[index] = n
    return (
        record_id,
        "gw",
        when,
        when + dt.timedelta(seconds=10),
        tenant,
        queue,
        operation,
        transport,
        outcome,
        count,
        nbytes,
        sum(histogram),
        0.0,
        histogram,
    )


def write_window(
    data_dir: Path, start: dt.datetime, sequence: int, observations: list[dict[str, Any]], gateway: str = "gw"
) -> Path:
    """One flush's file under ``data_dir/usage``, through the gateway's aggregator and writer."""
    clock = ManualClock(start.timestamp())
    aggregator = UsageAggregator(clock)
    for o in observations:
        aggregator.observe(**o)
    clock.advance(10)
    records: list[UsageRecord] = aggregator.take(gateway, sequence)
    return UsageWriter(data_dir / "usage", gateway).write(records, sequence)
