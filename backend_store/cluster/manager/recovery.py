"""Rebuilding a partition record that etcd holds unreadable and this manager never read
(pure, no I/O).

A record corrupted in etcd (or restored corrupted from a backup) is unknown to a manager
that never read it: neither absent nor known, so it plans nothing on it (coordination/
layout.py, ``read_partition_map``), and until session 36 the partition then stayed unserved
for good once its leader's key went (simulation seeds ``all`` 130247, 130473, 131005, 150376,
150652, 203853). The nodes that read it before still serve it on the record they last read
and publish that record (``NodeRecord.kept``); the manager writes it back from them:

- While a node holds the partition's leader key, its own kept record is written back as it
  is: it leads on it already, and nothing about the leadership changes.
- Otherwise the newest kept record (the highest ``designation``) is written back with no
  leader and a designation older than every incarnation, as if etcd had gone back in time.
  The next promotion then waits for fresh positions from a majority of its voters and
  designates the best copy any live node reports, stray or served, in the set or not
  (election.py, "After etcd went back in time"): a node that read an older version of the
  record may name an older voting set, and the best of that set alone may lack writes a
  newer one acknowledged.

A partition no live node reports a kept record for stays unknown (its replicas are kept as
strays, and nothing is placed anew for any queue until it can be read).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from dataclasses import replace

from ..coordination.layout import NodeRecord, PartitionRecord

log = logging.getLogger("pushgate.cluster")

# Older than every incarnation: the designation is stale, and promotion counts every copy.
NEVER_DESIGNATED = -1


def rebuilt_records(
    unknown: Collection[int], nodes: Mapping[str, NodeRecord], leaders: Mapping[int, str]
) -> dict[int, PartitionRecord]:
    """The records to write back for the ``unknown`` ids, from what the live ``nodes`` kept;
    ``leaders``: the node holding each partition's leader key."""
    out: dict[int, PartitionRecord] = {}
    for pid in sorted(unknown):
        kept = {n: rec.kept[pid] for n, rec in nodes.items() if rec.state == "up" and pid in rec.kept}
        holder = leaders.get(pid)
        if holder is not None:
            # Led now: only the leader's own record is taken (a leader that no longer serves
            # it gives its key up, and the next plan rebuilds without it).
            if holder in kept:
                out[pid] = kept[holder]
                log.warning(
                    "partition %d: its record cannot be read; written again as %s leads on it", pid, holder
                )
            continue
        if not kept:
            continue
        newest = max(kept.values(), key=lambda r: (r.designation, r.members, r.pack()))
        out[pid] = replace(newest, leader=None, successor=None, designated_in=NEVER_DESIGNATED)
        log.warning(
            "partition %d: its record cannot be read; rebuilt from what %s kept, with no leader until"
            " a promotion on fresh positions",
            pid,
            ", ".join(sorted(kept)),
        )
    return out
