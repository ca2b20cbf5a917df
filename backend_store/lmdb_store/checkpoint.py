"""Checkpoints of a journaling store, and its recovery after a crash (docs/store.md, "Durability").

A journaling store (a standalone one, or a node's partition replica) commits to LMDB without
syncs and makes each batch durable with one sync of the journal (``journal.py``): each commit
is journaled as every change its transaction made (``recorded_txn.py``), under the commit's
journal sequence number, which the same transaction stores under :data:`JOURNAL_SEQ`. About
once a second (or every few MiB of journal, ``room.journal_limit``, or after each batch while
the disk is short of room), between batches, the writer takes a checkpoint:

1. a read transaction on the newest commit: LMDB reuses a page only once every reader older
   than the commit that freed it is gone, so while this reader lives no page of the
   checkpoint's tree is written again, whatever the commits after it write; and that
   commit's two meta pages (``meta_pages.py``), read as it wrote them;
2. one sync of the LMDB file: the checkpoint's tree is on disk;
3. both meta pages saved in the ``checkpoint`` file with the commit's journal sequence
   number, synced and renamed into place;
4. the reader of the checkpoint before is let go: every journal entry up to the
   checkpoint's is dead.

Steps 2 and 3 run on a thread of their own when the checkpoint is merely due
(:meth:`Journaling.begin`), the writer committing meanwhile into the journal's other file;
on the writer's thread where it must be taken before the writer goes on
(:meth:`Journaling.checkpoint`, which then writes the journal's file from its start again).

So after a crash of the machine, the LMDB file holds the checkpoint's tree whole, whatever
became of the pages and meta pages written after it. Recovery (:func:`restore_meta_pages`,
then :func:`replay`) writes the saved meta pages back, opens LMDB at the checkpoint and
applies the journal's entries after its sequence number, up to the first torn one. A process
crash needs the same and nothing more: the page cache kept what was written.

A clean stop takes a last checkpoint marked ``clean``: the file is then whole as it is, and
the next start writes nothing back (a store copied, or changed by a tool, after a clean stop
is taken as it is found). The first checkpoint of a run is marked unclean again.
"""

from __future__ import annotations

import logging
import os
import struct
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lmdb

from ..durable import fsync_directory
from ..errors import Unavailable
from ..private_files import FILE_MODE
from . import meta_pages
from .environment import Db, Environment
from .journal import Journal, journaled_after
from .keys import read_u64, u64
from .recorded_txn import Change, RecordedTxn
from .records import pack, unpack

log = logging.getLogger("pushgate.store")

CHECKPOINT_FILE = "checkpoint"
# The journal's two files (journal.py).
JOURNAL_FILES = ("journal", "journal.b")
DATA_FILE = "data.mdb"
# The journal sequence number of the newest journaled commit, written by that commit.
JOURNAL_SEQ = b"\0sys\0journal_seq"
_MAGIC = b"PGCKPT2\0"
# magic, journal sequence number, LMDB transaction id, clean (0/1), page size; then the two
# pages, then a CRC-32.
_HEAD = struct.Struct("<8sQQBI")
_CRC = struct.Struct("<I")
# Replayed entries per LMDB transaction.
_REPLAY_BATCH = 256


@dataclass(frozen=True, slots=True)
class SavedCheckpoint:
    seq: int
    txnid: int
    clean: bool
    meta: meta_pages.MetaPages


def load(directory: Path) -> SavedCheckpoint | None:
    """The checkpoint saved in ``directory`` (None: none, a store that never journaled)."""
    try:
        raw = (directory / CHECKPOINT_FILE).read_bytes()
    except FileNotFoundError:
        return None
    if (
        len(raw) < _HEAD.size + _CRC.size
        or zlib.crc32(raw[: -_CRC.size]) != _CRC.unpack(raw[-_CRC.size :])[0]
    ):
        raise Unavailable(f"the checkpoint file of {directory} is damaged; restore the store from a backup")
    magic, seq, txnid, clean, page_size = _HEAD.unpack_from(raw, 0)
    pages = raw[_HEAD.size : -_CRC.size]
    if magic != _MAGIC or len(pages) != 2 * page_size:
        raise Unavailable(f"the checkpoint file of {directory} is not one this version writes")
    meta = meta_pages.MetaPages(page_size, (pages[:page_size], pages[page_size:]))
    return SavedCheckpoint(seq, txnid, bool(clean), meta)


def save(directory: Path, checkpoint: SavedCheckpoint) -> None:
    """Write the checkpoint file whole, synced, then rename it into place (and sync that)."""
    meta = checkpoint.meta
    body = (
        _HEAD.pack(_MAGIC, checkpoint.seq, checkpoint.txnid, int(checkpoint.clean), meta.page_size)
        + meta.pages[0]
        + meta.pages[1]
    )
    temporary = directory / f"{CHECKPOINT_FILE}.{os.getpid()}.tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    try:
        os.write(fd, body + _CRC.pack(zlib.crc32(body)))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, directory / CHECKPOINT_FILE)
    fsync_directory(directory)


def restore_meta_pages(directory: Path) -> SavedCheckpoint | None:
    """Before LMDB opens: after a run that did not stop cleanly, write the checkpoint's meta
    pages back; return that checkpoint (None: nothing to recover)."""
    saved = load(directory)
    if saved is None or saved.clean:
        return None
    for number, page in enumerate(saved.meta.pages):
        meta_pages.check_page(page, number)
    data_file = directory / DATA_FILE
    try:
        found = meta_pages.read(data_file, saved.meta.page_size)
    except meta_pages.UnsupportedFormat:
        found = None  # a meta page torn by the crash: what the saved ones are for
    if found is not None and found.newest_txnid < saved.txnid:
        # Both meta pages whole and older than the checkpoint: this is not the file the
        # journal was written for (copied over it?), and writing meta pages into it would
        # point them at pages it does not have.
        raise Unavailable(
            f"the data file of {directory} is older than its checkpoint (transaction "
            f"{found.newest_txnid} < {saved.txnid}): it was replaced after an unclean stop. "
            f"Remove {directory / CHECKPOINT_FILE} to open it as it is, or restore a backup"
        )
    meta_pages.write_back(data_file, saved.meta)
    return saved


def replay(env: Environment, saved: SavedCheckpoint) -> int:
    """Apply the journal's entries after the checkpoint to ``env`` (opened at it); return how
    many. The environment is synced by the checkpoint the writer takes next."""
    seq = read_seq(env)
    if seq != saved.seq:
        raise Unavailable(
            f"store {env.path} opened at journal entry {seq}, not at its checkpoint's "
            f"{saved.seq}: restore it from a backup"
        )
    entries = iter(journaled_after(journal_paths(env.path), saved.seq))
    count = 0
    while True:
        chunk = [entry for _, entry in zip(range(_REPLAY_BATCH), entries, strict=False)]
        if not chunk:
            break
        while True:
            try:
                _apply(env, chunk)
                break
            except lmdb.MapFullError:
                if not env.grow():
                    raise
        count += len(chunk)
    if count:
        log.warning("store %s: %d journaled commits replayed after an unclean stop", env.path, count)
    return count


def _apply(env: Environment, chunk: list[tuple[int, bytes]]) -> None:
    """Redo journaled commits: each entry holds every change its commit made, its journal
    sequence number and (a replica's) LSN and fence among them."""
    dbs = env.dbs
    with env.begin_write() as txn:
        for _seq, payload in chunk:
            for db, key, value in unpack(payload):
                if value is None:
                    txn.delete(key, db=dbs[Db(db)])
                else:
                    txn.put(key, value, db=dbs[Db(db)])


def mark_clean(env: Environment) -> None:
    """A store opened without journaling (sharing its files) whose journaling run did not
    stop cleanly: that run was killed, and the page cache kept all it committed. Sync it all
    and mark the checkpoint clean before the first commit of this run, which the journal
    would not hold (a recovery later would undo it)."""
    saved = load(env.path)
    if saved is None or saved.clean:
        return
    env.sync()
    save(env.path, SavedCheckpoint(saved.seq, saved.txnid, True, saved.meta))
    log.warning("store %s: a journaling run did not stop cleanly; synced and marked clean", env.path)


def journal_paths(directory: Path) -> tuple[Path, Path]:
    return (directory / JOURNAL_FILES[0], directory / JOURNAL_FILES[1])


def read_seq(env: Environment) -> int:
    """The journal sequence number of the newest journaled commit (0: none yet)."""
    raw = env.read(lambda txn: txn.get(JOURNAL_SEQ, db=env.dbs[Db.META]))
    return read_u64(raw) if raw else 0


@dataclass(slots=True)
class _InFlight:
    """A checkpoint whose data sync runs on a thread of its own."""

    reader: Any
    saved: SavedCheckpoint
    thread: threading.Thread | None = None
    error: BaseException | None = None


class Journaling:
    """The writer's side of a journaling store: the journal, and its checkpoints.

    Writer thread only. ``clock`` (monotonic seconds) times the checkpoints; ``fdatasync``
    is what the journal and the checkpoints' syncs of the LMDB file use (a test counts, or
    holds, the syncs through it).

    A checkpoint that is merely due (its interval passed, or the journal grew past
    ``max_bytes``) syncs the LMDB file on a thread of its own (:meth:`begin`): the writer
    commits meanwhile, into the journal's other file (``Journal.switch``), and the LMDB
    file's sync no longer stops it (it took 9-68 ms under load). One runs at a time, and only
    while the journal's other file is free (the checkpoint before was saved); otherwise, and
    where a checkpoint must be taken before the writer goes on (a full map or disk, a failed
    journal write, a clean stop), :meth:`checkpoint` takes it on the writer's thread."""

    def __init__(
        self,
        env: Environment,
        *,
        interval_s: float = 1.0,
        max_bytes: int = 16 << 20,
        clock: Callable[[], float] = time.monotonic,
        fdatasync: Callable[[int], None] = os.fdatasync,
    ) -> None:
        self._env = env
        self._interval_s = interval_s
        self._max_bytes = max_bytes
        self._clock = clock
        self._fdatasync = fdatasync
        self.journal = Journal(journal_paths(env.path), fdatasync)
        # The LMDB file, for its syncs (an fdatasync of any descriptor of a file syncs it).
        self._data_fd = os.open(env.path / DATA_FILE, os.O_RDONLY)
        # The journal sequence number of the newest journaled commit (the one LMDB holds).
        self.seq = read_seq(env)
        self._pinned: Any = None  # the read transaction on the last checkpoint
        self._in_flight: _InFlight | None = None
        # Whether the journal's other file holds only entries of saved checkpoints.
        self._other_free = True
        self._last = clock()
        # After a failed checkpoint, the next is not tried before this (monotonic seconds).
        self._retry_at = 0.0
        self.checkpoints = 0

    def stamp(self, txn: RecordedTxn) -> int:
        """Before a commit that changed something: write its journal sequence number in
        it (recorded, so a replay restores it too); return that number."""
        seq = self.seq + 1
        txn.put(JOURNAL_SEQ, u64(seq), db=self._env.dbs[Db.META])
        return seq

    def record(self, seq: int, changes: list[Change]) -> None:
        """After that commit: append its changes (no sync). Its number is taken even if the
        write fails (the writer then takes a checkpoint before anyone hears of it)."""
        self.seq = seq
        self.journal.append(seq, pack(changes))

    def sync(self) -> None:
        self.journal.sync()

    @property
    def in_flight(self) -> bool:
        return self._in_flight is not None

    def seconds_until_due(self) -> float | None:
        """How long until a checkpoint is due (None: nothing journaled since the last, or
        one is under way)."""
        if not self.journal.written or self._in_flight is not None:
            return None
        due = self._retry_at if self.journal.written >= self._max_bytes else self._last + self._interval_s
        return max(0.0, max(due, self._retry_at) - self._clock())

    def checkpoint(self, *, clean: bool = False) -> None:
        """Take a checkpoint of the newest commit on this thread (steps in the module's
        docstring), after the one under way, if any."""
        self.complete()
        reader, saved = self._pin(clean)
        try:
            self._fdatasync(self._data_fd)
            save(self._env.path, saved)
        except BaseException:
            reader.abort()
            self._retry_at = self._clock() + self._interval_s
            raise
        self.journal.rewind()
        self._saved(reader)

    def begin(self, done: Callable[[], None]) -> bool:
        """Start a checkpoint of the newest commit whose sync of the LMDB file and saving run
        on a thread of its own, which calls ``done`` when they are over (the writer then
        calls :meth:`complete`). False: none started (one is under way, or the journal's
        other file still holds entries no saved checkpoint has)."""
        if self._in_flight is not None or not self._other_free:
            return False
        reader, saved = self._pin(clean=False)
        # Entries from here on go to the other file: this one keeps those the checkpoint
        # before needs until this one is saved.
        try:
            self.journal.switch()
        except BaseException:
            reader.abort()
            raise
        self._other_free = False
        flight = _InFlight(reader, saved)
        flight.thread = threading.Thread(
            target=self._sync_and_save, args=(flight, done), name="pushgate-checkpoint", daemon=True
        )
        self._in_flight = flight
        flight.thread.start()
        return True

    def _sync_and_save(self, flight: _InFlight, done: Callable[[], None]) -> None:
        try:
            self._fdatasync(self._data_fd)
            save(self._env.path, flight.saved)
        except BaseException as exc:
            flight.error = exc
        done()

    def complete(self) -> None:
        """Finish the checkpoint under way, if any (waiting for its thread); raise what it
        failed with. After a failure the next checkpoint is taken on the writer's thread."""
        flight, self._in_flight = self._in_flight, None
        if flight is None:
            return
        assert flight.thread is not None
        flight.thread.join()
        if flight.error is not None:
            flight.reader.abort()
            self._retry_at = self._clock() + self._interval_s
            raise flight.error
        self._saved(flight.reader)

    def _pin(self, clean: bool) -> tuple[Any, SavedCheckpoint]:
        """A read transaction on the newest commit (it keeps that tree's pages from reuse),
        and what a checkpoint of it saves: its meta pages as the commit wrote them (the
        page cache's, synced or not: the checkpoint saves them only after the LMDB file's
        sync has made the tree they name durable)."""
        env = self._env
        reader = env.env.begin()
        try:
            txnid = reader.id()
            raw = reader.get(JOURNAL_SEQ, db=env.dbs[Db.META])
            meta = meta_pages.read(env.path / DATA_FILE, env.env.stat()["psize"])
            if meta.newest_txnid != txnid:
                raise meta_pages.UnsupportedFormat(
                    f"the newest meta page is of transaction {meta.newest_txnid}, not {txnid}"
                )
        except BaseException:
            reader.abort()
            self._retry_at = self._clock() + self._interval_s
            raise
        return reader, SavedCheckpoint(read_u64(raw) if raw else 0, txnid, clean, meta)

    def _saved(self, reader: Any) -> None:
        """A checkpoint is saved: its reader replaces the one before, and every entry the
        journal's other file holds is in it."""
        previous, self._pinned = self._pinned, reader
        if previous is not None:
            previous.abort()
        self._other_free = True
        self._last = self._clock()
        self.checkpoints += 1

    def finish(self) -> None:
        """A clean stop: the last checkpoint, marked clean; the journal closed."""
        try:
            self.checkpoint(clean=True)
        finally:
            self.release()

    def release(self) -> None:
        flight, self._in_flight = self._in_flight, None
        if flight is not None and flight.thread is not None:
            flight.thread.join()
            flight.reader.abort()
        if self._pinned is not None:
            self._pinned.abort()
            self._pinned = None
        self.journal.close()
        os.close(self._data_fd)
