"""Check-quorum's decisions without I/O (``backend_store/cluster/replication/quorum.py``): when a leader
that no majority answers resigns, on a clock the test moves, and what it then vouches for."""

from __future__ import annotations

from backend_store.cluster.replication.quorum import QuorumCheck, vouched_position

W = 4.0  # the window (two 2 s leases, the node's default)
ALL3 = {"n1", "n2", "n3"}


def check(*replicas: str, window_s: float = W) -> QuorumCheck:
    return QuorumCheck("n1", replicas, window_s=window_s, now=100.0)


def test_a_leader_hearing_from_no_follower_resigns_only_after_the_window() -> None:
    q = check("n1", "n2", "n3")
    # A new term has one window to reach its followers.
    assert not q.should_resign(100.0 + W, ALL3)
    assert q.should_resign(100.0 + W + 0.01, ALL3)
    assert q.silent(100.0 + W + 0.01) == ["n2", "n3"]


def test_rf3_one_follower_is_enough() -> None:
    q = check("n1", "n2", "n3")
    for t in range(101, 120):
        q.heard("n2", float(t))  # n3 stays silent; n2 answers every second
        assert not q.should_resign(t + 0.5, ALL3)
    assert q.in_contact(119.5) == {"n1", "n2"}
    # Then n2 goes quiet too: a window after its last reply the leader resigns.
    assert not q.should_resign(119.0 + W, ALL3)
    assert q.should_resign(119.0 + W + 0.01, ALL3)


def test_rf2_never_resigns() -> None:
    # Its follower alone is no majority: promoted, it could commit nothing either, and would
    # resign in turn (leadership bouncing between the two while the cut lasts).
    q = check("n1", "n2")
    assert q.majority == 2
    q.heard("n2", 102.0)
    assert q.in_contact(102.0 + W + 0.01) == {"n1"}
    assert not q.should_resign(102.0 + W + 0.01, {"n1", "n2"})


def test_rf1_never_resigns() -> None:
    q = check("n1")
    assert q.majority == 1
    assert not q.should_resign(10_000.0, {"n1"})


def test_a_leader_stays_when_the_others_could_not_lead_without_it() -> None:
    # Its silent followers are not all registered in etcd (dead, or cut off from etcd too):
    # the others are no majority by themselves, so resigning would only stop reads and async
    # writes.
    q = check("n1", "n2", "n3")
    later = 100.0 + 10 * W
    assert not q.should_resign(later, {"n1"})
    assert not q.should_resign(later, {"n1", "n2"})  # n2 alone: no majority without n1
    assert not q.should_resign(later, {"n1", "n2", "n4"})  # a node outside the set does not count
    assert q.should_resign(later, {"n2", "n3"})  # the two others can promote and commit
    # RF 5: three of the four others registered is a majority.
    rf5 = check("n1", "n2", "n3", "n4", "n5")
    assert not rf5.should_resign(later, {"n1", "n2", "n3"})
    assert rf5.should_resign(later, {"n1", "n2", "n3", "n4"})


def test_a_replica_added_to_the_set_gets_a_window_from_its_addition() -> None:
    live = {"n1", "n2", "n3", "n4"}
    q = check("n1", "n2", "n3")
    q.heard("n2", 103.0)
    q.heard("n3", 103.0)
    # n3 is replaced by n4 (a move): n4 has not answered yet, but it just joined.
    q.set_replicas(("n1", "n2", "n4"), 103.5)
    assert not q.should_resign(103.0 + W, live)
    assert q.in_contact(103.0 + W + 0.01) == {"n1", "n4"}  # n2 silent, n4 still in its first window
    assert not q.should_resign(103.0 + W + 0.01, live)
    assert q.should_resign(103.5 + W + 0.01, live)
    q.heard("n3", 110.0)  # a reply from a replica no longer in the set counts for nothing
    assert q.should_resign(110.0, live)
    # Growing: old members keep their last reply, a new one starts now.
    q.heard("n4", 111.0)
    q.set_replicas(("n1", "n2", "n4", "n3"), 111.0)
    assert q.in_contact(111.0 + W) == {"n1", "n3", "n4"}


def test_heard_never_goes_back_in_time() -> None:
    q = check("n1", "n2")
    q.heard("n2", 105.0)
    q.heard("n2", 104.0)
    assert q.in_contact(105.0 + W) == {"n1", "n2"}


def test_a_window_of_zero_turns_it_off() -> None:
    q = check("n1", "n2", "n3", window_s=0)
    assert not q.should_resign(10_000.0, ALL3)


def test_a_resigning_leader_vouches_for_its_commit_point_not_its_tail() -> None:
    # Term 9 began after LSN 40 (an entry of term 7); a majority acknowledged up to 55 of
    # its entries; entries 56.. were written but never acknowledged.
    assert vouched_position(epoch=9, committed_lsn=55, term_start=(7, 40)) == (9, 55)
    # Nothing of its own term committed (not even its no-op): every earlier-term entry may
    # have been acknowledged by an earlier leader, so it vouches for all of them.
    assert vouched_position(epoch=9, committed_lsn=40, term_start=(7, 40)) == (7, 40)
    assert vouched_position(epoch=9, committed_lsn=0, term_start=(7, 40)) == (7, 40)
    assert vouched_position(epoch=3, committed_lsn=0, term_start=(0, 0)) == (0, 0)
