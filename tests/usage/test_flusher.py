"""The flusher: periodic flushes, hour boundaries, the final flush on close, retries."""

from __future__ import annotations

import asyncio
import datetime as dt
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from gateway.usage.aggregator import UsageAggregator
from gateway.usage.flusher import UsageFlusher
from gateway.usage.writer import UsageWriter
from tests.conftest import ManualClock, wait_for


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.parquet") if not p.name.startswith("."))


def test_the_next_flush_stops_at_the_hour_boundary() -> None:
    clock = ManualClock(dt.datetime(2026, 11, 20, 13, 59, 57, tzinfo=dt.UTC).timestamp())
    flusher = UsageFlusher(UsageAggregator(clock), UsageWriter(Path("/nonexistent"), "gw"), 10, clock=clock)
    assert flusher.next_delay() == pytest.approx(3)
    clock.advance(3)
    assert flusher.next_delay() == pytest.approx(10)


async def test_flushes_periodically_and_on_close(tmp_path: Path) -> None:
    aggregator = UsageAggregator()
    flusher = UsageFlusher(aggregator, UsageWriter(tmp_path, "gw"), interval_s=0.05)
    await flusher.start()
    aggregator.observe("t", "q", "send", "http", count=2)

    async def written() -> bool:
        return flusher.files_written >= 1

    await wait_for(written, what="a periodic flush")
    aggregator.observe("t", "q", "ack", "http", count=2)
    await flusher.close()  # what SIGTERM ends in: the last window is written
    rows = [r for f in _files(tmp_path) for r in pq.read_table(f).to_pylist()]
    assert sorted((r["operation"], r["count"]) for r in rows) == [("ack", 2), ("send", 2)]
    assert len({r["record_id"] for r in rows}) == 2


async def test_a_failed_write_is_retried_at_the_next_flush(tmp_path: Path) -> None:
    root = tmp_path / "usage"
    root.write_text("a file where the directory should be")  # every write fails
    aggregator = UsageAggregator()
    flusher = UsageFlusher(aggregator, UsageWriter(root, "gw"), interval_s=3600)
    aggregator.observe("t", "q", "send", "http")
    await flusher.flush()
    assert flusher.files_written == 0
    root.unlink()
    aggregator.observe("t", "q", "send", "http", count=5)
    await flusher.flush()
    assert flusher.files_written == 2
    counts = sorted(r["count"] for f in _files(root) for r in pq.read_table(f).to_pylist())
    assert counts == [1, 5]


async def test_concurrent_flushes_do_not_interleave(tmp_path: Path) -> None:
    aggregator = UsageAggregator()
    flusher = UsageFlusher(aggregator, UsageWriter(tmp_path, "gw"), interval_s=3600)
    aggregator.observe("t", "q", "send", "http")
    await asyncio.gather(flusher.flush(), flusher.flush())
    assert len(_files(tmp_path)) == 1


async def test_usage_observed_during_a_flush_goes_whole_into_the_next_window(tmp_path: Path) -> None:
    """A flush ends its window at once and makes its records off the event loop (at 10,000
    queues they held a gateway's loop 40-60 ms): requests counted meanwhile go into the next
    window, none into the one being written, and none is lost."""
    aggregator = UsageAggregator()
    for i in range(5_000):
        aggregator.observe("t", f"q{i:04d}", "send", "http", count=1)
    flusher = UsageFlusher(aggregator, UsageWriter(tmp_path, "gw"), interval_s=3600)
    observed_during = 0

    async def request() -> None:
        nonlocal observed_during
        while True:
            aggregator.observe("t", "late", "send", "http")
            observed_during += 1
            await asyncio.sleep(0)

    flushing = asyncio.create_task(flusher.flush())
    requests = asyncio.create_task(request())
    await flushing
    requests.cancel()
    assert observed_during >= 1
    first = {r["queue"]: r["count"] for r in pq.read_table(_files(tmp_path)[0]).to_pylist()}
    assert len(first) == 5_000 and set(first.values()) == {1} and "late" not in first
    await flusher.flush()
    [late] = [r for r in pq.read_table(_files(tmp_path)[1]).to_pylist()]
    assert (late["queue"], late["count"]) == ("late", observed_during)
