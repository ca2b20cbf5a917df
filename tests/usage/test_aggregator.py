"""The usage aggregator: keys, counts, bytes, histograms, windows and record ids."""

from __future__ import annotations

from gateway.usage.aggregator import UsageAggregator
from gateway.usage.record import BUCKETS, LATENCY_BOUNDS_MS, latency_bucket
from tests.conftest import ManualClock


def test_buckets_are_inclusive_upper_bounds() -> None:
    assert latency_bucket(0) == 0
    assert latency_bucket(0.0005) == 0  # exactly 0.5 ms: the first bucket
    assert latency_bucket(0.00051) == 1
    assert latency_bucket(0.003) == LATENCY_BOUNDS_MS.index(5)
    assert latency_bucket(LATENCY_BOUNDS_MS[-1] / 1000 + 1) == BUCKETS - 1  # the overflow bucket


def test_one_record_per_key_with_counts_bytes_and_histogram(clock: ManualClock) -> None:
    agg = UsageAggregator(clock)
    start = clock.now
    agg.observe("t1", "q", "send", "http", count=3, nbytes=30, latency_s=0.002)
    agg.observe("t1", "q", "send", "http", count=1, nbytes=10, latency_s=0.002)
    agg.observe("t1", "q", "send", "http", outcome="message_too_large")
    agg.observe("t2", "q", "send", "http", count=2, nbytes=5)
    agg.observe_latencies("t1", "q", "push", "ws", 40, [0.001, 0.004, 0.2])
    assert agg.pending == 4
    clock.advance(10)
    records = {(r.tenant, r.operation, r.outcome): r for r in agg.take("gw", 7)}
    assert len(records) == 4
    ok = records[("t1", "send", "ok")]
    assert (ok.count, ok.bytes, ok.latency_count) == (4, 40, 2)
    assert ok.latency_buckets[latency_bucket(0.002)] == 2 and sum(ok.latency_buckets) == 2
    assert abs(ok.latency_sum_ms - 4.0) < 1e-9
    assert ok.window_start_us == int(start * 1e6) and ok.window_end_us == int((start + 10) * 1e6)
    failed = records[("t1", "send", "message_too_large")]
    assert (failed.count, failed.latency_count) == (1, 0)
    push = records[("t1", "push", "ok")]
    assert (push.count, push.bytes, push.latency_count, sum(push.latency_buckets)) == (3, 40, 3, 3)
    assert records[("t2", "send", "ok")].latency_count == 0


def test_take_starts_a_new_window_and_ids_never_repeat(clock: ManualClock) -> None:
    agg = UsageAggregator(clock)
    agg.observe("t", "a", "ack", "ws", count=2)
    agg.observe("t", "b", "ack", "ws", count=2)
    clock.advance(5)
    first = agg.take("gw", 0)
    assert agg.pending == 0
    agg.observe("t", "a", "ack", "ws")
    clock.advance(5)
    second = agg.take("gw", 1)
    assert second[0].window_start_us == first[0].window_end_us
    assert second[0].count == 1  # the first window's counts did not carry over
    ids = [r.record_id for r in first + second]
    assert len(ids) == len(set(ids)) == 3
    assert agg.take("gw", 2) == []  # nothing observed: nothing to write
