"""The room a store has left to grow, and the reserve that sends may not use.

A store whose disk fills must still take the writes that drain it: receives, acks, nacks, and
on a backend node the replication log's entries for them and the small files that serving a
replica keeps (a new voting set, a remembered record). So sends are refused with
``unavailable`` ("disk full") while they would leave less than ``reserve`` bytes of room, and
everything else may use the reserve (docs/store.md, "Full disk or map"), as RabbitMQ blocks
publishers below its ``disk_free_limit`` and lets consumers go on. A refusal comes before
the send writes anything: on a backend node it ships no entry, so it does not end the
leader's term as a commit that fails on a full disk does.

Room is what the store can still write: the file system's free space (up to what the map may
still grow by) plus the pages LMDB has freed for reuse. Its file never shrinks, so space an
ack frees is room only as a free page: after a backlog once filled the disk, the free space
of the file system stays low for good, and only the free pages say whether sends fit again.
Counting them reads every database's page counts (about 7 us), so it is done only when the
file system alone is short of twice the reserve.
"""

from __future__ import annotations

import os
from typing import Any

from .environment import Environment

MIB = 1024 * 1024
# The default reserve: this share of the file system, within these bounds.
RESERVE_SHARE = 0.02
RESERVE_MIN = MIB
RESERVE_MAX = 1024 * MIB
# The most a journal holds between two checkpoints (checkpoint.py), on a disk large enough.
JOURNAL_MAX = 16 * MIB
# LMDB's two meta pages, never counted in any database.
_META_PAGES = 2


def default_reserve(path: str | os.PathLike[str], max_map_size: int) -> int:
    """2% of what the store may fill (the file system holding ``path``, or the largest its
    map may grow to if that is less), at least 1 MiB and at most 1 GiB."""
    fs = os.statvfs(path)
    capacity = min(fs.f_blocks * fs.f_frsize, max_map_size)
    return int(min(RESERVE_MAX, max(RESERVE_MIN, capacity * RESERVE_SHARE)))


def journal_limit(reserve: int) -> int:
    """How many bytes a journaling store appends before a checkpoint is due, at the latest:
    its reserve, within 1 MiB and :data:`JOURNAL_MAX`.

    Each of the journal's two files grows to the most one round between checkpoints wrote
    and never shrinks, and a checkpoint's reader keeps the pages freed meanwhile from reuse:
    room that no message uses. A round of a second of sends could take 16 MiB; on a disk of
    12 MiB that was a sixth of what messages could fill, and more the slower the sends came
    (session 52: 480 messages of 4 KiB fitted where 570 did). Bounded by the reserve, the
    journal takes about the share of the disk the reserve already keeps from sends."""
    return min(JOURNAL_MAX, max(MIB, reserve))


class RoomGauge:
    """Measures, inside the writer's transaction, how much the store may still grow."""

    def __init__(self, env: Environment, reserve: int) -> None:
        self.env = env
        self.reserve = reserve
        # What a refused send is told: which of the two limits the last measure found binding.
        self.full = "disk full"
        # Whether the last measure found the file system short of twice the reserve: only
        # pages LMDB freed are room then, and a journaling store's checkpoint reader keeps
        # the pages freed since it from reuse, so the writer takes a checkpoint after each
        # batch while short (group_commit.py), and what the gauge counts is what LMDB reuses.
        self.short = False

    def room(self, txn: Any) -> int:
        """Bytes the store can still write (in the writer thread, ``txn`` its open transaction)."""
        lmdb_env = self.env.env
        main = lmdb_env.stat()
        page = main["psize"]
        in_file = (lmdb_env.info()["last_pgno"] + 1) * page
        fs = os.statvfs(self.env.path)
        disk, in_map = fs.f_bavail * fs.f_frsize, max(0, self.env.max_map_size - in_file)
        growth = min(disk, in_map)
        self.full = "disk full" if disk <= in_map else "store is full"
        self.short = growth < 2 * self.reserve
        if not self.short:
            return growth
        used = _META_PAGES + main["branch_pages"] + main["leaf_pages"] + main["overflow_pages"]
        for db in self.env.dbs.values():
            stat = txn.stat(db)
            used += stat["branch_pages"] + stat["leaf_pages"] + stat["overflow_pages"]
        return growth + max(0, in_file // page - used) * page
