"""A copy made again after a move deleted it counts for nothing; its receipt says where to look.

Found by the deterministic simulation (``all`` 222767, 234061, 240328, sessions 36-37): a
move deleted X's copy, etcd was restored from a backup that still named X, and X's new,
empty copy and one other replica made a majority of the restored set while the copies
holding the newest acknowledged writes were down; a replica without them led. Now the node
keeps the move's receipt on its disk before it deletes (``node/receipts.py``), publishes
the new copy as ``remade`` while it is empty, and the promotion leaves it out; without a
majority of the set, a majority of the newest receipt's set heard lets it go on (the
availability seeds ``all`` 230870, 231026, 231577: a restored set of one live copy, one
made again and one node gone for good). Sans-I/O: the election, the records, the files.
"""

from __future__ import annotations

from pathlib import Path

from backend_store.cluster.coordination.layout import (
    MoveReceipt,
    NodeRecord,
    PartitionRecord,
    ReplicaPosition,
    Tombstone,
)
from backend_store.cluster.manager.election import promote
from backend_store.cluster.manager.membership import Serving, deletion_tombstones, tombstones
from backend_store.cluster.node import receipts
from backend_store.cluster.node.receipts import (
    KeptReceipt,
    keep_receipt,
    published_receipts,
    read_receipts,
)
from backend_store.cluster.node.reconcile import ReplicaLabel

INCARNATION = 1
EARLIER = 5  # an epoch of incarnation 0: the entries before the restore
# The restored record: designated before the restore (a stale designation), set A, B, X.
RESTORED = PartitionRecord("t", "q", 0, ("A", "B", "X"), "A", designated_in=0)
# What X's tombstone said when the move to Y deleted its copy: the set A, B, Y had committed.
RECEIPT = MoveReceipt(("A", "B", "Y"), EARLIER)
LABEL = ReplicaLabel("c-1", 5, "t", "q", 0, None)


def _follower(lsn: int, *, made_again: MoveReceipt | None = None) -> ReplicaPosition:
    return ReplicaPosition("follower", EARLIER, lsn, EARLIER if lsn else 0, 0, remade=made_again)


def _promote(nodes: dict[str, NodeRecord], record: PartitionRecord = RESTORED) -> PartitionRecord:
    return promote(nodes, 5, record, incarnation=INCARNATION)


def test_an_empty_copy_made_again_is_not_counted_toward_a_majority() -> None:
    # A (ahead: LSN 22, acknowledged with Y) and Y are down; B and X's new copy are live.
    nodes = {
        "B": NodeRecord("b:1", replicas={5: _follower(21)}),
        "X": NodeRecord("x:1", replicas={5: _follower(0, made_again=RECEIPT)}),
    }
    assert _promote(nodes) == RESTORED  # waits for A (or Y)
    # The same copy published as any empty copy (before receipts) made B the leader.
    unmarked = {**nodes, "X": NodeRecord("x:1", replicas={5: _follower(0)})}
    assert _promote(unmarked).leader == "B"


def test_a_majority_of_the_receipts_set_heard_lets_the_best_copy_anywhere_lead() -> None:
    # A is gone for good; B serves LSN 21, Y keeps the newest copy (LSN 22) as a stray.
    nodes = {
        "B": NodeRecord("b:1", replicas={5: _follower(21)}),
        "X": NodeRecord("x:1", replicas={5: _follower(0, made_again=RECEIPT)}),
        "Y": NodeRecord("y:1", strays={5: "not named"}, stray_ranks={5: (EARLIER, 22)}),
    }
    promoted = _promote(nodes)
    assert promoted.leader == "Y" and "Y" in promoted.replicas
    assert promoted.designated_in == INCARNATION
    # Only B of the receipt's set heard: not a majority of it, so it waits.
    without_y = {n: r for n, r in nodes.items() if n != "Y"}
    assert _promote(without_y) == RESTORED


def test_the_newest_receipt_decides() -> None:
    older = MoveReceipt(("B", "X", "Z"), EARLIER - 1)
    nodes = {
        "B": NodeRecord("b:1", replicas={5: _follower(21)}),
        "X": NodeRecord("x:1", replicas={5: _follower(0, made_again=older)}),
        "A": NodeRecord("a:1", replicas={5: _follower(0, made_again=RECEIPT)}),
        "Z": NodeRecord("z:1", strays={5: "not named"}, stray_ranks={5: (EARLIER, 20)}),
    }
    # The older receipt's set (B, X, Z) would be heard by B and Z; the newest (A, B, Y) is not.
    assert _promote(nodes) == RESTORED


def test_a_receipts_set_that_moved_on_is_followed_to_its_members_newer_receipt() -> None:
    # After X's copy went to Y, Y's went to Z (simulation seed ``all`` 320038): Y deleted its
    # copy too, and publishes that move's receipt. A is gone; B serves LSN 21, Z keeps 22.
    later = MoveReceipt(("A", "B", "Z"), EARLIER, 40)
    nodes = {
        "B": NodeRecord("b:1", replicas={5: _follower(21)}),
        "X": NodeRecord("x:1", replicas={5: _follower(0, made_again=RECEIPT)}),
        "Y": NodeRecord("y:1", receipts={5: later}),
        "Z": NodeRecord("z:1", strays={5: "not named"}, stray_ranks={5: (EARLIER, 22)}),
    }
    promoted = _promote(nodes)
    assert promoted.leader == "Z" and "Z" in promoted.replicas
    # Without Y's receipt, only B of X's receipt's set (A, B, Y) holds a copy: it waits.
    assert _promote({**nodes, "Y": NodeRecord("y:1")}) == RESTORED
    # An older receipt of Y's (before X's move) is not followed.
    older = {**nodes, "Y": NodeRecord("y:1", receipts={5: MoveReceipt(("A", "B", "Z"), EARLIER - 1)})}
    assert _promote(older) == RESTORED


def test_a_receipt_of_a_node_outside_the_chain_says_nothing() -> None:
    # W is in no receipt's set the chain reached: its receipt may be older than the record
    # (a move before the backup was taken), whatever its epoch says.
    nodes = {
        "B": NodeRecord("b:1", replicas={5: _follower(21)}),
        "X": NodeRecord("x:1", replicas={5: _follower(0, made_again=RECEIPT)}),
        "W": NodeRecord("w:1", receipts={5: MoveReceipt(("B", "V", "Z"), EARLIER + 1)}),
        "Z": NodeRecord("z:1", strays={5: "not named"}, stray_ranks={5: (EARLIER, 22)}),
    }
    assert _promote(nodes) == RESTORED


def test_a_node_publishes_the_receipts_of_named_partitions_it_holds_no_copy_of() -> None:
    kept = {5: KeptReceipt(LABEL, RECEIPT), 6: KeptReceipt(LABEL, RECEIPT), 7: KeptReceipt(LABEL, RECEIPT)}
    # 5: published; 6: held again (its receipt goes with the copy, as remade); 7: not named.
    assert published_receipts(kept, hosted={6}, named={5, 6}) == {5: RECEIPT}
    record = NodeRecord("y:1", receipts={5: RECEIPT})
    assert NodeRecord.unpack(record.pack()) == record
    # A receipt written before receipts carried the LSN still reads (LSN 0 orders it first).
    assert MoveReceipt.from_doc({"voters": ["A"], "epoch": 3}) == MoveReceipt(("A",), 3, 0)


def test_a_move_tombstone_carries_its_receipt_and_a_deleted_queue_none() -> None:
    record = PartitionRecord("t", "q", 0, ("A", "B", "Y"), "A")
    lead = ReplicaPosition("leader", 9, 30, 9, 9, ("A", "B", "Y"), 30, ("B", "Y"))
    nodes = {
        "A": NodeRecord("a:1", replicas={5: lead}),
        "X": NodeRecord("x:1", strays={5: "moved"}, stray_ranks={5: (9, 25)}),
    }
    puts, _ = tombstones(nodes, {5: record}, {5: Serving(record, lead)}, {})
    tombstone = puts[(5, "X")]
    assert tombstone.receipt == MoveReceipt(("A", "B", "Y"), 9, 30)  # the set, its epoch and commit
    assert Tombstone.unpack(tombstone.pack()) == tombstone
    assert all(t.receipt is None for t in deletion_tombstones(5, record, ["X"]).values())
    # A tombstone of an older manager (no receipt) still reads.
    old = Tombstone(5, "X", "moved", 30, "t", "q")
    assert Tombstone.unpack(old.pack()).receipt is None


def test_a_remade_position_is_published_and_read_back() -> None:
    record = NodeRecord("x:1", replicas={5: _follower(0, made_again=RECEIPT), 6: _follower(3)})
    assert NodeRecord.unpack(record.pack()) == record


def test_only_an_empty_copy_of_the_same_queues_partition_is_remade(tmp_path: Path) -> None:
    remade = receipts.remade  # looked up here, so that the ablation remade-copies reaches it
    kept = KeptReceipt(LABEL, RECEIPT)
    assert remade(kept, LABEL, _follower(0)).remade == RECEIPT
    assert remade(kept, LABEL, _follower(4)).remade is None  # it holds entries from a leader
    recreated = ReplicaLabel("c-1", 5, "t", "q", 0, 77)  # the queue deleted and made again
    assert remade(kept, recreated, _follower(0)).remade is None
    assert remade(None, LABEL, _follower(0)).remade is None


def test_receipts_survive_on_disk_and_an_unreadable_one_is_skipped(tmp_path: Path) -> None:
    kept = KeptReceipt(LABEL, RECEIPT)
    keep_receipt(tmp_path, 5, kept)
    keep_receipt(tmp_path, 6, KeptReceipt(LABEL, MoveReceipt(("A",), 1)))
    keep_receipt(tmp_path, 6, KeptReceipt(LABEL, MoveReceipt(("B",), 2)))  # a newer one replaces it
    (tmp_path / "receipts" / "7").write_bytes(b"\xc1garbage")
    (tmp_path / "receipts" / "8.new").write_bytes(b"a write's leftover")
    assert read_receipts(tmp_path) == {5: kept, 6: KeptReceipt(LABEL, MoveReceipt(("B",), 2))}
    assert read_receipts(tmp_path / "nothing here") == {}


def test_a_member_of_the_receipts_set_that_moved_its_copy_away_counts_when_the_best_copy_covers_it() -> None:
    # Simulation seed ``all`` 324971: A is gone for good, X's copy is made again, and Y, the
    # other member of X's receipt's set, moved its copy away at LSN 2. B holds LSN 2.
    receipt = MoveReceipt(("A", "B", "Y"), EARLIER, 2)
    nodes = {
        "B": NodeRecord("b:1", replicas={5: _follower(2)}),
        "X": NodeRecord("x:1", replicas={5: _follower(0, made_again=receipt)}),
        "Y": NodeRecord("y:1", receipts={5: MoveReceipt(("A", "B", "X"), EARLIER, 2)}),
    }
    assert _promote(nodes).leader == "B"
    # B behind Y's receipt: Y may have acknowledged what B lacks.
    behind = {**nodes, "B": NodeRecord("b:1", replicas={5: _follower(1)})}
    assert _promote(behind) == RESTORED
    # A receipt of Y's older than X's: it tells nothing of the copy Y held in X's set.
    older = {**nodes, "Y": NodeRecord("y:1", receipts={5: MoveReceipt(("A", "B", "X"), EARLIER, 1)})}
    assert _promote(older) == RESTORED
