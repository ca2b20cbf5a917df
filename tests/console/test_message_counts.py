"""The Prometheus sink of the observe point: per-queue message events with a series limit.

What a Prometheus user depends on: counters never go down (a drop reads as a reset and
inflates ``rate()``), nothing is lost when queues are folded under ``_other``, and a queue
that gets its own series keeps it.
"""

from __future__ import annotations

from gateway.metrics_messages import EVENTS, OTHER, MessageCounts


def series(
    counts: MessageCounts, admitted: set[tuple[str, str]], present: set[tuple[str, str]]
) -> dict[tuple[str, str, str], float]:
    family = counts.queue_family(admitted, present)
    return {(s.labels["tenant"], s.labels["queue"], s.labels["event"]): s.value for s in family.samples}


def test_outcomes_map_to_events_and_failures_are_not_counted() -> None:
    c = MessageCounts()
    c.observe("t", "q", "send", "http", "ok", 3, 30, 0.01)
    c.observe("t", "q", "send", "http", "queue_full", 1)
    c.observe("t", "q", "deduplicated", "ws", "ok", 1, 5)
    c.observe_latencies("t", "q", "push", "sse", 10, [0.1, 0.2])
    c.observe("t", "q", "receive", "http", "ok", 1, 4)
    c.observe("t", "q", "ack", "ws", "ok", 2)
    c.observe("t", "q", "nack", "http", "ok", 1)
    c.observe("t", "q", "dead_lettered", "store", "ok", 1)
    c.observe("t", "q", "expired", "store", "ok", 4)
    c.observe("t", "", "connect", "ws")  # not a message event
    c.observe("t", "q", "throttled", "http", "rate_limited")
    key = ("t", "q")
    got = series(c, {key}, {key})
    assert got == {
        ("t", "q", "sent"): 3,
        ("t", "q", "deduplicated"): 1,
        ("t", "q", "delivered"): 3,
        ("t", "q", "acked"): 2,
        ("t", "q", "nacked"): 1,
        ("t", "q", "dead_lettered"): 1,
        ("t", "q", "expired"): 4,
    }
    errors = {
        (s.labels["operation"], s.labels["transport"], s.labels["code"]): s.value
        for s in c.errors_family().samples
    }
    assert errors == {("send", "http", "queue_full"): 1, ("throttled", "http", "rate_limited"): 1}
    by_transport = {(s.labels["event"], s.labels["transport"]): s.value for s in c.transport_family().samples}
    assert by_transport == {
        ("sent", "http"): 3,
        ("deduplicated", "ws"): 1,
        ("delivered", "sse"): 2,
        ("delivered", "http"): 1,
        ("acked", "ws"): 2,
        ("nacked", "http"): 1,
        ("dead_lettered", "store"): 1,
        ("expired", "store"): 4,
    }


def test_series_never_go_down_as_queues_are_folded_admitted_and_deleted() -> None:
    c = MessageCounts()
    a, b = ("t", "a"), ("t", "b")
    c.observe("t", "a", "send", "http", count=5)
    c.observe("t", "b", "send", "http", count=7)
    # Only a has a series of its own; b is summed under _other.
    first = series(c, {a}, {a, b})
    assert first[("t", "a", "sent")] == 5 and first[(OTHER, OTHER, "sent")] == 7
    # a is deleted, b takes its place: b's own series counts from here, _other keeps the 7.
    c.observe("t", "b", "send", "http", count=2)
    second = series(c, {b}, {b})
    assert ("t", "a", "sent") not in second
    assert second[("t", "b", "sent")] == 2
    assert second[(OTHER, OTHER, "sent")] == 7
    # A queue that was never scraped under _other gets everything in its own series.
    c.observe("t", "c", "send", "http", count=4)
    third = series(c, {b, ("t", "c")}, {b, ("t", "c")})
    assert third[("t", "c", "sent")] == 4 and third[(OTHER, OTHER, "sent")] == 7
    # c is deleted (its series ends, nothing of it moves to _other); d is folded, then
    # deleted: it stays in the _other sum without a dict entry kept for it.
    c.observe("t", "d", "send", "http", count=1)
    fourth = series(c, {b}, {b, ("t", "d")})
    assert ("t", "c", "sent") not in fourth and fourth[(OTHER, OTHER, "sent")] == 7 + 1
    assert series(c, {b}, {b})[(OTHER, OTHER, "sent")] == 7 + 1
    assert c.count("t", "d", "sent") == 0  # forgotten, its count kept in the sum


def test_an_admitted_queue_without_events_shows_zeros() -> None:
    got = series(MessageCounts(), {("t", "idle")}, {("t", "idle")})
    assert got == {("t", "idle", event): 0 for event in EVENTS}


def test_a_queue_newer_than_the_stores_sample_keeps_its_counts_until_the_sample_shows_it() -> None:
    """The store is sampled every few seconds; a queue made and used since the last sample is
    absent from it. Its counts wait for a sample that knows it (they used to be taken for a
    deleted queue's and summed away under ``_other``, and its own series then started at 0)."""
    now = [100.0]
    c = MessageCounts(clock=lambda: now[0])
    new = ("t", "new")
    c.observe("t", "new", "send", "http", count=3)
    # A scrape with the sample of t=99 (before the queue): nothing shown of it, nothing lost.
    stale = c.queue_family(set(), set(), sampled_at=99.0)
    assert [s for s in stale.samples if s.labels["queue"] in ("new", OTHER)] == []
    c.observe("t", "new", "ack", "ws", count=2)
    # The next sample knows it: its own series has everything.
    fresh = series_at(c, {new}, {new}, 101.0)
    assert fresh[("t", "new", "sent")] == 3 and fresh[("t", "new", "acked")] == 2
    assert (OTHER, OTHER, "sent") not in fresh
    # Deleted later: a sample taken after its first count and without it ends its series.
    assert ("t", "new", "sent") not in series_at(c, set(), set(), 102.0)


def series_at(
    counts: MessageCounts, admitted: set[tuple[str, str]], present: set[tuple[str, str]], at: float
) -> dict[tuple[str, str, str], float]:
    family = counts.queue_family(admitted, present, at)
    return {(s.labels["tenant"], s.labels["queue"], s.labels["event"]): s.value for s in family.samples}
