"""Each copy keeps the voting set it was last served on, and by which incarnation; after a
restore, the promotion waits for a majority of each such set of an earlier incarnation.

Found by the deterministic simulation (``returns`` 255, session 38): a replica replaced while
its node was dead, etcd restored from before the replacement, the node back with its old
copy: that copy and one other made a majority of the restored set while the newer set's
copies were down. Sans-I/O: the rule a node keeps sets by, the files, the election.
"""

from __future__ import annotations

from pathlib import Path

from backend_store.cluster.coordination.layout import (
    MoveReceipt,
    NodeRecord,
    PartitionRecord,
    ReplicaPosition,
    ServedSet,
)
from backend_store.cluster.manager.election import promote
from backend_store.cluster.node.served_sets import (
    ServedSets,
    forget_served_set,
    keep_served_set,
    read_served_sets,
)
from backend_store.types import make_epoch

BEFORE = make_epoch(0, 67)  # an epoch of incarnation 0: entries from before the restore
AFTER = make_epoch(1, 90)  # an epoch of incarnation 1
NEWER = ("A", "B", "D")  # D replaced the dead C
RESTORED = PartitionRecord("t", "q", 0, ("A", "B", "C"), "B", designated_in=0)


def _kept(
    sets: ServedSets, pid: int, voters: tuple[str, ...], incarnation: int, epoch: int, lsn: int
) -> None:
    served = sets.served(pid, voters, incarnation, epoch, lsn)
    if served is not None:
        sets.keep(pid, served)


def test_a_set_of_an_earlier_incarnation_stays_until_the_copy_gets_an_entry_in_the_new_one() -> None:
    sets = ServedSets({})
    _kept(sets, 5, NEWER, 0, BEFORE, 22)
    assert sets.kept[5] == ServedSet(NEWER, 0)
    # Etcd restored: served on the restored set in incarnation 1, nothing new yet: kept.
    _kept(sets, 5, RESTORED.replicas, 1, BEFORE, 22)
    assert sets.kept[5] == ServedSet(NEWER, 0)
    assert sets.earlier({5}, 1) == {5: ServedSet(NEWER, 0)}
    assert sets.earlier(set(), 1) == {}  # a copy no longer held publishes nothing
    # A leader whose term went on across the restore ships an entry: the set is settled.
    _kept(sets, 5, RESTORED.replicas, 1, BEFORE, 23)
    assert sets.kept[5] == ServedSet(RESTORED.replicas, 1)
    assert sets.earlier({5}, 1) == {}


def test_an_entry_of_the_new_incarnation_settles_at_once_and_changes_within_one_are_kept() -> None:
    sets = ServedSets({5: ServedSet(NEWER, 0)})  # read from disk by a new process
    _kept(sets, 5, RESTORED.replicas, 1, AFTER, 22)  # its last entry is of incarnation 1
    assert sets.kept[5] == ServedSet(RESTORED.replicas, 1)
    _kept(sets, 5, ("A", "C", "E"), 1, AFTER, 22)  # a move within the incarnation
    assert sets.kept[5] == ServedSet(("A", "C", "E"), 1)
    assert sets.served(5, ("E", "C", "A"), 1, AFTER, 22) is None  # the same set, reordered
    assert sets.served(5, NEWER, 0, AFTER, 22) is None  # a view behind the raise changes nothing
    assert sets.forget(5) and not sets.forget(5)


def test_sets_survive_on_disk_and_an_unreadable_one_is_skipped(tmp_path: Path) -> None:
    keep_served_set(tmp_path, 5, ServedSet(NEWER, 0))
    keep_served_set(tmp_path, 6, ServedSet(("A",), 0))
    keep_served_set(tmp_path, 6, ServedSet(("B",), 1))  # replaced
    (tmp_path / "sets" / "7").write_bytes(b"\xc1garbage")
    assert read_served_sets(tmp_path) == {5: ServedSet(NEWER, 0), 6: ServedSet(("B",), 1)}
    forget_served_set(tmp_path, 5)
    assert read_served_sets(tmp_path) == {6: ServedSet(("B",), 1)}
    record = NodeRecord("a:1", served_sets={5: ServedSet(NEWER, 0)})
    assert NodeRecord.unpack(record.pack()) == record


def _follower(lsn: int) -> ReplicaPosition:
    return ReplicaPosition("follower", BEFORE, lsn, BEFORE, 0)


def test_after_a_restore_a_majority_of_each_earlier_set_is_heard_before_a_promotion() -> None:
    # A's copy (LSN 19) was served on A, B, D; B and D, which hold LSN 22, are down; C is
    # back with an old copy. A and C are a majority of the restored set, not of A, B, D.
    nodes = {
        "A": NodeRecord("a:1", replicas={5: _follower(19)}, served_sets={5: ServedSet(NEWER, 0)}),
        "C": NodeRecord("c:1", replicas={5: _follower(2)}, served_sets={5: ServedSet(RESTORED.replicas, 0)}),
    }
    assert promote(nodes, 5, RESTORED, incarnation=1) == RESTORED
    # D back (its copy kept as a stray: the restored set does not name it): the best leads.
    with_d = {**nodes, "D": NodeRecord("d:1", strays={5: "not named"}, stray_ranks={5: (BEFORE, 22)})}
    promoted = promote(with_d, 5, RESTORED, incarnation=1)
    assert promoted.leader == "D" and "D" in promoted.replicas
    # Once settled (the designation is of this incarnation, the best copy too), an earlier
    # set says nothing: the record's set decides, as always.
    settled = PartitionRecord("t", "q", 0, ("A", "B", "C"), "B", designated_in=1)
    current = {
        "A": NodeRecord(
            "a:1",
            replicas={5: ReplicaPosition("follower", AFTER, 19, AFTER, 0)},
            served_sets={5: ServedSet(NEWER, 0)},
        ),
        "C": NodeRecord("c:1", replicas={5: ReplicaPosition("follower", AFTER, 2, AFTER, 0)}),
    }
    assert promote(current, 5, settled, incarnation=1).leader == "A"


def test_a_member_that_deleted_its_copy_on_a_move_counts_when_the_best_copy_covers_its_receipt() -> None:
    # C's copy was served on A, C, D; A is gone for good, D moved its copy away after the
    # restore (its receipt's bound: LSN 2). C's copy holds LSN 2: what D acknowledged, C has.
    earlier = ServedSet(("A", "C", "D"), 0)
    restored = PartitionRecord("t", "q", 0, ("A", "B", "C"), "A", designated_in=0)
    receipt = MoveReceipt(("A", "B", "C"), BEFORE, 2)
    nodes = {
        "B": NodeRecord("b:1", replicas={5: _follower(2)}),
        "C": NodeRecord("c:1", replicas={5: _follower(2)}, served_sets={5: earlier}),
        "D": NodeRecord("d:1", receipts={5: receipt}),
    }
    assert promote(nodes, 5, restored, incarnation=1).leader in ("B", "C")
    # A receipt past every live copy: D may have acknowledged what none of them holds.
    beyond = {**nodes, "D": NodeRecord("d:1", receipts={5: MoveReceipt(("A", "B", "C"), BEFORE, 9)})}
    assert promote(beyond, 5, restored, incarnation=1) == restored
