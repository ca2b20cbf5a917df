"""Starting the kernel's writeback of a file without waiting for it (Linux's ``sync_file_range``).

Why: a journaling store commits to LMDB without syncs, and a checkpoint syncs the LMDB file
about once a second (``checkpoint.py``). Left to itself, the page cache keeps every page
written since the checkpoint before, and that sync writes them all at once; a journal sync
issued meanwhile, the one a caller waits for, queues behind them on the disk. Measured on a
2 vCPU VM whose 4 KiB fdatasync takes 0.08 ms: the journal syncs right after each
checkpoint began took 12-26 ms, once a second, which made the p99 of a paced send -> push
19-26 ms (bench/README.md, "Session 79"). Started every :data:`WRITEBACK_S` while the store
writes, the same pages go to the disk in small parts through the second, and the
checkpoint's sync finds little left to write.

It is a hint, never a promise: ``SYNC_FILE_RANGE_WRITE`` starts writing the file's dirty
pages and returns (it waits only if the disk's request queue is full, on the writer's thread,
never the event loop); it writes no metadata and flushes no disk cache.
Durability never depends on it (the journal's sync and the checkpoint's do that), so a
failed call is ignored. PostgreSQL does the same for the files its checkpoints write
(``checkpoint_flush_after``).

The ``os`` module has no ``sync_file_range``: this module is the one place that calls libc
through ``ctypes``. Where libc has no such call (not Linux), :func:`start_writeback` does
nothing and :data:`AVAILABLE` is False.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Callable

# How often a journal group starts the writeback of its members' LMDB files while they are
# written. LMDB writes its hot pages again with every commit, so starting it after each
# commit would write those pages to disk once per commit; every 50 ms writes each at most
# 20 times a second, and leaves a checkpoint at most 50 ms of pages to write.
WRITEBACK_S = 0.05

_SYNC_FILE_RANGE_WRITE = 2


def _load() -> Callable[[int, int, int, int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        # The process's own symbols, libc's among them: no search for the library (which
        # runs ldconfig, 2.5 ms at every import).
        call = ctypes.CDLL(None).sync_file_range
    except (OSError, AttributeError):
        return None
    call.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    call.restype = ctypes.c_int
    return call


_sync_file_range = _load()
AVAILABLE = _sync_file_range is not None


def start_writeback(fd: int) -> None:
    """Start writing every dirty page of ``fd``'s file to the disk; return at once."""
    if _sync_file_range is not None:
        # ctypes releases the GIL for the call; it returns -1 only for a bad descriptor or
        # a file that cannot be written back (a pipe), which is nothing to act on.
        _sync_file_range(fd, 0, 0, _SYNC_FILE_RANGE_WRITE)
