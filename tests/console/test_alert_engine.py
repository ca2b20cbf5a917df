"""The alert engine on hand-made snapshots: thresholds, hysteresis, for_s, every rule kind.

No server, no clock: each snapshot carries its time, so "5 seconds later" is a number.
"""

from __future__ import annotations

from typing import Any

import pytest

from backend_store.errors import InvalidRequest
from backend_store.types import StorageUsage
from web_console.alerts import AlertEngine, AlertRule, RuleStore, parse_rule
from web_console.monitor import (
    DepthHistory,
    NodeSample,
    NodeStorageSample,
    QueueSample,
    RateHistory,
    Snapshot,
)


class NoStore(RuleStore):
    """A rule store without a backend: evaluate() reads ``engine.rules``, never the store."""

    def __init__(self) -> None:  # nothing to hold: a call to the store would fail loudly
        pass


def q(
    name: str, visible: int = 0, *, consumers: int = 0, age: float | None = None, tenant: str = "t"
) -> QueueSample:
    return QueueSample(tenant, name, visible, 0, 0, age, consumers, 0, 0, 0, None, {})


def engine(*rules: AlertRule) -> tuple[AlertEngine, DepthHistory]:
    history = DepthHistory(step_s=1)
    e = AlertEngine(NoStore(), history)
    e.rules = list(rules)
    return e, history


def rule(kind: str, threshold: float = 0, tenant: str = "t", **fields: Any) -> AlertRule:
    return AlertRule(id=f"r-{kind}", tenant=tenant, kind=kind, threshold=threshold, **fields)


def states(e: AlertEngine, snapshot: Snapshot, history: DepthHistory | None = None) -> list[tuple[str, str]]:
    if history is not None:
        history.add(snapshot.at, snapshot.queues)
    return [(ev.state, ev.subject) for ev in e.evaluate(snapshot)]


def test_depth_fires_above_and_resolves_only_below_the_clear_level() -> None:
    e, _ = engine(rule("queue_depth", 100))
    assert states(e, Snapshot(1, (q("a", 100),))) == []  # at the threshold: not above it
    assert states(e, Snapshot(2, (q("a", 101), q("b", 5)))) == [("fired", "t/a")]
    assert [a.subject for a in e.active()] == ["t/a"]
    # Between clear (80) and the threshold: still firing, no flapping.
    assert states(e, Snapshot(3, (q("a", 90),))) == []
    assert states(e, Snapshot(4, (q("a", 101),))) == []
    assert states(e, Snapshot(5, (q("a", 80),))) == [("resolved", "t/a")]
    assert e.active() == []
    assert [(ev.state, ev.subject) for ev in e.recent()] == [("resolved", "t/a"), ("fired", "t/a")]
    assert e.transitions == {("queue_depth", "fired"): 1, ("queue_depth", "resolved"): 1}


def test_for_s_waits_before_firing_and_before_resolving() -> None:
    e, _ = engine(rule("oldest_age", 60, for_s=10, clear=30))
    assert states(e, Snapshot(0, (q("a", 1, age=61),))) == []
    assert states(e, Snapshot(5, (q("a", 1, age=66),))) == []
    assert states(e, Snapshot(6, (q("a", 1, age=10),))) == []  # dipped: the wait starts again
    assert states(e, Snapshot(7, (q("a", 1, age=61),))) == []
    assert states(e, Snapshot(17, (q("a", 1, age=71),))) == [("fired", "t/a")]
    assert states(e, Snapshot(18, (q("a", 1, age=20),))) == []
    assert states(e, Snapshot(28, (q("a", 1, age=5),))) == [("resolved", "t/a")]


def test_queue_glob_and_tenant_scope() -> None:
    e, _ = engine(rule("queue_depth", 0, queue="orders-*"))
    snap = Snapshot(1, (q("orders-1", 1), q("billing", 1), q("orders-2", 1, tenant="other")))
    assert states(e, snap) == [("fired", "t/orders-1")]
    assert e.active("other") == [] and len(e.active("t")) == 1


def test_no_consumers_needs_waiting_messages_for_its_threshold() -> None:
    e, _ = engine(rule("no_consumers", 30))
    assert states(e, Snapshot(0, (q("a", 0),))) == []  # nothing waits
    assert states(e, Snapshot(10, (q("a", 3),))) == []
    assert states(e, Snapshot(39, (q("a", 3),))) == []
    assert states(e, Snapshot(40, (q("a", 3),))) == [("fired", "t/a")]
    assert states(e, Snapshot(41, (q("a", 3, consumers=1),))) == [("resolved", "t/a")]


def test_dead_letter_growth_over_the_window() -> None:
    e, history = engine(rule("dlq_growth", 2, queue="dlq", window_s=60))
    assert states(e, Snapshot(0, (q("dlq", 1),)), history) == []
    assert states(e, Snapshot(30, (q("dlq", 3),)), history) == []  # grew by 2: not more than 2
    assert states(e, Snapshot(50, (q("dlq", 4),)), history) == [("fired", "t/dlq")]
    # It stops growing: once the window holds no growth, it resolves.
    assert states(e, Snapshot(100, (q("dlq", 4),)), history) == []
    assert states(e, Snapshot(200, (q("dlq", 4),)), history) == [("resolved", "t/dlq")]


def test_dead_lettered_counts_moves_over_the_window_on_any_queue() -> None:
    # Not a dead-letter queue's depth (dlq_growth): the source queue's own count of moves.
    rates = RateHistory(step_s=1)
    e = AlertEngine(NoStore(), DepthHistory(step_s=1), rates=rates)
    e.rules = [rule("dead_lettered", 2, window_s=60)]

    def at(t: float, dead: int) -> list[tuple[str, str]]:
        snap = Snapshot(t, (QueueSample("t", "orders", 5, 0, 0, None, 0, 10, 0, dead, "orders-dlq", {}),))
        rates.add(t, snap.queues)
        return [(ev.state, ev.subject) for ev in e.evaluate(snap)]

    assert at(0, 40) == []  # forty moved before the gateway started: not counted
    assert at(30, 42) == []  # two in the window: not more than two
    assert at(50, 43) == [("fired", "t/orders")]
    assert at(100, 43) == []  # 50..100 still holds the move at 50
    assert at(120, 43) == [("resolved", "t/orders")]


def test_disk_use_watches_each_nodes_file_system() -> None:
    e, _ = engine(rule("disk_use", 90, tenant="default"))
    full = NodeStorageSample(10, 20, 0.5, disk_free_bytes=5, disk_total_bytes=100)
    roomy = NodeStorageSample(10, 20, 0.5, disk_free_bytes=50, disk_total_bytes=100)
    nodes = (
        NodeSample("n1", "h:1", "up", 0, "leader", 1, 3, 5, storage=full),
        NodeSample("n2", "h:2", "up", 0, "follower", 0, None, None, storage=roomy),
        NodeSample("n3", "h:3", "down", 0, "follower", 0, None, None),  # published nothing
    )
    assert states(e, Snapshot(1, nodes=nodes, cluster=True)) == [("fired", "node/n1")]
    # The embedded store publishes no file system figures: the rule is inert there.
    assert states(e, Snapshot(2)) == [("resolved", "node/n1")]


def test_map_use_and_cluster_kinds() -> None:
    e, _ = engine(
        rule("map_use", 50, tenant="default"),
        rule("node_down", tenant="default"),
        rule("replication_lag", 100, tenant="default"),
    )
    storage = StorageUsage(used_bytes=60, map_size=80, max_map_size=100)
    up = NodeSample("n1", "h:1", "up", 10, "leader", 1, 3, 500)
    down = NodeSample("n2", "h:2", "down", 500, "follower", 0, None, None)
    fired = states(e, Snapshot(1, storage=storage, nodes=(up, down), cluster=True))
    assert sorted(fired) == [("fired", "node/n2"), ("fired", "node/n2"), ("fired", "store")]
    # Embedded mode: no nodes, so node rules see nothing and what fired resolves.
    assert sorted(states(e, Snapshot(2, storage=storage))) == [
        ("resolved", "node/n2"),
        ("resolved", "node/n2"),
    ]


def test_a_deleted_queue_or_rule_resolves_its_alerts() -> None:
    r = rule("queue_depth", 0)
    e, _ = engine(r)
    assert states(e, Snapshot(1, (q("a", 1),))) == [("fired", "t/a")]
    assert states(e, Snapshot(2, ())) == [("resolved", "t/a")]
    assert states(e, Snapshot(3, (q("a", 1),))) == [("fired", "t/a")]
    e.rules = []
    assert states(e, Snapshot(4, (q("a", 1),))) == [("resolved", "t/a")]


def test_rule_validation() -> None:
    ok = parse_rule("t", {"kind": "queue_depth", "threshold": 10, "queue": "orders-*"}, allow_system=False)
    assert (ok.kind, ok.threshold, ok.queue, ok.clear_level) == ("queue_depth", 10.0, "orders-*", 8.0)
    fifo = parse_rule("t", {"kind": "queue_depth", "threshold": 10, "queue": "jobs.fifo"}, allow_system=False)
    assert fifo.queue == "jobs.fifo"  # a queue named as SQS names FIFO queues
    bad: list[dict[str, Any]] = [
        {"kind": "nope", "threshold": 1},
        {"kind": "queue_depth"},
        {"kind": "queue_depth", "threshold": -1},
        {"kind": "queue_depth", "threshold": True},
        {"kind": "queue_depth", "threshold": 5, "clear": 6},
        {"kind": "queue_depth", "threshold": 5, "queue": "bad/name"},
        {"kind": "queue_depth", "threshold": 5, "extra": 1},
        {"kind": "map_use", "threshold": 101},
        {"kind": "disk_use", "threshold": 101},
    ]
    for body in bad:
        with pytest.raises(InvalidRequest):
            parse_rule("t", body, allow_system=True)
    with pytest.raises(InvalidRequest, match="operator"):
        parse_rule("t", {"kind": "map_use", "threshold": 80}, allow_system=False)


def test_an_evaluation_of_thousands_of_queues_pauses_between_turns_and_publishes_at_the_end() -> None:
    """A sample of 10,000 queues evaluated in one go held a gateway's event loop 40-80 ms;
    the engine's listener evaluates a thousand queues a turn (``advancing``), and what the
    console reads (``active``) stays the last finished evaluation's until it ends."""
    e, _ = engine(rule("queue_depth", 100))
    assert states(e, Snapshot(1, (q("a", 101),))) == [("fired", "t/a")]
    snapshot = Snapshot(2, tuple(q(f"q{i:04d}", 101 if i % 1000 == 0 else 0) for i in range(2_500)))
    events: list[Any] = []
    turns = e.advancing(snapshot, events)
    next(turns)
    assert [a.subject for a in e.active()] == ["t/a"]  # paused: nothing published yet
    pauses = 1 + sum(1 for _ in turns)
    assert pauses == 5  # 2,500 queues: after each of three thousands observed, two stepped
    assert sorted((ev.state, ev.subject) for ev in events) == [
        ("fired", "t/q0000"),
        ("fired", "t/q1000"),
        ("fired", "t/q2000"),
        ("resolved", "t/a"),
    ]
    same, _ = engine(rule("queue_depth", 100))
    states(same, Snapshot(1, (q("a", 101),)))
    assert [(ev.state, ev.subject) for ev in same.advance(snapshot)] == [
        (ev.state, ev.subject) for ev in events
    ]
