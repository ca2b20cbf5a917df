"""The monitor's histories and its reading of the cluster document, on hand-made samples.

No server, no clock: each sample carries its time.
"""

from __future__ import annotations

from typing import Any

import pytest

from web_console.monitor import DepthHistory, QueueSample, RateHistory, StorageHistory
from web_console.monitor.cluster_sample import cluster_from_doc


def q(sent: int = 0, delivered: int = 0, acked: int = 0, dead: int = 0, name: str = "a") -> QueueSample:
    return QueueSample("t", name, 0, 0, 0, None, 0, sent, acked, dead, None, {}, delivered_total=delivered)


def test_rates_are_counter_differences_over_each_kept_step() -> None:
    rates = RateHistory(span_s=300, step_s=30)
    rates.add(0, [q()])
    rates.add(10, [q(sent=100)])  # within the step: not kept, but the latest
    [first] = rates.rates("t", "a")
    assert (first.at, first.sent) == (10, 10.0)
    rates.add(30, [q(sent=300, delivered=270, acked=240, dead=30)])
    rates.add(31, [q(sent=301, delivered=271, acked=241, dead=30)])  # half a second later: no spike
    points = rates.rates("t", "a")
    assert [(p.at, p.sent, p.delivered, p.acked, p.dead_lettered) for p in points] == [
        (30, 10.0, 9.0, 8.0, 1.0),
        (31, 1.0, 1.0, 1.0, 0.0),
    ]


def test_rates_keep_an_hour_at_most_and_forget_deleted_queues() -> None:
    rates = RateHistory(span_s=300, step_s=30)
    for i in range(40):
        rates.add(i * 30, [q(sent=i * 60), q(name="b")])
    points = rates.rates("t", "a")
    assert len(points) == 10  # 11 kept points: 10 intervals
    assert {p.sent for p in points} == {2.0}
    assert points[-1].at == 39 * 30
    rates.add(40 * 30, [q(sent=40 * 60)])
    assert rates.rates("t", "b") == []


def test_a_counter_that_went_back_counts_as_zero() -> None:
    rates = RateHistory(step_s=1)
    rates.add(0, [q(sent=50)])
    rates.add(1, [q(sent=3)])  # deleted and made again between samples
    assert rates.rates("t", "a")[0].sent == 0.0


def test_increase_over_a_window_counts_from_when_the_queue_was_first_seen() -> None:
    rates = RateHistory(step_s=30)
    rates.add(0, [q(dead=7)])  # seven dead letters from before: never an increase
    assert rates.increase("t", "a", "dead_lettered", 300, 0) == 0
    rates.add(30, [q(dead=9)])
    assert rates.increase("t", "a", "dead_lettered", 300, 30) == 2
    for t in range(60, 400, 30):
        rates.add(t, [q(dead=9)])
    assert rates.increase("t", "a", "dead_lettered", 300, 390) == 0  # the window is past them
    assert rates.increase("t", "nope", "dead_lettered", 300, 390) == 0


def test_storage_growth_needs_a_minute_and_is_per_hour() -> None:
    stored = StorageHistory(step_s=30)
    stored.add(0, [("n1", 1000), ("n2", 5000)])
    stored.add(30, [("n1", 1500), ("n2", 5000)])
    assert stored.growth_per_hour("n1") is None  # 30 s of history: not told from noise
    stored.add(60, [("n1", 2000), ("n2", 4000)])
    assert stored.growth_per_hour("n1") == pytest.approx(1000 / 60 * 3600)
    assert stored.growth_per_hour("n2") == pytest.approx(-1000 / 60 * 3600)
    stored.add(90, [("n1", 2000)])
    assert stored.points("n2") == []


DOC: dict[str, Any] = {
    "cluster": {"id": "c-1", "trusted": True, "refusal": None},
    "nodes": [
        {"id": "n1", "address": "h:1", "state": "up", "lag": 0, "drain_requested": True},
        {
            "id": "n2",
            "address": "h:2",
            "state": "refused",
            "lag": 40,
            "refusal": "etcd holds cluster c-2",
            "strays": [{"partition": 9, "reason": "the map places this partition elsewhere"}],
        },
        {"id": "n3", "address": "h:3", "state": "up", "lag": 0, "drain_requested": True},
    ],
    "partitions": [
        {
            "id": 1,
            "tenant": "t",
            "queue": "orders",
            "index": 0,
            "leader": "n1",
            "followers": ["n2"],
            "epoch": 5,
            "lsn": 100,
            "mode": "sync",
            "replicas": [{"node": "n1", "lsn": 100}, {"node": "n2", "lsn": 60}],
            # GET /v1/cluster's membership fields when no change is under way.
            "learners": [],
            "leaving": [],
            "successor": None,
        },
        {
            "id": 2,
            "tenant": "t",
            "queue": "orders",
            "index": 1,
            "leader": None,
            "followers": ["n1", "n2"],
            "epoch": 0,
            "lsn": 0,
            "mode": "sync",
            "learners": ["n4"],
            "leaving": [],
            "successor": None,
        },
    ],
}


def test_the_cluster_document_read_into_nodes_partitions_and_identity() -> None:
    sample = cluster_from_doc(DOC)
    assert sample.identity is not None and (sample.identity.id, sample.identity.trusted) == ("c-1", True)
    n1, n2, n3 = sample.nodes
    assert (n1.role, n1.partitions_led, n1.placed, n1.drain_status) == ("leader", 1, 2, "draining")
    assert (n2.healthy, n2.refusal, n2.strays, n2.drain_status) == (
        False,
        "etcd holds cluster c-2",
        1,
        "none",
    )
    assert [(s.partition, s.reason) for s in n2.stray_replicas] == [
        (9, "the map places this partition elsewhere")
    ]
    assert (n3.placed, n3.drain_status) == (0, "drained")
    p1, p2 = sample.partitions
    assert [(r.node, r.role, r.lsn, r.lag) for r in p1.replicas] == [
        ("n1", "leader", 100, 0),
        ("n2", "follower", 60, 40),
    ]
    assert p1.max_lag == 40
    assert p1.extra == ()  # no membership change under way: nothing to say (not "learners: -")
    # No leader (being elected), positions unknown; a role the console does not know yet
    # (learners) is still shown, as a replica with that role and as a field.
    assert p2.leader is None and p2.max_lag is None
    assert [(r.node, r.role) for r in p2.replicas] == [
        ("n1", "follower"),
        ("n2", "follower"),
        ("n4", "learner"),
    ]
    assert p2.extra == (("learners", "n4"),)
    assert cluster_from_doc(None).nodes == ()


def test_adding_pauses_every_thousand_queues_and_drops_the_missing_at_the_end() -> None:
    """The sampler adds thousands of queues to its histories with pauses between, so that a
    gateway's requests run meanwhile; what each history holds in the end is what ``add``
    gives, and a queue gone from the sample is dropped only once all are added."""
    queues = [q(sent=i, name=f"q{i:04d}") for i in range(2_500)]
    depths, rates = DepthHistory(), RateHistory()
    for at in (0, 30):
        depths.add(at, [q(name="gone")])
        rates.add(at, [q(sent=at, name="gone")])
    depth_adding = depths.adding(60, queues)
    assert next(depth_adding) is None  # a pause, after the first thousand
    assert len(depths.points("t", "gone")) == 2
    assert sum(1 for _ in depth_adding) == 1  # and one after the second
    rate_adding = rates.adding(60, queues)
    assert next(rate_adding) is None
    assert len(rates.rates("t", "gone")) == 1
    assert sum(1 for _ in rate_adding) == 1
    assert depths.points("t", "gone") == [] and rates.rates("t", "gone") == []
    assert depths.points("t", "q2499") == [(60, 0)]
    rates.add(90, [q(sent=2_499 + 30, name="q2499")])
    assert [p.sent for p in rates.rates("t", "q2499")] == [1.0]
