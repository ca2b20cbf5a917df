"""Whether etcd went back in time (``coordination/timeline.py``): what a node remembers,
against what etcd shows, and the raise of the cluster's incarnation on a real etcd."""

from __future__ import annotations

from backend_store.cluster.coordination.timeline import KeysSeen, RecordMark, Timeline, last_epoch_of
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


def test_a_record_marked_in_a_later_incarnation_than_etcds_ends_it() -> None:
    """Issue 48 (simulation ``down`` 22): etcd restored again to the backup whose restore was
    already noticed and raised past. The marks taken since were of the raised incarnation,
    which etcd no longer holds: they are evidence too, and the raise goes past them."""
    timeline = Timeline()
    marks = {4: RecordMark(1, 2140), 5: RecordMark(0, 30)}
    timeline.observe(0, 3151)  # the same backup, bumped further: incarnation 0 again
    assert timeline.check_marks(marks, {4: 50, 5: 30}, incarnation=0) == [4]
    assert suspect(timeline)
    assert not timeline.settle(1, 3160)  # a raise to 1 would repeat epochs of the lost one
    assert timeline.settle(2, 3160)
    assert not suspect(timeline)
    # A record gone from etcd is no evidence, whatever its mark.
    assert Timeline().check_marks({6: RecordMark(3, 10)}, {}, incarnation=0) == []


LEADER = "/pushgate/leaders/2"
OWN = "/pushgate/nodes/n1"


def test_a_key_held_older_than_seen_ends_the_incarnation_when_every_record_is_unchanged() -> None:
    """Session 41 (simulation mix ``late``): etcd restored with ``--bump-revision`` from a
    snapshot taken after the last change of every partition record, so no record mark sees
    it; a leader key and this node's own record went back to the snapshot's."""
    timeline, seen = Timeline(), KeysSeen()
    timeline.observe(0, 40)
    assert timeline.check_keys(seen, {LEADER: 12, OWN: 38}, incarnation=0) == []
    # etcd moves on: a new term's key (deleted and made again: newer), the record rewritten.
    assert timeline.check_keys(seen, {LEADER: 55, OWN: 60}, incarnation=0) == []
    assert not suspect(timeline)
    # Restored, bumped: every revision ahead of what was remembered, the keys not.
    timeline.observe(0, 1060)
    assert not suspect(timeline)
    assert timeline.check_keys(seen, {LEADER: 12, OWN: 38}, incarnation=0) == [LEADER, OWN]
    assert suspect(timeline)
    assert not timeline.settle(0, 5000)  # only a raised incarnation settles it
    assert timeline.settle(1, 1061)
    # Seen again in the new incarnation: what the restore left is the new starting point.
    assert timeline.check_keys(seen, {LEADER: 12, OWN: 38}, incarnation=1) == []
    assert timeline.check_keys(seen, {OWN: 1070}, incarnation=1) == []
    assert not suspect(timeline)
    assert seen.marks[OWN] == RecordMark(1, 1070)


def test_one_key_going_back_is_enough_and_a_key_gone_is_no_evidence() -> None:
    timeline, seen = Timeline(), KeysSeen()
    timeline.check_keys(seen, {LEADER: 55, OWN: 60}, incarnation=0)
    # The leader's lease expired (key gone); this node's record written again.
    assert timeline.check_keys(seen, {OWN: 61}, incarnation=0) == []
    assert not suspect(timeline)
    # Restored: the record back at 60, the leader key absent in the snapshot too.
    assert timeline.check_keys(seen, {OWN: 60}, incarnation=0) == [OWN]
    assert suspect(timeline)


def test_nothing_is_remembered_while_etcd_is_suspect() -> None:
    """A state a restore brought back must not become the mark: seen as current, it would
    bury the evidence that another key, or a later state, still holds."""
    timeline, seen = Timeline(), KeysSeen()
    timeline.check_keys(seen, {OWN: 60}, incarnation=0)
    timeline.observe(0, 70)
    timeline.observe(0, 20)  # a watch state behind (a restore without a bump, or a lag)
    assert suspect(timeline)
    timeline.check_keys(seen, {LEADER: 15, OWN: 62}, incarnation=0)
    assert seen.marks == {OWN: RecordMark(0, 60)}


def test_what_etcd_held_before_a_write_is_checked_against_the_mark_taken_before_it() -> None:
    timeline = Timeline()
    before = RecordMark(2, 500)  # the watch showed the node's record at 500 in incarnation 2
    # etcd answered the write: it held the record at 500 or later (the watch lagged): fine.
    assert not timeline.check_write(before, 500, 2) and not timeline.check_write(before, 640, 2)
    assert not timeline.check_write(before, None, 2)  # absent: no evidence (its lease ended)
    assert not timeline.check_write(None, 120, 2)  # nothing seen yet
    assert not timeline.check_write(before, 120, 3)  # seen in another incarnation
    assert not timeline.suspect
    # It held the record at 120: a restore brought back an older one, which this write buries.
    assert timeline.check_write(before, 120, 2)
    assert (timeline.suspect, timeline.high_water) == (True, last_epoch_of(2))
