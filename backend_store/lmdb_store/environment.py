"""The LMDB environment: its named databases, map growth, safe read transactions, and the
views of a transaction (:class:`View` reads, :class:`Writes` also records every mutation).

LMDB allows changing the map size only while this process has no transaction open,
so readers hold a shared gate and the writer takes it exclusively to grow the map.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from enum import IntEnum
from pathlib import Path
from typing import Any, Protocol, TypeVar

import lmdb

from ..errors import Unavailable
from ..private_files import FILE_MODE, private_dir
from ..types import StorageUsage
from .records import QueueRecord

log = logging.getLogger("pushgate.store")
T = TypeVar("T")


class Db(IntEnum):
    """Named databases; the number is how replication records name them."""

    META = 0
    QUEUES = 1
    QIDS = 2
    MSGS = 3
    VIS = 4
    GROUPS = 5
    DEDUPE = 6
    DEDUPE_EXP = 7
    REPLOG = 8
    STATE = 9
    EXPIRY = 10


class _SharedGate:
    """Many readers or one resizer."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._resizing = False

    @contextmanager
    def shared(self) -> Iterator[None]:
        with self._cond:
            while self._resizing:
                self._cond.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                if not self._readers:
                    self._cond.notify_all()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cond:
            self._resizing = True
            while self._readers:
                self._cond.wait()
        try:
            yield
        finally:
            with self._cond:
                self._resizing = False
                self._cond.notify_all()


class Environment:
    """One LMDB environment per path per process.

    ``journaled``: LMDB syncs nothing; the journal and its checkpoints make commits durable
    (checkpoint.py). Otherwise, as follows.

    ``sync_meta``: whether a commit also syncs its meta page (LMDB's ``metasync``), which is
    what makes it durable. Without it a commit still syncs its data pages before it writes
    the meta page, so a crash of the machine can undo the last commits but never corrupt
    the store (LMDB's ``MDB_NOMETASYNC``), and a process crash loses nothing (the page cache
    keeps the meta page); the next commit's data sync, or :meth:`sync`, makes it durable.
    The group-commit writer tells a batch's callers only once it is (group_commit.py,
    ``_settle``): under load one fdatasync per commit instead of two, and a batch of
    receives only never waits for one of its own."""

    def __init__(
        self, path: Path, map_size: int, max_map_size: int, *, sync_meta: bool = True, journaled: bool = False
    ) -> None:
        private_dir(path)
        self.path = path
        self.max_map_size = max(map_size, max_map_size)
        self.map_size = map_size
        self._gate = _SharedGate()
        self.closed = False
        self._open(sync_meta=sync_meta, journaled=journaled)

    def _open(self, *, sync_meta: bool, journaled: bool) -> None:
        self.sync_meta = sync_meta
        self.journaled = journaled
        try:
            self.env = lmdb.open(
                str(self.path),
                map_size=self.map_size,
                max_dbs=len(Db),
                sync=not journaled,
                metasync=sync_meta,
                readahead=False,
                max_readers=256,
                mode=FILE_MODE,  # data.mdb and lock.mdb: only the owner (backend_store/private_files.py)
            )
        except lmdb.Error as exc:
            raise Unavailable(f"cannot open store at {self.path}: {exc}") from None
        # The file may already be bigger than asked (another process grew it).
        self.map_size = max(self.map_size, self.env.info()["map_size"])
        self.dbs: dict[Db, Any] = {db: self.env.open_db(db.name.lower().encode()) for db in Db}
        # Each handle's number: what a journaled change names its database by (recorded_txn.py).
        self.db_numbers: dict[Any, int] = {handle: int(db) for db, handle in self.dbs.items()}

    def reopen(self, *, journaled: bool) -> None:
        """Reopen journaled or with LMDB syncing each commit's data pages (a standalone
        store that now shares its files with another process, or is alone again). Writer
        thread only, with no transaction of its own open and every commit synced."""
        with self._gate.exclusive():
            self.env.close()
            self._open(sync_meta=False, journaled=journaled)

    def read(self, fn: Callable[[Any], T]) -> T:
        """Run ``fn(txn)`` in a short read transaction (call from a worker thread)."""
        try:
            with self._gate.shared():
                self._check_open()
                try:
                    with self.env.begin(buffers=False) as txn:
                        return fn(txn)
                except lmdb.MapResizedError:
                    # Another process grew the map: adopt its size and retry once.
                    pass
            self._adopt_resize()
            with self._gate.shared():
                self._check_open()
                with self.env.begin(buffers=False) as txn:
                    return fn(txn)
        except lmdb.Error as exc:
            log.error("LMDB read failed: %s", exc)
            raise Unavailable("store read failed") from None

    def _check_open(self) -> None:
        if self.closed:
            raise Unavailable("store is closed")

    def begin_write(self) -> Any:
        try:
            return self.env.begin(write=True)
        except lmdb.MapResizedError:
            self._adopt_resize()
            return self.env.begin(write=True)

    def _adopt_resize(self) -> None:
        with self._gate.exclusive():
            self.env.set_mapsize(0)
            self.map_size = self.env.info()["map_size"]

    def sync(self) -> None:
        """Make every commit so far durable (one fdatasync). Writer thread only."""
        self.env.sync(True)

    def grow(self) -> bool:
        """Double the map (up to the maximum); return whether it grew. Writer thread only."""
        if self.map_size >= self.max_map_size:
            return False
        new_size = min(self.map_size * 2, self.max_map_size)
        with self._gate.exclusive():
            try:
                self.env.set_mapsize(new_size)
            except lmdb.Error as exc:
                log.error("cannot grow the LMDB map to %d bytes: %s", new_size, exc)
                return False
        log.warning("LMDB map grown from %d to %d bytes", self.map_size, new_size)
        self.map_size = new_size
        return True

    def usage(self) -> StorageUsage:
        """Pages in use (up to the last one ever written) against the map, from LMDB's own info."""
        with self._gate.shared():
            self._check_open()
            info = self.env.info()
            page = self.env.stat()["psize"]
        return StorageUsage((info["last_pgno"] + 1) * page, self.map_size, self.max_map_size)

    def copy_to(self, target: Path) -> None:
        """A consistent snapshot (for re-seeding followers and backups)."""
        private_dir(target)
        with self._gate.shared():
            self._check_open()
            self.env.copy(str(target), compact=True)

    def close(self) -> None:
        """Close once no read is running; reads that come later get :class:`Unavailable`."""
        with self._gate.exclusive():
            self.closed = True
            if not self.sync_meta or self.journaled:
                # A clean stop leaves nothing for a later machine crash to undo.
                with suppress(lmdb.Error):
                    self.env.sync(True)
            self.env.close()


# Less room than this left on the store's file system counts as full (LMDB writes pages
# of 4 KiB in runs; a few stray blocks left over are no room).
_FULL_BELOW_BYTES = 1 << 20


def is_disk_full(exc: BaseException, path: Path | None = None) -> bool:
    """Whether a failed write means the disk is full.

    LMDB reports a short write as EIO, not ENOSPC (``mdb_page_flush``: "short write,
    filesystem full?"), which is what a full disk gives it; so an EIO is taken as a full
    disk when the store's file system has (almost) no room left."""
    if not isinstance(exc, lmdb.Error):
        return False
    if getattr(exc, "errno", None) == errno.ENOSPC or "No space left" in str(exc):
        return True
    if path is None or not (getattr(exc, "errno", None) == errno.EIO or "Input/output error" in str(exc)):
        return False
    try:
        fs = os.statvfs(path)
    except OSError:
        return False
    return fs.f_bavail * fs.f_frsize < _FULL_BELOW_BYTES


class View:
    """Reads over one transaction, by :class:`Db` name."""

    __slots__ = ("dbs", "txn")

    def __init__(self, txn: Any, dbs: dict[Db, Any]) -> None:
        self.txn = txn
        self.dbs = dbs

    def get(self, db: Db, key: bytes) -> bytes | None:
        value: bytes | None = self.txn.get(key, db=self.dbs[db])
        return value

    def cursor(self, db: Db) -> Any:
        return self.txn.cursor(db=self.dbs[db])


# (tenant, queue) pairs whose messages became visible now or later: listeners wake them.
Touched = set[tuple[str, str]]


class RoomMeasure(Protocol):
    """What a write transaction asks of the room it may grow by (room.py's ``RoomGauge``)."""

    reserve: int
    # The refusal's detail when a send would not fit: "disk full" or "store is full".
    full: str

    def room(self, txn: Any) -> int: ...


class Writes(View):
    """The write side of a transaction; counts its writes (:class:`LoggedWrites` also records
    them, for a store that keeps a replication log)."""

    __slots__ = (
        "_room_left",
        "dirty_queues",
        "events",
        "index_listener",
        "on_abort",
        "queue_cache",
        "queue_saves",
        "room_gauge",
        "touched",
        "write_count",
    )

    # How many times the store keeps what a send writes: its record (LoggedWrites: and the
    # log entry that carries it to followers).
    copies = 1

    def __init__(self, txn: Any, dbs: dict[Db, Any]) -> None:
        super().__init__(txn, dbs)
        # Puts and deletes that changed something (the writer checks whether an operation
        # wrote, and whether a batch did). A count, not a list: nobody reads a standalone
        # store's mutations, and recording each showed in profiles.
        self.write_count = 0
        # (tenant, queue) pairs whose messages became visible now or later: listeners wake them.
        self.touched: Touched = set()
        # Decoded queue records for the whole batch (most operations of a batch hit the
        # same few queues); changed records are written once, when the batch ends.
        self.queue_cache: dict[bytes, QueueRecord] = {}
        self.dirty_queues: dict[bytes, QueueRecord] = {}
        self.queue_saves = 0
        # Dead-letter moves and expiries of this transaction, (tenant, queue, kind) -> count:
        # reported to event listeners once it commits (backend_store.backend.MessageEvents).
        self.events: dict[tuple[str, str, str], int] = {}
        # Undos of in-memory changes made with this transaction (holds.py), run if it aborts.
        self.on_abort: list[Callable[[], object]] = []
        # Told of every visibility entry put (queue id, key): the skip hints of holds.py.
        self.index_listener: Callable[[int, bytes], None] | None = None
        # Measures the room the store has left (room.py; None: never short of room), once
        # per transaction, when a send or the log's trimming first asks.
        self.room_gauge: RoomMeasure | None = None
        self._room_left: int | None = None

    def _room(self) -> int:
        """Room left beyond the reserve, less what this transaction's sends took of it."""
        assert self.room_gauge is not None
        if self._room_left is None:
            self._room_left = self.room_gauge.room(self.txn) - self.room_gauge.reserve
        return self._room_left

    def no_room_for(self, nbytes: int) -> str | None:
        """None when sends of ``nbytes`` of bodies leave the reserve untouched (room.py), and
        they are counted against the room, so a batch's sends add up; else why they do not
        fit (``disk full`` or ``store is full``)."""
        if self.room_gauge is None:
            return None
        left = self._room() - nbytes * self.copies
        if left < 0:
            return self.room_gauge.full
        self._room_left = left
        return None

    def short_of_room(self) -> bool:
        """Whether the room left is within twice the reserve: the replication log then keeps
        only what it must (replication_log.py), so acks free room on a backend node too."""
        return self.room_gauge is not None and self._room() < self.room_gauge.reserve

    def note(self, tenant: str, queue: str, kind: str, count: int = 1) -> None:
        key = (tenant, queue, kind)
        self.events[key] = self.events.get(key, 0) + count

    def flush_queues(self) -> None:
        for key, record in self.dirty_queues.items():
            self.put(Db.QUEUES, key, record.encode())
        self.dirty_queues.clear()

    def put(self, db: Db, key: bytes, value: bytes) -> None:
        self.txn.put(key, value, db=self.dbs[db])
        self.write_count += 1

    def delete(self, db: Db, key: bytes) -> bool:
        deleted: bool = self.txn.delete(key, db=self.dbs[db])
        if deleted:
            self.write_count += 1
        return deleted


class LoggedWrites(Writes):
    """Writes that record every mutation, so followers can replay them, and keep each changed
    key's before-image, so the replication log can undo the batch later (a deposed leader
    truncating what nobody acknowledged). Used when the store keeps a log;
    ``replace``/``pop`` cost the same B-tree walk as ``put``/``delete``."""

    __slots__ = ("mutations", "undo")
    copies = 2

    def __init__(self, txn: Any, dbs: dict[Db, Any]) -> None:
        super().__init__(txn, dbs)
        self.mutations: list[tuple[int, bytes, bytes | None]] = []
        self.undo: list[list[Any]] = []

    def put(self, db: Db, key: bytes, value: bytes) -> None:
        self.undo.append([db, key, self.txn.replace(key, value, db=self.dbs[db])])
        self.mutations.append((db, key, value))
        self.write_count += 1

    def delete(self, db: Db, key: bytes) -> bool:
        old = self.txn.pop(key, db=self.dbs[db])
        if old is None:
            return False
        self.undo.append([db, key, old])
        self.mutations.append((db, key, None))
        self.write_count += 1
        return True
