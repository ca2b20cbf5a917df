"""Options every backend is built with, whatever its URL (each takes what applies to it)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .encryption import Keyring
from .tested_versions import ReleaseCheck

if TYPE_CHECKING:
    from .lmdb_store.commit_thread import CommitThread

# Held messages per queue, beyond which the embedded store writes receives (bounds memory, and
# the walk a receive makes past held entries after a release lowered the queue's skip hint).
DEFAULT_MAX_HELD = 1000


@dataclass(frozen=True, slots=True)
class StoreOptions:
    """Knobs shared by backends; each takes what applies to it."""

    keyring: Keyring | None = None
    map_size: int = 256 * 1024 * 1024
    max_map_size: int = 64 * 1024**3
    sweep_interval_s: float = 5.0
    # Replication log: keep at least this many recent batches (followers catch up from
    # them); 0 writes no log (a standalone store, see lmdb_store/replication_log.py).
    replication_log_keep: int = 0
    clock: Callable[[], float] | None = None
    # The embedded store's writer: at most this many operations share one commit (group
    # commit); 1 commits each alone (bench/store_bench.py's baseline, a test of batch rollback).
    max_batch: int = 1024
    # The embedded store holds up to this many received messages per queue in memory instead
    # of writing their state (docs/store.md); past it, receives are written.
    max_held: int = DEFAULT_MAX_HELD
    # Room on disk that sends may not use, so receives and acks can still drain a store whose
    # disk is full (lmdb_store/room.py); None: 2% of the file system (or of max_map_size, if
    # less), from 1 MiB to 1 GiB; 0: none, sends may fill the disk (tests of what a failed
    # commit costs).
    disk_reserve_bytes: int | None = None
    # The embedded store's journal (lmdb_store/checkpoint.py): whether it journals when it
    # can (False: LMDB syncs each commit itself, two fdatasyncs a commit when idle); a
    # checkpoint at least this often while it writes; what the journal syncs with (a test
    # counts through it; None: os.fdatasync); what starts the writeback of the LMDB file
    # between checkpoints (a test counts through it; None: lmdb_store/writeback.py's); and
    # the releases check the LMDB meta-page format is chosen by (None: the process's,
    # tested_versions.RELEASES).
    journal: bool = True
    checkpoint_interval_s: float = 1.0
    fdatasync: Callable[[int], None] | None = None
    writeback: Callable[[int], None] | None = None
    releases: ReleaseCheck | None = None
    # The thread LMDB stores commit on: None, one of each store's own; a backend node passes
    # one for all its replicas (lmdb_store/commit_thread.py).
    commit_thread: CommitThread | None = None
