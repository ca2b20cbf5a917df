"""The record each replica was served on, kept on the node's disk (``DATA/records/``) and
published for an unreadable record this process never read (node/remembered_records.py)."""

from __future__ import annotations

from pathlib import Path

from backend_store.cluster.coordination.layout import PartitionRecord
from backend_store.cluster.coordination.timeline import RecordMark
from backend_store.cluster.node.reconcile import MapView
from backend_store.cluster.node.remembered_records import (
    forget,
    read_marks,
    read_remembered,
    remember,
    worth_keeping,
)

RECORD = PartitionRecord("t", "q", 0, ("n1", "n2", "n3"), "n1", designation=4)


def test_records_survive_on_disk_and_an_unreadable_one_is_skipped(tmp_path: Path) -> None:
    remember(tmp_path, 5, RECORD, RecordMark(0, 40))
    moved = PartitionRecord("t", "q", 1, ("n1", "n2", "n4"), "n2")
    remember(tmp_path, 6, RECORD, RecordMark(0, 41))
    remember(tmp_path, 6, moved, RecordMark(1, 12))  # a change replaces it, and its mark
    remember(tmp_path, 10, RECORD, None)  # not read now: no mark
    (tmp_path / "records" / "7").write_bytes(b"\xc1garbage")
    (tmp_path / "records" / "8.new").write_bytes(b"a write's leftover")
    assert read_remembered(tmp_path) == {5: RECORD, 6: moved, 10: RECORD}
    assert read_marks(tmp_path) == {5: RecordMark(0, 40), 6: RecordMark(1, 12)}
    (tmp_path / "records" / "10.mark").write_bytes(b"garbage")
    assert read_marks(tmp_path) == {5: RecordMark(0, 40), 6: RecordMark(1, 12)}  # skipped
    forget(tmp_path, 5)
    forget(tmp_path, 9)  # never kept: nothing to do
    assert read_remembered(tmp_path) == {6: moved, 10: RECORD}
    assert read_marks(tmp_path) == {6: RecordMark(1, 12)}
    assert read_remembered(tmp_path / "nothing here") == {}


def test_a_remembered_record_is_published_only_for_an_unreadable_one_never_read() -> None:
    remembered = {5: RECORD, 6: RECORD, 7: RECORD}
    other = PartitionRecord("t", "q", 2, ("n1", "n2", "n3"), "n2", designation=9)
    view = MapView(records={6: other, 7: other}, unreadable=frozenset({5, 6}), values={7: other.pack()})
    # 5: unreadable, never read here: the disk's. 6: unreadable, read before: what was read
    # (served). 7: readable: nothing to rebuild.
    assert view.kept([6, 7], remembered) == {5: RECORD, 6: other}
    assert view.kept([6, 7]) == {6: other}


def test_a_record_is_written_again_when_it_changed_or_can_be_marked_at_last() -> None:
    mark = RecordMark(0, 40)
    assert not worth_keeping(RECORD, mark, RECORD, mark)
    assert not worth_keeping(RECORD, None, RECORD, None)  # not read now: nothing to add
    assert worth_keeping(RECORD, mark, RECORD, None)  # kept by a version before marks
    other = PartitionRecord("t", "q", 0, ("n1", "n2", "n4"), "n1", designation=5)
    assert worth_keeping(other, RecordMark(0, 52), RECORD, mark)
