"""The manager's membership changes and hand-overs, without etcd (docs/cluster.md,
"Membership changes"): a replica moves through a learner, one voter at a time, never while
the voters that stay lag; leadership moves only to a follower in sync for a while, and only
once the old leader gave its key up; dead replicas are replaced after a delay; a removed
copy gets its tombstone only once the new set committed past it."""

from __future__ import annotations

from dataclasses import replace

from backend_store.cluster.coordination.layout import (
    NodeRecord,
    PartitionRecord,
    ReplicaPosition,
    Tombstone,
)
from backend_store.cluster.manager.plan import ClusterView, PlanSettings

from .plan_runs import SETTINGS, Run, publish

RF3 = {("t", "q"): {"replication_factor": 3}}


def cluster(record: PartitionRecord, nodes: int = 4, **kwargs: object) -> ClusterView:
    v = ClusterView(
        queues=dict(RF3),
        nodes={f"n{i}": NodeRecord("127.0.0.1:1") for i in range(1, nodes + 1)},
        partitions={5: record},
        leaders={5: record.leader or ""},
    )
    for name, value in kwargs.items():
        setattr(v, name, value)
    return v


def one_voter_at_a_time(before: PartitionRecord, after: PartitionRecord) -> None:
    """Consecutive voting sets differ by at most one replica: their majorities overlap."""
    assert len(set(before.replicas) ^ set(after.replicas)) <= 1, (before.replicas, after.replicas)


def step(run: Run, after: float = 0.0) -> PartitionRecord:
    before = run.view.partitions[5]
    run.step(after)
    now = run.view.partitions[5]
    one_voter_at_a_time(before, now)
    return now


def test_a_drained_follower_moves_through_a_learner_one_voter_at_a_time() -> None:
    v = cluster(PartitionRecord("t", "q", 0, ("n1", "n2", "n3"), "n1"), drained={"n2"})
    run = Run(v)
    publish(v)
    assert step(run).learners == ()  # nobody in sync long enough yet
    moving = step(run, after=3.0)
    assert (moving.replicas, moving.learners, moving.leaving) == (("n1", "n2", "n3"), ("n4",), ("n2",))
    publish(v, lagging={"n4"})
    assert step(run, after=1.0) == moving  # the learner is still catching up: n2 stays
    publish(v)
    voting = step(run)
    assert (voting.replicas, voting.learners) == (("n1", "n2", "n3", "n4"), ())
    publish(v, unsettled={5})
    assert step(run) == voting  # the leader has not taken up the four-voter set yet
    publish(v)
    done = step(run)
    assert (done.replicas, done.leaving, done.leader) == (("n1", "n3", "n4"), (), "n1")
    # n2 still holds its copy; it gets its tombstone only once the leader counts by the new
    # set (a majority of which holds everything acknowledged).
    old_copy = {"n2": {5: ReplicaPosition("follower", 3, 10, 3, 3)}}
    publish(v, unsettled={5}, extra=old_copy)
    assert run.step().tombstones == {}
    publish(v, extra=old_copy)
    (tombstone,) = run.step().tombstones.items()
    assert tombstone[0] == (5, "n2") and (tombstone[1].reason, tombstone[1].lsn) == ("moved", 10)
    publish(v)  # n2 deleted its copy
    assert run.step().tombstone_deletes == [(5, "n2")]


def test_a_copy_a_move_left_as_a_stray_gets_its_tombstone_and_keeps_it_until_deleted() -> None:
    # A node stops serving a copy the map no longer names and reports it as a stray, with no
    # position: the tombstone's LSN (the leader's committed) bounds what it may delete, and
    # the tombstone stays while the stray is reported (found by tests/cluster/test_failover.py
    # under load: a tombstone dropped because the copy was not among the node's replicas).
    v = cluster(PartitionRecord("t", "q", 0, ("n1", "n3", "n4"), "n1"))
    run = Run(v)
    stray = {"n2": {5: "the map places this partition on n1, n3, n4, not here; no tombstone"}}
    publish(v, unsettled={5}, strays=stray)
    assert run.step().tombstones == {}  # the leader does not count by the new set yet
    publish(v, strays=stray)
    (tombstone,) = run.step().tombstones.items()
    assert tombstone[0] == (5, "n2") and (tombstone[1].reason, tombstone[1].lsn) == ("moved", 10)
    publish(v, strays=stray)
    assert run.step().tombstone_deletes == []  # n2 has not deleted its copy yet
    publish(v)
    assert run.step().tombstone_deletes == [(5, "n2")]


def test_a_deleted_queue_tombstones_its_stray_copies_until_they_are_gone() -> None:
    v = cluster(PartitionRecord("t", "q", 0, ("n1", "n3", "n4"), "n1"))
    run = Run(v)
    stray = {"n2": {5: "the map places this partition on n1, n3, n4, not here; no tombstone"}}
    publish(v, strays=stray)
    run.step()
    v.queues = {}
    plan = run.step()
    assert plan.deletes == [5]
    assert sorted(plan.tombstones) == [(5, "n1"), (5, "n2"), (5, "n3"), (5, "n4")]
    assert {t.reason for t in plan.tombstones.values()} == {"partition_deleted"}
    publish(v, strays=stray)
    assert (5, "n2") not in run.step().tombstone_deletes  # still held: the tombstone stays


def test_a_move_is_refused_while_a_voter_that_stays_lags() -> None:
    # Issue 24, defect 2: n3 is cut off and lags; draining n2 must not leave the partition
    # on (n1, n3, n4) with n2's acknowledged entries on n1 alone.
    v = cluster(PartitionRecord("t", "q", 0, ("n1", "n2", "n3"), "n1"), drained={"n2"})
    run = Run(v)
    publish(v, lagging={"n3"})
    for _ in range(5):
        assert step(run, after=10.0).learners == ()
    publish(v)  # n3 caught up: in sync for settle_s, then the move starts
    assert step(run).learners == ()
    assert step(run, after=3.0).learners == ("n4",)


def test_a_drained_leader_hands_over_to_an_in_sync_follower_before_its_replica_moves() -> None:
    # Issue 24, defect 3: the next plan must not remove the drained leader while it still
    # holds the key, nor name a successor that lags.
    v = cluster(PartitionRecord("t", "q", 0, ("n1", "n2", "n3"), "n1"), drained={"n1"})
    run = Run(v)
    publish(v, lagging={"n2"})
    assert step(run).successor is None
    asked = step(run, after=3.0)
    assert (asked.successor, asked.leader, asked.replicas, asked.learners) == (
        "n3",
        "n1",
        ("n1", "n2", "n3"),
        (),
    )
    assert step(run, after=1.0) == asked  # waiting for n1 to hand over: nothing else moves
    # n1 gave its key up, vouching for its whole log, which n3 holds; n2 lags.
    del v.leaders[5]
    v.nodes = {
        "n1": NodeRecord("a", "up", {5: ReplicaPosition("resigned", 3, 10, 3, 0)}),
        "n2": NodeRecord("a", "up", {5: ReplicaPosition("follower", 3, 6, 3, 0)}),
        "n3": NodeRecord("a", "up", {5: ReplicaPosition("follower", 3, 10, 3, 0)}),
        "n4": NodeRecord("a"),
    }
    handed = step(run)
    assert (handed.leader, handed.successor, handed.replicas) == ("n3", None, ("n1", "n2", "n3"))
    v.leaders[5] = "n3"
    publish(v, lagging={"n2"})
    assert step(run, after=10.0).learners == ()  # n2 lags: n1's replica stays for now
    publish(v)
    step(run)
    moving = step(run, after=3.0)
    assert (moving.learners, moving.leaving) == (("n4",), ("n1",))


def test_no_successor_that_just_caught_up_or_is_out_of_sync() -> None:
    # Issue 24, defect 7: leadership went to a node 0.1 s after it had resigned for lack of
    # a quorum. A successor must have been in the leader's sync set for settle_s.
    v = cluster(PartitionRecord("t", "q", 0, ("n1", "n2", "n3"), "n1"), nodes=3, drained={"n1"})
    run = Run(v)
    publish(v, lagging={"n2", "n3"})
    assert step(run, after=10.0).successor is None
    publish(v, lagging={"n3"})  # n2 back in sync just now
    assert step(run).successor is None
    assert step(run, after=2.0).successor is None
    assert step(run, after=1.5).successor == "n2"


def test_a_hand_over_that_does_not_finish_is_withdrawn_and_another_successor_tried() -> None:
    v = cluster(PartitionRecord("t", "q", 0, ("n1", "n2", "n3"), "n1"), nodes=3, drained={"n1"})
    run = Run(v)
    publish(v)
    step(run)
    first = step(run, after=3.0).successor
    assert first in ("n2", "n3")
    other = "n3" if first == "n2" else "n2"
    assert step(run, after=4.0).successor == first
    assert step(run, after=2.0).successor is None  # not done in handover_timeout_s
    assert step(run).successor == other  # the one passed over is not tried again at once
    # A successor that falls out of sync is withdrawn at once.
    publish(v, lagging={other})
    assert step(run).successor is None


def test_the_successor_is_designated_once_the_old_leader_gave_its_key_up() -> None:
    record = PartitionRecord("t", "q", 0, ("n1", "n2", "n3"), "n1", successor="n3")
    v = cluster(record, nodes=3, leaders={})
    v.nodes = {
        "n1": NodeRecord("a", "up", {5: ReplicaPosition("resigned", 3, 10, 3, 0)}),
        "n2": NodeRecord("a", "up", {5: ReplicaPosition("follower", 3, 10, 3, 0)}),
        "n3": NodeRecord("a", "up", {5: ReplicaPosition("follower", 3, 10, 3, 0)}),
    }
    run = Run(v)
    assert run.plan().puts[5].leader == "n3"  # n2 is as up to date; the successor wins the tie
    # A successor behind what the old leader vouches for is not designated: the old leader
    # keeps the designation (and campaigns again), the request is dropped.
    v.nodes["n3"] = NodeRecord("a", "up", {5: ReplicaPosition("follower", 3, 9, 3, 0)})
    v.nodes["n2"] = NodeRecord("a", "up", {5: ReplicaPosition("follower", 3, 9, 3, 0)})
    kept = run.plan().puts[5]
    assert (kept.leader, kept.successor) == ("n1", None)


def test_a_learner_neither_counts_for_a_promotion_nor_leads() -> None:
    record = PartitionRecord("t", "q", 0, ("n1", "n2", "n3"), "n1", learners=("n4",), leaving=("n3",))
    v = cluster(record, leaders={})
    v.nodes = {  # n1 and n3 are dead; n4 is as up to date as n2
        "n2": NodeRecord("a", "up", {5: ReplicaPosition("follower", 3, 10, 3, 0)}),
        "n4": NodeRecord("a", "up", {5: ReplicaPosition("follower", 3, 11, 3, 0)}),
    }
    assert Run(v).plan().puts == {}  # one fresh voter of three is no majority


def test_dead_replicas_are_replaced_after_the_delay_and_never_with_0() -> None:
    v = cluster(PartitionRecord("t", "q", 0, ("n1", "n2", "n3"), "n1"))
    run = Run(v)
    publish(v, dead={"n3"})
    assert step(run, after=3.0).learners == ()
    assert step(run, after=290.0).learners == ()
    moving = step(run, after=10.0)
    assert (moving.learners, moving.leaving) == (("n4",), ("n3",))
    publish(v, dead={"n3"})
    assert step(run).replicas == ("n1", "n2", "n3", "n4")
    publish(v, dead={"n3"})
    assert step(run).replicas == ("n1", "n2", "n4")
    # n3 comes back with its old copy: kept until the new set committed past it, then
    # tombstoned (its copy is no further than what the new set holds).
    publish(v, extra={"n3": {5: ReplicaPosition("follower", 3, 12, 3, 3)}})
    assert run.step().tombstones == {}
    publish(v, extra={"n3": {5: ReplicaPosition("follower", 3, 8, 3, 3)}})
    assert list(run.step().tombstones) == [(5, "n3")]

    never = cluster(PartitionRecord("t", "q", 0, ("n1", "n2", "n3"), "n1"))
    off = Run(never, PlanSettings(settle_s=3.0, replace_after_s=0.0))
    publish(never, dead={"n3"})
    for _ in range(3):
        assert off.step(after=1000.0).puts == {}


def test_a_node_added_back_loses_its_tombstone_in_the_same_step() -> None:
    record = PartitionRecord("t", "q", 0, ("n1", "n2", "n3"), "n1")
    v = cluster(record, drained={"n3"})
    run = Run(v)
    v.tombstones = {(5, "n4"): Tombstone(5, "n4", "moved", 10)}
    publish(v, extra={"n4": {5: ReplicaPosition("follower", 3, 10, 3, 3)}})
    run.step()
    out = run.step(after=3.0)
    assert out.puts[5].learners == ("n4",) and out.tombstone_deletes == [(5, "n4")]


def test_the_designation_follows_a_serving_key_holder() -> None:
    # A campaign that raced a designation: n2 won a fenced term; the record names n1.
    v = cluster(PartitionRecord("t", "q", 0, ("n1", "n2", "n3"), "n1"), nodes=3, leaders={5: "n2"})
    publish(v)
    assert Run(v).plan().puts[5].leader == "n2"


def test_a_joining_node_receives_replicas_then_leadership_one_step_at_a_time() -> None:
    records = {
        1: PartitionRecord("t", "a", 0, ("n1", "n2"), "n1"),
        2: PartitionRecord("t", "b", 0, ("n2", "n1"), "n2"),
        3: PartitionRecord("t", "c", 0, ("n1", "n2"), "n1"),
    }
    v = ClusterView(
        queues={("t", q): {"replication_factor": 2} for q in "abc"},
        nodes={n: NodeRecord("a") for n in ("n1", "n2", "n3")},
        partitions=dict(records),
        leaders={1: "n1", 2: "n2", 3: "n1"},
    )
    assert Run(v, PlanSettings(rebalance=False, settle_s=0)).plan().puts == {}
    run = Run(v, SETTINGS)
    for _ in range(60):
        publish(v)
        before = dict(v.partitions)
        out = run.step(after=1.0)
        assert len(out.puts) <= 1
        for pid, record in out.puts.items():
            one_voter_at_a_time(before[pid], record)
            assert record.learners == () or record.leader == before[pid].leader
        if record_done(v):
            break
        # A hand-over completes as the nodes would: the key moves to the successor.
        for pid, record in list(v.partitions.items()):
            if record.successor is not None:
                v.partitions[pid] = replace(record, leader=record.successor, successor=None)
                v.leaders[pid] = record.successor
    assert record_done(v), v.partitions


def record_done(v: ClusterView) -> bool:
    loads = [sum(n in r.replicas for r in v.partitions.values()) for n in ("n1", "n2", "n3")]
    leaders = sorted(str(r.leader) for r in v.partitions.values())
    return loads == [2, 2, 2] and leaders == ["n1", "n2", "n3"]


def test_no_rebalancing_while_a_replica_is_out_of_sync_or_a_leader_is_missing() -> None:
    records = {
        1: PartitionRecord("t", "a", 0, ("n1", "n2"), "n1"),
        2: PartitionRecord("t", "b", 0, ("n1", "n2"), "n1"),
    }
    queues = {("t", q): {"replication_factor": 2} for q in "ab"}
    behind = ClusterView(
        queues=queues,
        nodes={n: NodeRecord("a") for n in ("n1", "n2", "n3")},
        partitions=dict(records),
        leaders={1: "n1", 2: "n1"},
    )
    run = Run(behind)
    publish(behind, lagging={"n2"})
    assert run.step(after=10.0).puts == {}
    leaderless = ClusterView(
        queues=queues,
        nodes={n: NodeRecord("a") for n in ("n1", "n2", "n3")},
        partitions=dict(records),
        leaders={1: "n1"},
    )
    run = Run(leaderless)
    publish(leaderless)
    assert run.step(after=10.0).puts == {}


def test_a_drained_single_replica_moves_through_a_learner_that_then_leads() -> None:
    # RF 1: nobody to hand over to. A learner joins, votes, takes leadership, and only then
    # does the drained replica leave.
    v = ClusterView(
        queues={("t", "q"): {"replication_factor": 1}},
        nodes={n: NodeRecord("a") for n in ("n1", "n2")},
        partitions={5: PartitionRecord("t", "q", 0, ("n1",), "n1")},
        leaders={5: "n1"},
        drained={"n1"},
    )
    run = Run(v)
    publish(v)
    step(run)
    moving = step(run, after=3.0)
    assert (moving.learners, moving.leaving) == (("n2",), ("n1",))
    publish(v)
    assert step(run).replicas == ("n1", "n2")
    publish(v)
    assert step(run).successor is None  # n2 in sync only just now
    asked = step(run, after=3.0)
    assert (asked.leader, asked.successor, asked.replicas) == ("n1", "n2", ("n1", "n2"))
    # n1 hands over: its key goes, n2 is designated, then n1 leaves the voters.
    del v.leaders[5]
    v.nodes = {
        "n1": NodeRecord("a", "up", {5: ReplicaPosition("resigned", 3, 10, 3, 0)}),
        "n2": NodeRecord("a", "up", {5: ReplicaPosition("follower", 3, 10, 3, 0)}),
    }
    assert step(run).leader == "n2"
    v.leaders[5] = "n2"
    publish(v)
    done = step(run)
    assert (done.replicas, done.leader, done.leaving) == (("n2",), "n2", ())
