"""A node's leadership decisions (``node/leadership.py``), without I/O: when a replica
serves, steps down, resigns, hands over (and gives a hand-over up), holds off, campaigns."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from backend_store.cluster.coordination.layout import (
    MoveReceipt,
    NodeRecord,
    PartitionRecord,
    ReplicaPosition,
)
from backend_store.cluster.node.leadership import Action, Situation, decide, heard_copies, voter_ahead
from backend_store.cluster.replication.quorum import Resignation

RECORD = PartitionRecord("t", "q", 0, ("n1", "n2", "n3"), "n1")


def situation(**kwargs: Any) -> Situation:
    base = Situation(
        node_id="n1",
        record=RECORD,
        now=100.0,
        session_valid=True,
        key=None,
        window_s=4.0,
        handover_timeout_s=2.0,
        registered_voters=3,
    )
    return replace(base, **kwargs)


def leading(**kwargs: Any) -> Situation:
    return situation(term=7, key=("n1", 7), **kwargs)


def test_a_designated_leader_serves_until_a_newer_term_or_no_quorum() -> None:
    assert decide(leading()).action is Action.SERVE
    assert decide(leading(deposed=True)).action is Action.RESIGN_DEPOSED
    assert decide(leading(lacks_quorum=True)).action is Action.RESIGN_FOR_QUORUM
    # A newer term beats everything, a hand-over included.
    asked = replace(RECORD, successor="n2")
    assert decide(leading(record=asked, deposed=True)).action is Action.RESIGN_DEPOSED


def test_a_successor_gets_a_bounded_hand_over() -> None:
    asked = replace(RECORD, successor="n2")
    start = decide(leading(record=asked))
    assert (start.action, start.successor) == (Action.HAND_OVER, "n2")
    waiting = leading(record=asked, handing_over_to="n2", handover_started=99.0)
    assert decide(waiting).action is Action.HAND_OVER  # 1 s of 2: keep waiting
    late = replace(waiting, now=101.5)
    assert decide(late).action is Action.ABANDON_HAND_OVER
    # Given up: serve, and do not try the same successor again...
    assert decide(leading(record=asked, abandoned="n2")).action is Action.SERVE
    # ...but another one, yes.
    other = replace(RECORD, successor="n3")
    assert decide(leading(record=other, abandoned="n2")).successor == "n3"


def test_no_hand_over_to_a_learner_or_to_itself() -> None:
    learner = replace(RECORD, learners=("n4",), successor="n4")
    assert decide(leading(record=learner)).action is Action.SERVE
    assert decide(leading(record=replace(RECORD, successor="n1"))).action is Action.SERVE


def test_a_leader_the_record_no_longer_designates_hands_over_to_the_designated_voter() -> None:
    moved = replace(RECORD, leader="n3")
    decision = decide(leading(record=moved))
    assert (decision.action, decision.successor) == (Action.HAND_OVER, "n3")
    # Designating a node outside the voters: nobody to hand over to.
    assert decide(leading(record=replace(RECORD, leader="n9"))).action is Action.STEP_DOWN


def test_after_resigning_it_holds_off_for_a_window_unless_a_newer_leader_exists() -> None:
    resigned = Resignation(epoch=7, at=99.0, last_epoch=7, lsn=40, designation=RECORD.designation)
    assert decide(situation(resigned=resigned)).action is Action.HOLD_OFF
    assert decide(situation(resigned=resigned, now=103.5)).action is Action.CAMPAIGN
    # Its own key still stands (the delete failed): delete it again, do not campaign.
    assert decide(situation(resigned=resigned, key=("n1", 7))).action is Action.DELETE_OWN_KEY
    newer = decide(situation(resigned=resigned, key=("n2", 9)))
    assert newer.end_resignation and newer.action is Action.CAMPAIGN  # etcd refuses while n2 holds it
    # Not designated any more (the manager designated another): a follower.
    other = replace(RECORD, leader="n2")
    assert decide(situation(resigned=resigned, record=other)).action is Action.FOLLOW


def test_only_a_designated_replica_with_a_valid_session_campaigns() -> None:
    assert decide(situation()).action is Action.CAMPAIGN
    assert decide(situation(session_valid=False)).action is Action.FOLLOW
    assert decide(situation(record=replace(RECORD, leader="n2"))).action is Action.FOLLOW
    # The successor named in a hand-over does not campaign: the manager designates it once
    # the old leader gave its key up, having checked its position.
    successor = situation(node_id="n2", record=replace(RECORD, successor="n2"))
    assert decide(successor).action is Action.FOLLOW


def test_a_leader_whose_key_the_map_does_not_show_reads_it_from_etcd() -> None:
    """Found by the simulation (``all`` 13): etcd restored from a snapshot taken before the
    leader's campaign; the restored key of an earlier leader (or none) stands in its place,
    and a term without its key is invisible to gateways and to the manager. The shell reads
    the key (the watch may only lag behind our own campaign) and steps down if it is gone."""
    assert decide(situation(term=7, key=None)).action is Action.CHECK_KEY
    assert decide(situation(term=7, key=("n2", 5))).action is Action.CHECK_KEY  # a restored older key
    assert decide(situation(term=7, key=("n1", 6))).action is Action.CHECK_KEY  # ours, of another term
    assert decide(situation(term=7, key=("n2", 9), deposed=True)).action is Action.RESIGN_DEPOSED


def test_a_replica_that_learnt_its_designation_may_be_stale_waits_for_a_new_one() -> None:
    """Found by the simulation (``all`` 27, an acknowledged write lost): an etcd restored
    from an older snapshot designates whoever led then. A replica deposed by a newer term (or
    whose own fence refused its campaign) waits, past any window, until the manager
    designates anew on fresh positions; the record's ``designation`` says when it has."""
    stale = Resignation(epoch=7, at=99.0, last_epoch=7, lsn=40, designation=3, stale=True)
    record = replace(RECORD, designation=3)
    assert decide(situation(resigned=stale, record=record, now=1000.0)).action is Action.HOLD_OFF
    # Designated anew (itself, on fresh positions): it campaigns at once, no window.
    again = replace(record, designation=4)
    assert decide(situation(resigned=stale, record=again, now=99.5)).action is Action.CAMPAIGN
    assert decide(situation(resigned=stale, record=replace(record, leader="n2"))).action is Action.FOLLOW


def test_a_designated_replica_campaigns_once_a_majority_of_the_voters_registered() -> None:
    """Found by the simulation (``minority`` 82, with the 3 s bound): a node that campaigned
    before its watch had shown the others' registrations began a term without links, and its
    first commit (the queue's creation) waited 5 s with the node's reconcile loop."""
    assert decide(situation(registered_voters=1)).action is Action.HOLD_OFF
    assert decide(situation(registered_voters=2)).action is Action.CAMPAIGN


def test_a_designated_replica_behind_a_heard_voters_later_term_resigns_for_the_manager() -> None:
    # Simulation seed ``down`` 398 (session 87): the restored map still designates n1, whose
    # copy ends in epoch 11; n3 publishes one ending in epoch 67 (n2 led it, and n3
    # acknowledged its LSNs 15-16), and nothing showed the restore.
    decision = decide(situation(registered_voters=2, voter_ahead="n3", last_epoch=11))
    assert decision.action is Action.RESIGN_BEHIND and "n3" in decision.why
    # Published as resigned on that designation, it holds off until the manager moves it.
    resigned = Resignation(11, 100.0, 11, 9, RECORD.designation, stale=True)
    assert decide(situation(voter_ahead="n3", resigned=resigned)).action is Action.HOLD_OFF


def test_a_replica_resigning_behind_a_voter_first_deletes_its_own_standing_key() -> None:
    # Simulation seed ``all`` 1761143 (session 87): n1 won a campaign just before n4
    # published a copy of a later term; while n1's key stands nobody else may lead, and the
    # manager promotes nobody, so it goes first.
    decision = decide(situation(voter_ahead="n4", last_epoch=11, key=("n1", 12)))
    assert decision.action is Action.DELETE_OWN_KEY
    assert decide(situation(voter_ahead="n4", last_epoch=11)).action is Action.RESIGN_BEHIND


def test_only_voters_heard_since_registering_that_published_their_copies_count() -> None:
    # Simulation seeds ``down`` 38 and 46 (session 86): n2's record is a relic the restore
    # brought back; n3 registered anew but has not published what its copy holds.
    copies = {"n1": ReplicaPosition("follower", 11, 9, 11), "n4": ReplicaPosition("follower", 54, 11, 54)}
    nodes = {
        "n2": NodeRecord("n2:7000", "up", {5: ReplicaPosition("follower", 11, 9, 11)}),
        "n3": NodeRecord("n3:7000", "up", {}, strays={5: "found on disk, not examined yet"}),
        "n4": NodeRecord("n4:7000", "up", {5: copies["n4"]}),
        "n5": NodeRecord("n5:7000", "up", {}, strays={5: "conflicts"}, stray_ranks={5: (60, 3)}),
    }
    voters = ("n1", "n2", "n3", "n4", "n5")
    heard = {"n1", "n3", "n4", "n5"}
    found = heard_copies(nodes, 5, voters, heard, "n1")
    assert found == {"n4": 54, "n5": 60}  # not n2 (not heard), not n3 (nothing said), not n1
    assert voter_ahead(found, 11) == "n4"
    assert voter_ahead(found, 60) is None
    # An empty copy, made again after its node deleted one on a move, counts as holding
    # nothing where its receipt's set (which took its writes over) includes this node
    # (simulation seeds ``pools`` 1732521 and 1732544, session 87).
    remade = replace(copies["n4"], remade=MoveReceipt(("n2", "n3", "n5"), 2, 1))
    nodes["n4"] = NodeRecord("n4:7000", "up", {5: remade})
    assert "n4" not in heard_copies(nodes, 5, voters, heard, "n1")
    assert heard_copies(nodes, 5, voters, {*heard, "n2"}, "n3")["n4"] == 0


def test_while_etcd_seems_behind_what_the_node_remembers_it_does_not_campaign() -> None:
    """Found by the simulation (``restore`` 2493 and 2645, two leaders of one epoch; ``all``
    2095 and ``restore`` 2301, a leader without an acknowledged entry): after etcd went back
    in time, a campaign wins an epoch that repeats one already used, on a designation made
    before the snapshot's time. Until a fresh read settles it (raising the incarnation if
    etcd is behind), no replica campaigns."""
    assert decide(situation(etcd_behind=True)).action is Action.HOLD_OFF
    # A leader keeps serving: a restored etcd shows it without its key (rule 2) if it lost it.
    assert decide(leading(etcd_behind=True)).action is Action.SERVE


def test_a_key_of_ours_that_this_replica_does_not_serve_is_deleted() -> None:
    """Found by the simulation (``restore`` 14, a partition that took no send after healing):
    etcd restored from a snapshot taken while n3 led, under the lease n3 still keeps alive,
    gave n3 back its old key; n3, designated in an earlier incarnation, held off for ever,
    and the manager promotes nobody while a key stands."""
    relic = ("n1", 5)
    stale = replace(RECORD, designated_in=0)
    assert decide(situation(key=relic, record=stale, incarnation=1)).action is Action.DELETE_OWN_KEY
    assert decide(situation(key=relic, etcd_behind=True)).action is Action.DELETE_OWN_KEY
    assert decide(situation(key=relic, record=replace(RECORD, leader="n2"))).action is Action.DELETE_OWN_KEY
    # Designated and free to campaign: the campaign takes the claim (its epoch is checked
    # against this replica's fence when it leads).
    assert decide(situation(key=relic)).action is Action.CAMPAIGN
    # Another node's key is theirs to give up.
    assert decide(situation(key=("n2", 5), record=replace(RECORD, leader="n2"))).action is Action.FOLLOW


def test_a_resignation_ends_on_entries_of_a_newer_term_and_while_holding_off() -> None:
    """Simulation seed ``returns`` 2652: a replica that resigned, then acknowledged entries
    of a newer term it never saw the key of (or saw only while holding off), must stop
    publishing the position it vouched for."""
    resigned = Resignation(epoch=7, at=99.0, last_epoch=7, lsn=40, designation=RECORD.designation)
    assert decide(
        situation(resigned=resigned, last_epoch=9, record=replace(RECORD, leader="n2"))
    ).end_resignation
    assert not decide(situation(resigned=resigned, last_epoch=7)).end_resignation
    # A stale resignation at the replica's own newer entries is not ended by them.
    stale = Resignation(epoch=7, at=99.0, last_epoch=9, lsn=40, designation=3, stale=True)
    assert not decide(
        situation(resigned=stale, last_epoch=9, record=replace(RECORD, designation=3))
    ).end_resignation
    # Seen while holding off on a designation from before etcd went back in time.
    held = decide(
        situation(resigned=resigned, key=("n2", 9), record=replace(RECORD, designated_in=0), incarnation=1)
    )
    assert held.action is Action.HOLD_OFF and held.end_resignation
