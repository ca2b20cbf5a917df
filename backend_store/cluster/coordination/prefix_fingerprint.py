"""The watch's periodic check without reading every record: a prefix's fingerprint.

A watch of a prefix (``EtcdCoordinator.watch_prefix``) checks what its events built every
``reread_every_s`` (2 s on nodes and managers). It used to read the whole prefix to do so: at
10,000 queues each node, manager and gateway read 3.3 MB of ``queues/`` every few seconds,
and etcd spent 0.6-0.8 ms of CPU per send serving those reads while nothing under the prefix
changed (0.2 with the reads 15 times rarer; issue 49, bench/README.md "Session 58").

Now a check asks etcd for one small answer: its revision, how many keys the prefix holds,
and the newest mod revision among them (a range sorted by mod revision, limit 1, keys only:
no value is sent). Against the state the events built:

- etcd's revision older than the state's: etcd went back (restored, or replaced): read whole;
- the same count and the same newest mod revision: nothing under the prefix changed since
  the state's newest write; etcd's later revision is other keys' (the state is etcd's read
  at that revision, and is handed on as of it: ``WatchedPrefix.caught_up`` needs that);
- otherwise events may be on their way: wait for the next check, and read whole only if the
  state has not caught up by then with what this check saw (the events missed something).

etcd's work for a fingerprint grows with the keys (it sorts them), so a large prefix is
checked less often (:func:`check_interval`). What a fingerprint cannot see is an event
missed and then hidden by a later one on another key (the count and the newest write agree
again): a whole read still comes for that (:func:`whole_read_interval`). etcd delivers a
watch's events in order or breaks the stream (and a broken stream is read whole), so that
read is a safety net, not the path; a large prefix is read whole less often, so that the
net costs a watcher and etcd about the same whatever the prefix holds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

from .coordinator import PrefixState

# How often a watch still reads its prefix whole (see the module docstring), at least.
WHOLE_READ_EVERY_S = 30.0
# The whole read's seconds per key under the prefix, past ``WHOLE_READ_EVERY_S``. A whole
# read of 10,000 queue records costs etcd about 69 ms of CPU and the reader 66 ms, plus its
# comparison with the state held (session 60); every 30 s, the six watchers of ``queues/``
# on a 3-node dev cluster spent about 30 ms of CPU a second on them at 10,000 queues, idle
# or not (session 64). One read per 15 ms a key keeps one watcher's net under about 1% of a
# core whatever the prefix holds: every 30 s up to 2,000 keys, 150 s at 10,000.
WHOLE_READ_S_PER_KEY = 0.015
# A check's seconds per key under the prefix, past ``reread_every_s``. The answer is small,
# the work is not: to sort by mod revision etcd reads every key's record, about 2.2 us of its
# CPU a key (22 ms at 10,000 queue records against 0.5 ms for a few keys; session 60). At a
# check every 2 s, the six watchers of ``queues/`` on a 3-node dev cluster cost etcd 60 ms of
# CPU a second at 10,000 queues, idle or not. A larger prefix is checked less often, so that
# one watcher's checks cost etcd at most about 0.1% of a core whatever the prefix holds:
# every 2 s up to 1,000 keys, 20 s at 10,000. (At 0.5 ms a key, a check every 5 s at 10,000,
# the checks were still a third of a dev cluster's idle CPU holding 10,000 inboxes, about
# 27 of etcd's 45 ms a second; session 78.)
CHECK_S_PER_KEY = 0.002


@dataclass(frozen=True, slots=True)
class Fingerprint:
    """What one small read says of a prefix."""

    revision: int  # etcd's, at the read
    count: int  # keys under the prefix
    newest: int  # the newest mod revision among them (0: none)


class Verdict(Enum):
    SAME = "same"  # the state is etcd's as of the fingerprint's revision
    WAIT = "wait"  # events may be on their way: look again at the next check
    READ = "read"  # read the prefix whole


def whole_read_interval(reread_every_s: float, keys: int) -> float:
    """Seconds between a watch's whole reads of a prefix holding ``keys`` keys: at least
    :data:`WHOLE_READ_EVERY_S` (and ``reread_every_s``), longer for a large prefix
    (:data:`WHOLE_READ_S_PER_KEY`)."""
    return max(reread_every_s, WHOLE_READ_EVERY_S, keys * WHOLE_READ_S_PER_KEY)


def check_interval(reread_every_s: float, keys: int) -> float:
    """Seconds until a watch of a prefix holding ``keys`` keys checks it again: its
    ``reread_every_s``, longer for a large prefix (:data:`CHECK_S_PER_KEY`), never past
    :data:`WHOLE_READ_EVERY_S`: what a check sees (etcd gone back, an event missed) is
    seen within that, however rare the whole reads of a large prefix."""
    return max(reread_every_s, min(keys * CHECK_S_PER_KEY, WHOLE_READ_EVERY_S))


def check_due(now: float, interval_s: float) -> float:
    """When a check ``interval_s`` apart from the last, made at ``now``, falls due: the next
    multiple of ``interval_s`` on the monotonic clock at least half an interval away. So a
    process's watches of one interval check at the same moments, and those checks go to
    etcd together (``fingerprint_batch.py``); a check made late by a busy loop keeps its
    place, the next one interval on."""
    return (math.floor((now + interval_s / 2) / interval_s) + 1) * interval_s


def newest_write(state: PrefixState) -> int:
    """The newest mod revision among the state's keys (0: none)."""
    return max((entry.mod_revision for entry in state.entries.values()), default=0)


def judge(state: PrefixState, seen: Fingerprint, doubt: int | None) -> tuple[Verdict, int | None]:
    """What a check makes of ``seen`` against the watch's ``state``, and the doubt to carry
    to the next check: a revision the state must have reached by then (``doubt``, this
    check's, from the one before; None: no doubt)."""
    if seen.revision < state.revision:
        return Verdict.READ, None  # etcd went back
    if seen.count == len(state.entries) and seen.newest == newest_write(state):
        return Verdict.SAME, None
    if doubt is not None and state.revision < doubt:
        return Verdict.READ, None  # a check ago etcd had changes the events never brought
    # A write on its way is at the newest mod revision; a deletion on its way, at most at
    # etcd's revision. Nothing can be on its way at or below the state's own revision.
    ahead = seen.newest if seen.newest > state.revision else seen.revision
    if ahead <= state.revision:
        return Verdict.READ, None
    return Verdict.WAIT, ahead
