"""Check-quorum: when a partition leader that no majority answers must resign (no I/O).

Raft's check-quorum (Ongaro's thesis, section 6.2): a leader that has not heard from a
majority of its replica set within an election timeout steps down, so a leader cut off from
its followers stops claiming the term and the others can replace it. Here the leader keeps
its etcd lease while it can reach etcd, so without this nobody would replace it: the manager
promotes only when a leader is gone. :class:`QuorumCheck` is that decision, fed by the
leader's replication links (every reply a follower sends, acknowledgement, refusal or
position report, is "heard") and asked by the node on every reconcile tick, with the clock
passed in, so it is tested without sockets or sleeps.

Two rules beside Raft's, both because etcd sees more than a Raft leader does:

- **Resign only where it helps.** A leader resigns only when the *other* replicas registered
  in etcd make a majority of the replica set by themselves: then the manager can promote one
  of them (it needs fresh positions from a majority) and that one can commit without this
  leader. Otherwise resigning gains nothing and costs a leader change: its silent followers
  may be dead (no majority to promote from), or, with RF 2, the one follower is no majority
  on its own: promoted, it could commit nothing either, would hear nothing from the old
  leader, and resign in turn, leadership bouncing between the two for as long as the cut
  lasts. So such a leader keeps leading, as before: its sync writes fail with
  ``unavailable`` until the followers are back, its reads and ``async`` writes go on. (Raft
  steps down regardless, and a two-member Raft group cut in two has no leader at all.)
- **What a resigned leader vouches for** (:func:`vouched_position`): not its last entry. Its
  own term's entries past the commit point were never acknowledged by a majority, and
  publishing them would make it look more up to date than the followers that hold every
  acknowledged write, so the manager would pick it again. It publishes the commit point of
  its term instead (or, if nothing of its term was committed, its last entry of an earlier
  term, any of which may have been acknowledged by an earlier leader).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Resignation:
    """A leader's resignation (for lack of a quorum, a hand-over, a newer term): its term, when
    (monotonic seconds), the position it vouches for (``(last_epoch, lsn)``, what the
    manager's promotion compares) and the record's ``designation`` it resigned under."""

    epoch: int
    at: float
    last_epoch: int
    lsn: int
    # Published with the position (``ReplicaPosition.resigned_on``): the manager designates a
    # resigned leader anew once per resignation, not at every plan while it holds off.
    designation: int
    # Set when this replica learnt its designation may be stale (deposed by a newer term, or
    # its own fence refused the epoch it won). It does not campaign again until the manager
    # designates anew (on fresh positions), however long.
    stale: bool = False


class QuorumCheck:
    """Whether the leader of one term has heard from a majority of its replica set lately.

    ``window_s`` is how long a follower's last reply counts as contact (0 or less: never
    resign). The leader counts itself. A follower starts as heard at the moment it joins the
    set (the term's start, or its addition), so a new leader has one window to reach its
    followers before it may resign.
    """

    def __init__(self, node_id: str, replicas: Iterable[str], *, window_s: float, now: float) -> None:
        self.node_id = node_id
        self.window_s = window_s
        self._heard: dict[str, float] = {}
        self.replicas: tuple[str, ...] = ()
        self.set_replicas(replicas, now)

    def set_replicas(self, replicas: Iterable[str], now: float) -> None:
        """The replica set changed (a replica moved): newcomers start as heard now."""
        self.replicas = tuple(replicas)
        self._heard = {n: self._heard.get(n, now) for n in self.replicas if n != self.node_id}

    def heard(self, node_id: str, now: float) -> None:
        """A follower answered (any reply on its replication link)."""
        if node_id in self._heard:
            self._heard[node_id] = max(self._heard[node_id], now)

    @property
    def majority(self) -> int:
        return len(self.replicas) // 2 + 1

    def in_contact(self, now: float) -> set[str]:
        """The replicas heard from within the window, the leader included."""
        recent = {n for n, at in self._heard.items() if now - at <= self.window_s}
        return recent | {self.node_id}

    def heard_within(self, node_id: str, now: float, within_s: float) -> bool:
        """Whether ``node_id`` answered in the last ``within_s`` seconds (a replica that just
        joined counts as heard when it joined)."""
        at = self._heard.get(node_id)
        return at is not None and now - at <= within_s

    def heard_after(self, node_id: str, since: float) -> bool:
        """Whether ``node_id`` answered after ``since`` (not merely counted as heard since it
        joined)."""
        at = self._heard.get(node_id)
        return at is not None and at > since

    def silent(self, now: float) -> list[str]:
        """The followers not heard from within the window."""
        return sorted(set(self._heard) - self.in_contact(now))

    def should_resign(self, now: float, live: Collection[str]) -> bool:
        """No majority heard from within the window, while the other replicas registered in
        etcd (``live``: node ids) make a majority by themselves, so the manager can promote
        one of them and it can commit without this leader. Never with RF 1 or 2."""
        if self.window_s <= 0 or len(self.in_contact(now)) >= self.majority:
            return False
        others = {n for n in self.replicas if n in live and n != self.node_id}
        return len(others) >= self.majority


def vouched_position(*, epoch: int, committed_lsn: int, term_start: tuple[int, int]) -> tuple[int, int]:
    """The ``(last_epoch, lsn)`` a leader of term ``epoch`` resigning for lack of a quorum
    publishes: the highest position holding every write that may have been acknowledged.

    ``term_start`` is ``(last_epoch, lsn)`` of its log when its term began (the entry before
    its no-op); ``committed_lsn`` is the highest LSN a majority acknowledged in its term.
    Entries of its own term past ``committed_lsn`` were never acknowledged (in ``sync``
    mode; in ``async`` mode they are what its followers had not acknowledged: the loss
    ``async`` accepts on a leader's loss). Entries of earlier terms may have been
    acknowledged by their leaders, so they are all vouched for.
    """
    if committed_lsn > term_start[1]:
        return epoch, committed_lsn
    return term_start
