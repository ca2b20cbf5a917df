"""The manager's planning, without etcd: placement, promotion (of a dead or a resigned
leader), deletion, growth; and the ``pushgate node`` / ``pushgate manager`` commands' help.
Membership changes, hand-overs, replacement and tombstones: test_manager_membership.py."""

from __future__ import annotations

from dataclasses import replace

import pytest

from backend_store.cluster.coordination.layout import NodeRecord, PartitionRecord, ReplicaPosition, unpack
from backend_store.cluster.manager.plan import ClusterView, plan
from backend_store.types import make_epoch
from gateway.cli import main

from .plan_runs import Run, publish


def node(state: str = "up", leader_epoch: int = 0, **positions: tuple[int, int]) -> NodeRecord:
    """A node record; ``p7=(last_epoch, lsn)`` publishes its replica of partition 7, seeing a
    leader key of ``leader_epoch`` (0: it saw the key vanish)."""
    replicas = {
        int(k[1:]): ReplicaPosition("follower", e, lsn, e, leader_epoch) for k, (e, lsn) in positions.items()
    }
    return NodeRecord("127.0.0.1:1", state, replicas)


def view(**kwargs: object) -> ClusterView:
    v = ClusterView()
    for name, value in kwargs.items():
        setattr(v, name, value)
    return v


def test_new_queues_get_partitions_on_the_least_loaded_live_nodes() -> None:
    v = view(
        queues={
            ("t", "a"): {"partitions": 2, "replication_factor": 2},
            ("t", "b"): {"replication_mode": "async"},
        },
        nodes={"n1": node(), "n2": node(), "n3": node(), "n4": node("draining")},
        counter=10,
    )
    out = plan(v)
    assert out.counter == 13 and sorted(out.puts) == [11, 12, 13]
    records = sorted(out.puts.values(), key=lambda r: (r.queue, r.index))
    a0, a1, b0 = records
    assert (a0.index, a1.index, b0.index) == (0, 1, 0)
    assert all(len(r.replicas) == 2 for r in (a0, a1)) and len(b0.replicas) == 1
    assert b0.mode == "async" and a0.mode == "sync"
    # Spread: five replicas over three up nodes (never the draining one), at most two each.
    placed = [n for r in records for n in r.replicas]
    assert "n4" not in placed and max(placed.count(n) for n in ("n1", "n2", "n3")) == 2
    assert all(r.leader == r.replicas[0] for r in records)


def test_a_dead_leader_is_replaced_by_the_most_up_to_date_replica_on_fresh_positions() -> None:
    record = PartitionRecord("t", "q", 0, ("n1", "n2", "n3"), "n1")
    v = view(
        queues={("t", "q"): {"replication_factor": 3}},
        # n1 is gone (its key too); n3 has the longer log of the newest term.
        nodes={"n2": node(leader_epoch=7, p5=(7, 40)), "n3": node(leader_epoch=7, p5=(7, 42))},
        partitions={5: record},
        counter=5,
    )
    # Positions published while the old leader's key still lived may be stale: wait.
    assert plan(v).puts == {}
    v.nodes["n2"] = node(p5=(7, 40))
    assert plan(v).puts == {}  # one fresh position of three is no majority
    v.nodes["n3"] = node(p5=(7, 42))
    promoted = plan(v).puts[5]
    assert promoted.leader == "n3" and promoted.replicas == ("n1", "n2", "n3")


def test_the_newest_term_beats_a_longer_log_of_an_older_term() -> None:
    # n2 holds a deposed leader's unacknowledged tail (epoch 6); n3 has the epoch-7 entries.
    record = PartitionRecord("t", "q", 0, ("n1", "n2", "n3"), "n1")
    v = view(
        queues={("t", "q"): {"replication_factor": 3}},
        nodes={"n2": node(p5=(6, 50)), "n3": node(p5=(7, 45))},
        partitions={5: record},
    )
    assert plan(v).puts[5].leader == "n3"


def test_no_promotion_without_a_majority_of_live_replicas() -> None:
    # Only n3 is left of three: it may lack an acknowledged write that n2 held.
    record = PartitionRecord("t", "q", 0, ("n1", "n2", "n3"), "n1")
    v = view(
        queues={("t", "q"): {"replication_factor": 3}}, nodes={"n3": node(p5=(7, 45))}, partitions={5: record}
    )
    assert plan(v).puts == {}


def test_a_live_leader_without_its_key_yet_is_left_alone() -> None:
    record = PartitionRecord("t", "q", 0, ("n1", "n2"), "n1")
    v = view(
        queues={("t", "q"): {"replication_factor": 2}},
        nodes={"n1": node(p5=(1, 1)), "n2": node(p5=(1, 9))},
        partitions={5: record},
    )
    assert plan(v).puts == {}


def resigned(leader_epoch: int = 0, on: int | None = None, **positions: tuple[int, int]) -> NodeRecord:
    """A node whose replicas resigned leadership for lack of a quorum (check-quorum), each
    publishing the position it vouches for and the designation ``on`` it resigned under
    (None: a node of a version that did not publish it)."""
    replicas = {
        int(k[1:]): ReplicaPosition("resigned", e, lsn, e, leader_epoch, resigned_on=on)
        for k, (e, lsn) in positions.items()
    }
    return NodeRecord("127.0.0.1:1", "up", replicas)


def test_a_leader_that_resigned_for_lack_of_a_quorum_is_replaced_on_fresh_positions() -> None:
    # n1 is alive (its node record stands) but resigned: it vouches for LSN 40 of epoch 7,
    # n3 holds more of its term than that.
    record = PartitionRecord("t", "q", 0, ("n1", "n2", "n3"), "n1")
    v = view(
        queues={("t", "q"): {"replication_factor": 3}},
        nodes={"n1": resigned(p5=(7, 40)), "n2": node(leader_epoch=7, p5=(7, 38))},
        partitions={5: record},
    )
    # n1's key is gone but n2's position predates that: one fresh of three is no majority.
    assert plan(v).puts == {}
    v.nodes["n3"] = node(p5=(7, 41))
    promoted = plan(v).puts[5]
    assert promoted.leader == "n3" and promoted.replicas == ("n1", "n2", "n3")


def test_a_resigned_leader_loses_a_tie() -> None:
    # n3 resigned, vouching for exactly what the followers hold: a follower leads (by node id
    # alone n3 would win the tie and be designated again).
    record = PartitionRecord("t", "q", 0, ("n3", "n1", "n2"), "n3")
    v = view(
        queues={("t", "q"): {"replication_factor": 3}},
        nodes={"n1": node(p5=(7, 40)), "n2": node(p5=(7, 40)), "n3": resigned(p5=(7, 40))},
        partitions={5: record},
    )
    assert plan(v).puts[5].leader == "n2"


def test_a_resigned_leader_holding_more_than_the_others_stays_designated() -> None:
    # n2 is behind what n1 vouches for (it may lack an acknowledged write) and n3 is dead:
    # nobody else may lead, so n1 stays designated, designated anew (the record's
    # designation moves: a replica that resigned because its designation looked stale waits
    # for exactly that), and campaigns again.
    record = PartitionRecord("t", "q", 0, ("n1", "n2", "n3"), "n1", designation=4)
    v = view(
        queues={("t", "q"): {"replication_factor": 3}},
        nodes={"n1": resigned(p5=(7, 40)), "n2": node(p5=(7, 35))},
        partitions={5: record},
    )
    assert plan(v).puts == {5: replace(record, designation=5)}


def test_a_resigned_leader_is_designated_anew_once_per_resignation() -> None:
    # n1 resigned under designation 4 and holds off for what a designation cannot end (a
    # majority of the voters not registered yet, say): designating it at every plan only
    # wrote to etcd (3,166 designations in 18 s of simulation seed ``pools`` 1732544).
    record = PartitionRecord("t", "q", 0, ("n1", "n2", "n3"), "n1", designation=4)
    v = view(
        queues={("t", "q"): {"replication_factor": 3}},
        nodes={"n1": resigned(on=4, p5=(7, 40)), "n2": node(p5=(7, 35))},
        partitions={5: record},
    )
    again = plan(v).puts[5]
    assert again == replace(record, designation=5)
    v.partitions = {5: again}
    assert plan(v).puts == {}  # still published as resigned under 4: designated already
    # It campaigned on 5 and resigned again (its fence refused the epoch it won, say).
    v.nodes["n1"] = resigned(on=5, p5=(7, 40))
    assert plan(v).puts == {5: replace(record, designation=6)}
    # A restore took the record back before the resignation: designated anew once more.
    v.partitions = {5: replace(record, designation=3)}
    assert plan(v).puts == {5: replace(record, designation=4)}
    # Published and read back; a node of an earlier version does not say which designation:
    # designated at every plan, as before.
    assert NodeRecord.unpack(v.nodes["n1"].pack()) == v.nodes["n1"]
    v.nodes["n1"] = resigned(p5=(7, 40))
    assert "resigned_on" not in unpack(v.nodes["n1"].pack())["replicas"]["5"]
    v.partitions = {5: again}
    assert plan(v).puts == {5: replace(record, designation=6)}


def test_a_resigned_leader_is_not_designated_again_over_a_live_voter_ahead_of_it() -> None:
    # node/leadership.py, rule 9: n1 resigned because n3 publishes a copy ending in a later
    # term (epoch 9). n3's position predates the key's end (it still saw epoch 9's key), so
    # n1 is the best fresh one; designated again, it would resign again, for ever.
    record = PartitionRecord("t", "q", 0, ("n1", "n2", "n3"), "n1", designation=4)
    v = view(
        queues={("t", "q"): {"replication_factor": 3}},
        nodes={"n1": resigned(p5=(7, 40)), "n2": node(p5=(7, 35)), "n3": node(leader_epoch=9, p5=(9, 41))},
        partitions={5: record},
    )
    assert plan(v).puts == {}  # waits for n3
    v.nodes["n3"] = node(p5=(9, 41))
    assert plan(v).puts[5] == replace(record, leader="n3", designation=5)


def test_a_live_leader_that_did_not_resign_is_not_replaced() -> None:
    # Its key is gone (a lost session, say) but it did not resign: it campaigns again itself.
    record = PartitionRecord("t", "q", 0, ("n1", "n2", "n3"), "n1")
    v = view(
        queues={("t", "q"): {"replication_factor": 3}},
        nodes={"n1": node(p5=(7, 40)), "n2": node(p5=(7, 45)), "n3": node(p5=(7, 45))},
        partitions={5: record},
    )
    assert plan(v).puts == {}


def test_a_live_leader_that_reports_its_copy_as_a_stray_is_replaced_on_fresh_positions() -> None:
    # n1 is up but cannot open its copy (a damaged file, a full disk): it will not campaign.
    # Left designated, the partition waited for it for as long as it was up (session 46).
    record = PartitionRecord("t", "q", 0, ("n1", "n2", "n3"), "n1")
    cannot = NodeRecord(
        "127.0.0.1:1", strays={5: "cannot be opened here: [Errno 28] No space left on device"}
    )
    v = view(
        queues={("t", "q"): {"replication_factor": 3}},
        nodes={"n1": cannot, "n2": node(p5=(7, 40)), "n3": node(p5=(7, 45))},
        partitions={5: record},
    )
    promoted = plan(v).puts[5]
    assert promoted.leader == "n3" and promoted.replicas == ("n1", "n2", "n3")
    # Only with a majority of fresh positions, as for a dead leader.
    del v.nodes["n3"]
    assert plan(v).puts == {}


def test_a_leader_that_lost_its_key_during_a_hand_over_is_replaced_on_fresh_positions() -> None:
    # Asked to hand over to n3, n1 was killed and is back (its node record stands, its key is
    # gone). Left to campaign, it would lead only to hand over at once: n3 is promoted.
    record = PartitionRecord("t", "q", 0, ("n1", "n2", "n3"), "n1", successor="n3")
    v = view(
        queues={("t", "q"): {"replication_factor": 3}},
        nodes={
            "n1": node(p5=(7, 40)),
            "n2": node(leader_epoch=7, p5=(7, 40)),
            "n3": node(leader_epoch=7, p5=(7, 40)),
        },
        partitions={5: record},
    )
    assert plan(v).puts == {}  # one fresh position of three (n1's): no majority yet
    v.nodes["n3"] = node(p5=(7, 40))
    promoted = plan(v).puts[5]
    assert (promoted.leader, promoted.successor) == ("n3", None)
    # A leader holding more than the others stays designated (and is asked to hand over anew).
    v.nodes["n1"] = node(p5=(7, 41))
    again = plan(v).puts[5]
    assert (again.leader, again.successor, again.designation) == ("n1", None, record.designation + 1)


def test_partitions_of_deleted_queues_and_past_a_lowered_count_are_deleted() -> None:
    v = view(
        queues={("t", "kept"): {"partitions": 1}},
        nodes={"n1": node()},
        partitions={
            1: PartitionRecord("t", "kept", 0, ("n1",), "n1"),
            2: PartitionRecord("t", "kept", 1, ("n1",), "n1"),
            3: PartitionRecord("t", "gone", 0, ("n1",), "n1"),
        },
        leaders={1: "n1", 2: "n1", 3: "n1"},
    )
    publish(v)
    out = plan(v)
    assert sorted(out.deletes) == [2, 3] and out.puts == {}
    # Each member of a deleted partition gets its leave to delete the copy.
    assert sorted(out.tombstones) == [(2, "n1"), (3, "n1")]
    assert {(t.reason, t.lsn, t.queue) for t in out.tombstones.values()} == {
        ("partition_deleted", None, "kept"),
        ("partition_deleted", None, "gone"),
    }
    # Once the node dropped the copy, the tombstone goes too.
    v.partitions = {1: v.partitions[1]}
    v.leaders = {1: "n1"}
    v.tombstones = dict(out.tombstones)
    publish(v)
    assert sorted(plan(v).tombstone_deletes) == [(2, "n1"), (3, "n1")]


def test_a_queue_created_again_under_its_name_gets_new_partitions() -> None:
    # Deleted and created again before the manager saw it go: etcd holds a record of a new
    # create_revision, and the partitions made for the old one must not serve it.
    v = view(
        queues={("t", "q"): {"partitions": 1}, ("t", "kept"): {"partitions": 1}},
        queue_revisions={("t", "q"): 20, ("t", "kept"): 5},
        nodes={"n1": node(), "n2": node()},
        partitions={
            1: PartitionRecord("t", "q", 0, ("n1",), "n1", queue_revision=10),
            2: PartitionRecord("t", "kept", 0, ("n2",), "n2", queue_revision=None),
        },
        leaders={1: "n1", 2: "n2"},
        counter=2,
    )
    out = plan(v)
    assert out.deletes == [1]
    assert list(out.puts) == [3] and out.puts[3].queue_revision == 20 and out.puts[3].index == 0
    # The new partition is the current incarnation's: kept as it is.
    v.partitions = {3: out.puts[3], 2: v.partitions[2]}
    v.leaders, v.counter = {2: "n2", 3: out.puts[3].leader or ""}, 3
    again = plan(v)
    assert again.deletes == [] and again.puts == {}


def test_a_set_placed_on_too_few_nodes_grows_one_voter_at_a_time() -> None:
    record = PartitionRecord("t", "q", 0, ("n1",), "n1")
    v = view(
        queues={("t", "q"): {"replication_factor": 3}},
        nodes={"n1": node(), "n2": node(), "n3": node()},
        partitions={5: record},
        leaders={5: "n1"},
    )
    run = Run(v)
    publish(v)
    assert run.step().puts == {}  # n2 and n3 only just registered: not yet
    grown = run.step(after=3.0).puts[5]
    # A learner first, never a voter that has yet to catch up.
    assert grown.replicas == ("n1",) and grown.learners == ("n2",) and grown.leader == "n1"
    publish(v, lagging={"n2"})
    assert run.step(after=1.0).puts == {}  # still catching up
    publish(v)
    assert run.step().puts[5].replicas == ("n1", "n2")
    publish(v, unsettled={5})  # the leader has not taken up the two-voter set yet
    assert run.step().puts == {}
    publish(v)
    # From two voters a third leaves the majority at two: it votes at once.
    final = run.step().puts[5]
    assert final.replicas == ("n1", "n2", "n3") and final.learners == ()


def test_a_node_back_from_a_restart_votes_at_once_in_a_set_placed_on_the_two_others() -> None:
    # Issue 48, item 2: a queue created while n3 was restarting was placed on n1 and n2.
    # While it has two voters, its leader's failure leaves n2 alone, no majority, and nobody
    # can be promoted; the returning n3 joins as a voter as soon as it is up (the majority
    # stays two), not after settling and a learner's catch-up (about 9 s).
    record = PartitionRecord("t", "q", 0, ("n1", "n2"), "n1")
    v = view(
        queues={("t", "q"): {"replication_factor": 3}},
        nodes={"n1": node(), "n2": node()},
        partitions={5: record},
        leaders={5: "n1"},
    )
    run = Run(v)
    publish(v)
    assert run.step().puts == {}  # no third node: nothing to add
    v.nodes["n3"] = node()
    grown = run.step(after=0.1).puts[5]
    assert grown.replicas == ("n1", "n2", "n3") and grown.learners == () and grown.leader == "n1"


def test_a_queue_waits_settle_s_for_as_many_nodes_as_its_replication_factor() -> None:
    # A cluster starting: two of three nodes have registered when the queue is planned.
    v = view(queues={("t", "q"): {"replication_factor": 3}}, nodes={"n1": node(), "n2": node()})
    run = Run(v)
    assert (
        run.step().puts == {}
    )  # the third may be a moment away: a short set loses its majority to one failure
    v.nodes["n3"] = node()
    placed = run.step(after=0.1).puts
    assert [sorted(r.replicas) for r in placed.values()] == [["n1", "n2", "n3"]]


def test_a_queue_with_too_few_nodes_for_it_is_placed_short_after_settle_s() -> None:
    v = view(queues={("t", "q"): {"replication_factor": 3}}, nodes={"n1": node(), "n2": node()})
    run = Run(v)
    assert run.step().puts == {}
    assert run.step(after=2.9).puts == {}
    placed = run.step(after=0.1).puts  # settle_s (3 s) without a third node: the set grows later
    assert [sorted(r.replicas) for r in placed.values()] == [["n1", "n2"]]


def test_new_partitions_spread_their_leaders_too() -> None:
    v = view(
        queues={("t", f"q{i}"): {"replication_factor": 2} for i in range(3)},
        nodes={"n1": node(), "n2": node(), "n3": node()},
    )
    records = list(plan(v).puts.values())
    assert sorted(str(r.leader) for r in records) == ["n1", "n2", "n3"]
    assert all(r.leader == r.replicas[0] for r in records)


def test_the_commands_are_listed_and_documented(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    assert "node" in capsys.readouterr().out
    for command in ("node", "manager"):
        with pytest.raises(SystemExit) as done:
            main([command, "--help"])
        assert done.value.code == 0
        assert "--etcd" in capsys.readouterr().out


def test_after_etcd_went_back_a_stray_ahead_of_every_replica_leads_again() -> None:
    # Simulation seed ``all`` 21263: a drain moved p5 from n3 to n1 and n3 deleted its copy;
    # etcd was restored from before the move, so the record names n3 again (a fresh, empty
    # copy) and not n1, whose stray holds the acknowledged entries 32-42; n4 was cut off at 31.
    record = PartitionRecord("t", "q", 0, ("n2", "n3", "n4"), "n2", designated_in=0)
    v = view(
        queues={("t", "q"): {"replication_factor": 3}},
        nodes={
            "n1": replace(
                node(), strays={5: "the map places this partition on n2, n3, n4"}, stray_ranks={5: (18, 42)}
            ),
            "n3": node(p5=(0, 0)),
            "n4": node(p5=(18, 31)),
        },
        partitions={5: record},
        incarnation=1,
        incarnation_revision=100,  # the raise; every record here was published since
        node_revisions={"n1": 101, "n3": 102, "n4": 103},
    )
    promoted = plan(v).puts[5]
    assert promoted.leader == "n1"
    assert promoted.replicas == ("n2", "n3", "n4", "n1")
    assert promoted.leaving == ("n2",)  # gone: it leaves once the new set has settled
    assert promoted.designated_in == 1
    # Designated again in this incarnation, but no term of it has written an entry yet (n4
    # froze before it led: simulation seed ``all`` 100400): the set is still the snapshot's,
    # so every copy still counts.
    v.partitions[5] = replace(record, designated_in=1)
    assert plan(v).puts[5].leader == "n1"
    # Once a term of this incarnation has written an entry a majority holds, strays are no
    # candidates (a copy a finished move left behind may hold an unacknowledged tail; a
    # majority of the current voters holds every acknowledged write).
    v.nodes["n4"] = node(p5=(make_epoch(1, 120), 43))
    assert plan(v).puts[5].leader == "n4"
    v.nodes["n4"] = node(p5=(18, 31))
    # Nor is a stray behind the best replica.
    v.partitions[5] = record
    v.nodes["n1"] = replace(v.nodes["n1"], stray_ranks={5: (18, 30)})
    assert plan(v).puts[5].leader == "n4"


def test_a_hand_over_waits_for_its_successor_rather_than_take_whoever_published_first() -> None:
    # Simulation seed ``minority`` 40624: n1 handed p5 over to n3 and gave its key up; n2,
    # as up to date but cut off from its peers, published first and won the tie.
    record = PartitionRecord("t", "q", 0, ("n1", "n2", "n3"), "n1", successor="n3")
    v = view(
        queues={("t", "q"): {"replication_factor": 3}},
        nodes={"n1": resigned(p5=(7, 40)), "n2": node(p5=(7, 40)), "n3": node(leader_epoch=7, p5=(7, 40))},
        partitions={5: record},
    )
    assert plan(v).puts == {}  # the successor has yet to see the key vanish
    v.nodes["n3"] = node(p5=(7, 40))
    assert plan(v).puts[5].leader == "n3"
    # A successor that died (its node record gone) is not waited for.
    del v.nodes["n3"]
    assert plan(v).puts[5].leader == "n2"


def test_after_etcd_went_back_every_copy_counts_fresh_or_not_named_or_not() -> None:
    # Simulation seed ``all`` 51423: etcd restored to a map naming n4, n1, n2 for p5. n1's
    # position (epoch 44) and n4's (behind by 3) were fresh, n2's (the newest) not yet, and
    # n3, a voter of the set the restore undid, still served the newest copy.
    record = PartitionRecord("t", "q", 0, ("n4", "n1", "n2"), "n1", designated_in=0)
    v = view(
        queues={("t", "q"): {"replication_factor": 3}},
        nodes={
            "n1": node(p5=(44, 34)),
            "n2": node(leader_epoch=44, p5=(132, 52)),
            "n3": node(p5=(132, 52)),
            "n4": node(p5=(132, 49)),
        },
        partitions={5: record},
        incarnation=1,
        incarnation_revision=100,
        node_revisions={"n1": 101, "n2": 102, "n3": 103, "n4": 104},
    )
    promoted = plan(v).puts[5]
    assert promoted.leader == "n3" and promoted.replicas == ("n4", "n1", "n2", "n3")
    # Without n3: a voter ahead that has yet to publish after the key vanished is waited for.
    del v.nodes["n3"]
    assert plan(v).puts == {}
    v.nodes["n2"] = node(p5=(132, 52))
    assert plan(v).puts[5].leader == "n2"


def test_after_etcd_went_back_a_position_the_restore_brought_back_does_not_count() -> None:
    # Simulation seed ``restore`` 60781: the records of n2 and n3 came back with the
    # snapshot (n3 frozen, so it could not publish again), showing their positions of that
    # time; n3's, 3 entries behind n1's acknowledged ones, was designated.
    record = PartitionRecord("t", "q", 0, ("n1", "n2", "n3"), "n3", designated_in=0)
    v = view(
        queues={("t", "q"): {"replication_factor": 3}},
        nodes={"n2": node(p5=(14, 10)), "n3": node(p5=(14, 12))},
        partitions={5: record},
        incarnation=1,
        incarnation_revision=100,
        node_revisions={"n2": 60, "n3": 61},  # written before the raise: the snapshot's
    )
    assert plan(v).puts == {}
    # n2 and n1 publish again after the raise: n1 holds the acknowledged entries. While n3's
    # restored record stands, its copy is not known: wait (simulation seed ``all`` 100851).
    v.nodes.update({"n1": node(p5=(101, 15)), "n2": node(p5=(101, 15))})
    v.node_revisions.update({"n1": 101, "n2": 102})
    assert plan(v).puts == {}
    del v.nodes["n3"]  # its lease expires (n3 is frozen)
    assert plan(v).puts[5].leader in ("n1", "n2")


def test_after_etcd_went_back_a_live_node_yet_to_publish_is_waited_for() -> None:
    # Simulation seed ``all`` 100851: after a restore n2 (its copy emptied) and n4 published
    # since the raise, a majority of the voters; n1, holding the acknowledged LSNs 1-3, had
    # not published yet, and n2 was designated.
    record = PartitionRecord("t", "q", 0, ("n1", "n2", "n4"), "n1", designated_in=0)
    v = view(
        queues={("t", "q"): {"replication_factor": 3}},
        nodes={"n1": node(p5=(14, 1)), "n2": node(p5=(0, 0)), "n4": node(p5=(0, 0))},
        partitions={5: record},
        incarnation=1,
        incarnation_revision=100,
        node_revisions={"n1": 40, "n2": 101, "n4": 102},
    )
    assert plan(v).puts == {}
    v.nodes["n1"] = node(p5=(14, 3))
    v.node_revisions["n1"] = 103
    assert plan(v).puts[5].leader == "n1"
    # The same wait while the designation is of this incarnation but no term of it has
    # written an entry yet (n4 was designated again and died before it led).
    v.partitions[5] = replace(record, leader="n4", designated_in=1)
    del v.nodes["n4"]
    v.node_revisions["n1"] = 40
    assert plan(v).puts == {}
    v.node_revisions["n1"] = 103
    assert plan(v).puts[5].leader == "n1"


def test_a_position_published_before_the_last_term_is_not_fresh() -> None:
    # Simulation seed ``all`` 130837: n1 followed n3's term and acknowledged LSNs 24-26, but
    # its loop was held in another partition's first commit, so its record still showed the
    # position it published before n3 led (LSN 23, no key seen). When n3's key vanished, n2
    # (back from a restart, LSN 23) and that record made a "majority", and n2 was promoted.
    record = PartitionRecord("t", "q", 0, ("n1", "n2", "n3"), "n3")
    v = view(
        queues={("t", "q"): {"replication_factor": 3}},
        nodes={"n1": node(p5=(129, 23)), "n2": node(p5=(129, 23))},
        partitions={5: record},
        node_revisions={"n1": 50, "n2": 80},
        leader_seen={5: 60},  # n3's key, last seen at revision 60
    )
    assert plan(v).puts == {}
    v.nodes["n1"] = node(p5=(162, 26))
    v.node_revisions["n1"] = 90
    assert plan(v).puts[5].leader == "n1"
