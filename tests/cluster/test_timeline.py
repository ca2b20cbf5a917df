"""Whether etcd went back in time (``coordination/timeline.py``): what a node remembers,
against what etcd shows, and the raise of the cluster's incarnation on a real etcd."""

from __future__ import annotations

from backend_store.cluster.coordination.timeline import RecordMark, Timeline
from backend_store.types import make_epoch


def suspect(timeline: Timeline) -> bool:
    """Read afresh each time: an ``assert timeline.suspect`` would narrow the attribute for
    mypy, which then takes a later ``assert not timeline.suspect`` for unreachable code."""
    return timeline.suspect


def test_a_state_behind_what_was_remembered_is_suspect_until_a_fresh_read_settles_it() -> None:
    timeline = Timeline()
    timeline.observe(0, 80)
    timeline.remember(make_epoch(0, 89))  # a leader key's epoch, or a replica's fence
    timeline.observe(0, 85)  # a watch's state read before that key was made: or etcd went back
    assert suspect(timeline)
    # A fresh read at a revision past it: etcd was not behind (watches race one another).
    assert timeline.settle(0, 90)
    assert not suspect(timeline)
    assert timeline.high_water == make_epoch(0, 90)


def test_a_restored_etcd_stays_suspect_until_the_incarnation_is_raised() -> None:
    timeline = Timeline()
    timeline.observe(1, 89)
    timeline.observe(0, 13)  # restored from a snapshot of incarnation 0, revision 13
    assert suspect(timeline)
    assert not timeline.settle(0, 14)  # still behind: the raise did not take yet
    assert suspect(timeline)
    assert timeline.settle(2, 15)  # raised past everything remembered
    assert not suspect(timeline)
    # Newer states after the raise are not suspect.
    timeline.observe(2, 16)
    assert not suspect(timeline)


def test_an_etcd_that_moves_on_is_never_suspect() -> None:
    timeline = Timeline()
    for revision in range(1, 50):
        timeline.remember(make_epoch(0, revision))
        timeline.observe(0, revision)
    assert not suspect(timeline)


def test_a_record_older_than_its_mark_ends_the_incarnation_whatever_the_revision() -> None:
    """Session 40 (simulation ``bumped`` 23): etcd restored with ``--bump-revision``, or
    while every node was down, shows revisions ahead of everything remembered, while a
    record went back to an older mod revision than this node saw it at."""
    timeline = Timeline()
    timeline.remember(make_epoch(0, 90))
    marks = {4: RecordMark(0, 70), 5: RecordMark(0, 30)}
    # etcd as it was: record 4 unchanged, record 5 changed since (newer), one unmarked.
    assert timeline.check_marks(marks, {4: 70, 5: 60, 6: 10}, incarnation=0) == []
    assert not suspect(timeline)
    # A record gone from etcd is not evidence (a queue deleted): only an older one is.
    assert timeline.check_marks(marks, {5: 60}, incarnation=0) == []
    # Restored: revision 1,090 (bumped), record 4 back at its mod revision 50.
    timeline.observe(0, 1090)
    assert not suspect(timeline)  # the revision alone shows nothing
    assert timeline.check_marks(marks, {4: 50, 5: 30}, incarnation=0) == [4]
    assert suspect(timeline)
    # Only a raised incarnation settles it, however far the revision went.
    assert not timeline.settle(0, 5000)
    assert timeline.settle(1, 1100)
    assert not suspect(timeline)
    # Marks of an earlier incarnation say nothing of this one (the restore was noticed).
    assert timeline.check_marks(marks, {4: 50}, incarnation=1) == []
    assert not suspect(timeline)
