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

A journal belongs to a :class:`JournalGroup`: a store alone has one of its own in its
directory; a backend node's replicas share one beside their directories, written by the
node's one commit thread (``commit_thread.py``), so that one sync makes a round of every
replica's commits durable. The group numbers its members' commits in one sequence, tags
each entry with its member's directory name, checkpoints every member at once, and recovers
every member once, at the node's start, before any of them opens (:meth:`JournalGroup.recover`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lmdb

from ..durable import fsync_directory
from ..errors import Unavailable
from ..private_files import FILE_MODE
from . import meta_pages
from .environment import Db, Environment
from .journal import Journal, journaled_after, newest_seq
from .keys import read_u64, u64
from .recorded_txn import Change, RecordedTxn
from .records import pack, unpack
from .writeback import WRITEBACK_S, start_writeback

log = logging.getLogger("pushgate.store")

CHECKPOINT_FILE = "checkpoint"
# The journal's two files (journal.py).
JOURNAL_FILES = ("journal", "journal.b")
DATA_FILE = "data.mdb"
# The journal sequence number of the newest journaled commit, written by that commit.
JOURNAL_SEQ = b"\0sys\0journal_seq"
_MAGIC = b"PGCKPT3\0"
# magic, the store's journal sequence number, the journal's position, LMDB transaction id,
# clean (0/1), shared (0/1), page size; then the two pages, then a CRC-32.
_HEAD = struct.Struct("<8sQQQBBI")
# Before session 72: no position (it was the sequence number) and never shared.
_MAGIC_2 = b"PGCKPT2\0"
_HEAD_2 = struct.Struct("<8sQQBI")
_CRC = struct.Struct("<I")
# Replayed entries per LMDB transaction.
_REPLAY_BATCH = 256


@dataclass(frozen=True, slots=True)
class SavedCheckpoint:
    """A store's checkpoint: ``seq`` is the journal sequence number of its newest commit then
    (what the store must open at); ``position``, the journal's sequence number then, after
    which its entries are replayed (a journal shared by a node's replicas numbers every
    replica's commits in one sequence, so it is ``seq`` or more); ``shared``: the entries are
    in the node's journal, tagged with the store's directory name (``JournalGroup``)."""

    seq: int
    txnid: int
    clean: bool
    meta: meta_pages.MetaPages
    position: int = 0
    shared: bool = False


def load(directory: Path) -> SavedCheckpoint | None:
    """The checkpoint saved in ``directory`` (None: none, a store that never journaled)."""
    try:
        raw = (directory / CHECKPOINT_FILE).read_bytes()
    except FileNotFoundError:
        return None
    if (
        len(raw) < _HEAD_2.size + _CRC.size
        or zlib.crc32(raw[: -_CRC.size]) != _CRC.unpack(raw[-_CRC.size :])[0]
    ):
        raise Unavailable(f"the checkpoint file of {directory} is damaged; restore the store from a backup")
    if raw.startswith(_MAGIC_2):
        magic, seq, txnid, clean, page_size = _HEAD_2.unpack_from(raw, 0)
        position, shared, head = seq, 0, _HEAD_2.size
    else:
        magic, seq, position, txnid, clean, shared, page_size = _HEAD.unpack_from(raw, 0)
        head = _HEAD.size
    pages = raw[head : -_CRC.size]
    if magic not in (_MAGIC, _MAGIC_2) or len(pages) != 2 * page_size:
        raise Unavailable(f"the checkpoint file of {directory} is not one this version writes")
    meta = meta_pages.MetaPages(page_size, (pages[:page_size], pages[page_size:]))
    return SavedCheckpoint(seq, txnid, bool(clean), meta, position, bool(shared))


def save(directory: Path, checkpoint: SavedCheckpoint) -> None:
    """Write the checkpoint file whole, synced, then rename it into place (and sync that)."""
    meta = checkpoint.meta
    if not checkpoint.shared and checkpoint.position == checkpoint.seq:
        # A store's own journal: the format earlier releases read (so they still open a
        # store this one stopped).
        head = _HEAD_2.pack(_MAGIC_2, checkpoint.seq, checkpoint.txnid, int(checkpoint.clean), meta.page_size)
    else:
        head = _HEAD.pack(
            _MAGIC,
            checkpoint.seq,
            checkpoint.position,
            checkpoint.txnid,
            int(checkpoint.clean),
            int(checkpoint.shared),
            meta.page_size,
        )
    body = head + meta.pages[0] + meta.pages[1]
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


def replay(env: Environment, saved: SavedCheckpoint, shared: tuple[Path, Path] | None = None) -> int:
    """Apply the journal's entries after the checkpoint to ``env`` (opened at it); return how
    many. The environment is synced by the checkpoint the writer takes next. ``shared``: the
    node's journal, which a checkpoint marked shared names the entries in."""
    seq = read_seq(env)
    if seq != saved.seq:
        raise Unavailable(
            f"store {env.path} opened at journal entry {seq}, not at its checkpoint's "
            f"{saved.seq}: restore it from a backup"
        )
    if not saved.shared:
        found = journaled_after(journal_paths(env.path), saved.position)
    elif shared is None:
        raise Unavailable(
            f"store {env.path} was journaled by its node: open it on that node's data directory"
        )
    else:
        found = list(_tagged(journaled_after(shared, saved.position), tag_of(env.path)))
    entries = iter(found)
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


def tag_of(directory: Path) -> bytes:
    """What a shared journal's entries of the store in ``directory`` are tagged with."""
    return directory.name.encode()


def _tagged(entries: list[tuple[int, bytes]], tag: bytes) -> Iterator[tuple[int, bytes]]:
    """The entries of one store in a shared journal, as an unshared journal holds them."""
    for seq, payload in entries:
        entry_tag, changes = unpack(payload)
        if entry_tag == tag:
            yield seq, pack(changes)


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
    save(env.path, dataclasses.replace(saved, clean=True))
    log.warning("store %s: a journaling run did not stop cleanly; synced and marked clean", env.path)


def journal_paths(directory: Path) -> tuple[Path, Path]:
    return (directory / JOURNAL_FILES[0], directory / JOURNAL_FILES[1])


def read_seq(env: Environment) -> int:
    """The journal sequence number of the newest journaled commit (0: none yet)."""
    raw = env.read(lambda txn: txn.get(JOURNAL_SEQ, db=env.dbs[Db.META]))
    return read_u64(raw) if raw else 0


@dataclass(slots=True)
class _InFlight:
    """A checkpoint whose data syncs run on a thread of its own: each member's pinned reader
    and what it saves, and which of them were saved."""

    pins: list[tuple[Journaling, Any, SavedCheckpoint]]
    saved: list[bool]
    thread: threading.Thread | None = None
    error: BaseException | None = None


class JournalGroup:
    """A journal and the stores it journals, and their checkpoints: one store's own
    (``journal`` and ``journal.b`` in its directory), or one for every replica of a backend
    node (``shared``: ``partitions/journal``), whose commit thread they share. Commit thread
    only: one sequence of journal numbers for all the group's commits, one sync for all.

    A checkpoint is taken of every member at once, so that the journal's file is written over
    only once each member has a checkpoint past its entries: a member joining, one leaving
    (its last, clean checkpoint), or a checkpoint that is due. The members' LMDB files are
    synced one after another, on a thread of their own when the checkpoint is merely due.

    Between checkpoints, the writer has the kernel start writing the members' LMDB files back
    every ``writeback.WRITEBACK_S`` (:meth:`start_writeback`), so that a checkpoint's sync finds
    little to write and the journal's syncs do not wait behind it (``writeback.py``).

    ``clock`` (monotonic seconds) times the checkpoints and the writebacks; ``fdatasync`` is
    what the journal and the checkpoints' syncs of the LMDB files use (a test counts, or
    holds, the syncs through it); ``writeback`` what starts a writeback (a test counts
    through it)."""

    def __init__(
        self,
        paths: tuple[Path, Path],
        *,
        shared: bool = False,
        interval_s: float = 1.0,
        max_bytes: int = 16 << 20,
        clock: Callable[[], float] = time.monotonic,
        fdatasync: Callable[[int], None] = os.fdatasync,
        writeback: Callable[[int], None] = start_writeback,
    ) -> None:
        self.paths = paths
        self.shared = shared
        self._interval_s = interval_s
        self._max_bytes = max_bytes
        self._clock = clock
        self._fdatasync = fdatasync
        self._writeback = writeback
        # When the members' files were last written back (monotonic seconds).
        self._written_back = clock()
        # Open while the group has members.
        self._journal: Journal | None = None
        # The journal sequence number of the group's newest journaled commit.
        self.seq = 0
        self.members: list[Journaling] = []
        self._in_flight: _InFlight | None = None
        # Whether the journal's other file holds only entries of saved checkpoints.
        self._other_free = True
        self._last = clock()
        # After a failed checkpoint, the next is not tried before this (monotonic seconds).
        self._retry_at = 0.0
        self.checkpoints = 0
        self._recovery = threading.Lock()
        self._recovered = not shared

    @classmethod
    def of_node(
        cls,
        root: Path,
        *,
        interval_s: float = 1.0,
        fdatasync: Callable[[int], None] = os.fdatasync,
        writeback: Callable[[int], None] = start_writeback,
    ) -> JournalGroup:
        """The journal a backend node's replicas share: ``root/journal`` (and ``.b``), for the
        stores in ``root``'s directories."""
        return cls(
            journal_paths(root), shared=True, interval_s=interval_s, fdatasync=fdatasync, writeback=writeback
        )

    def cap(self, max_bytes: int) -> None:
        """At most ``max_bytes`` between checkpoints (a member's disk is short of room)."""
        self._max_bytes = min(self._max_bytes, max_bytes)

    def recover(self, open_env: Callable[[Path], Environment]) -> None:
        """Before the first member of a shared group opens (blocking; any thread, once):
        each store beside the journal whose journaling did not stop cleanly gets its
        checkpoint's meta pages back and its entries replayed, opened with ``open_env``,
        and is synced and marked clean; then the journal is numbered past every entry in
        it, and written over from its start. A store whose recovery fails is logged and
        left as it is (its own open then fails with the reason)."""
        with self._recovery:
            if self._recovered:
                return
            root = self.paths[0].parent
            seq = newest_seq(self.paths)
            for directory in sorted(root.iterdir()) if root.is_dir() else []:
                if directory.is_dir():
                    seq = max(seq, self._recover_one(directory, open_env))
            self.seq = max(self.seq, seq)
            self._recovered = True

    def _recover_one(self, directory: Path, open_env: Callable[[Path], Environment]) -> int:
        try:
            saved = load(directory)
            if saved is None:
                return 0
            if saved.clean or not saved.shared:
                return max(saved.seq, saved.position)
            restore_meta_pages(directory)
            env = open_env(directory)
            try:
                replay(env, saved, self.paths)
                seq = read_seq(env)
                mark_clean(env)
            finally:
                env.close()
        except (OSError, lmdb.Error, Unavailable, meta_pages.UnsupportedFormat):
            log.exception("store %s: recovery from its node's journal failed", directory)
            return 0
        return max(seq, saved.position)

    @property
    def journal(self) -> Journal:
        assert self._journal is not None, "a journal group without members"
        return self._journal

    def join(self, member: Journaling) -> None:
        if self._journal is None:
            self._journal = Journal(self.paths, self._fdatasync)
            self._other_free = True
        self.members.append(member)
        self.seq = max(self.seq, read_seq(member.env))

    def leave(self, member: Journaling) -> None:
        """``member`` is released: a checkpoint under way finishes first (it holds the
        member's reader); the journal closes with the last member."""
        if self._in_flight is not None and any(pin[0] is member for pin in self._in_flight.pins):
            try:
                self.complete()
            except BaseException:
                log.exception("checkpoint of %s failed", member.env.path)
        self.members.remove(member)
        if not self.members and self._journal is not None:
            self._journal.close()
            self._journal = None

    def sync(self) -> None:
        self.journal.sync()

    def start_writeback(self) -> None:
        """After a commit: start the writeback of every member's LMDB file, unless it was
        started less than ``WRITEBACK_S`` ago (it returns at once; ``writeback.py``)."""
        now = self._clock()
        if now - self._written_back < WRITEBACK_S:
            return
        self._written_back = now
        for member in self.members:
            self._writeback(member.data_fd)

    @property
    def in_flight(self) -> bool:
        return self._in_flight is not None

    def seconds_until_due(self) -> float | None:
        """How long until a checkpoint is due (None: nothing journaled since the last, or
        one is under way)."""
        if self._journal is None or not self._journal.written or self._in_flight is not None:
            return None
        due = self._retry_at if self._journal.written >= self._max_bytes else self._last + self._interval_s
        return max(0.0, max(due, self._retry_at) - self._clock())

    def checkpoint(self, clean: Journaling | None = None) -> None:
        """Take a checkpoint of every member's newest commit on this thread (``clean``: the
        member that stops, whose checkpoint says its file is whole), after the one under
        way, if any."""
        self.complete()
        pins = self._pin_all(clean)
        saved = [False] * len(pins)
        try:
            for index, (member, _reader, checkpoint) in enumerate(pins):
                self._fdatasync(member.data_fd)
                save(member.env.path, checkpoint)
                saved[index] = True
        except BaseException:
            self._settle(pins, saved)
            raise
        self.journal.rewind()
        self._settle(pins, saved)

    def begin(self, done: Callable[[], None]) -> bool:
        """Start a checkpoint of every member's newest commit whose syncs of the LMDB files
        and saving run on a thread of their own, which calls ``done`` when they are over
        (the writer then calls :meth:`complete`). False: none started (one is under way, or
        the journal's other file still holds entries no saved checkpoint has)."""
        if self._in_flight is not None or not self._other_free:
            return False
        pins = self._pin_all(None)
        # Entries from here on go to the other file: this one keeps those the checkpoint
        # before needs until every member's is saved.
        try:
            self.journal.switch()
        except BaseException:
            for _member, reader, _checkpoint in pins:
                reader.abort()
            raise
        self._other_free = False
        flight = _InFlight(pins, [False] * len(pins))
        flight.thread = threading.Thread(
            target=self._sync_and_save, args=(flight, done), name="pushgate-checkpoint", daemon=True
        )
        self._in_flight = flight
        flight.thread.start()
        return True

    def _sync_and_save(self, flight: _InFlight, done: Callable[[], None]) -> None:
        try:
            for index, (member, _reader, checkpoint) in enumerate(flight.pins):
                self._fdatasync(member.data_fd)
                save(member.env.path, checkpoint)
                flight.saved[index] = True
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
        self._settle(flight.pins, flight.saved)
        if flight.error is not None:
            raise flight.error

    def _pin_all(self, clean: Journaling | None) -> list[tuple[Journaling, Any, SavedCheckpoint]]:
        pins: list[tuple[Journaling, Any, SavedCheckpoint]] = []
        try:
            for member in self.members:
                reader, checkpoint = member.pin(member is clean, self.seq, self.shared)
                pins.append((member, reader, checkpoint))
        except BaseException:
            for _member, reader, _checkpoint in pins:
                reader.abort()
            self._retry_at = self._clock() + self._interval_s
            raise
        return pins

    def _settle(self, pins: list[tuple[Journaling, Any, SavedCheckpoint]], saved: list[bool]) -> None:
        """Each member whose checkpoint was saved keeps its reader (the one before is let
        go); the others' are let go. Only when all were saved is every entry in the
        journal's other file in a saved checkpoint."""
        for (member, reader, _checkpoint), done in zip(pins, saved, strict=True):
            if done:
                member.saved(reader)
            else:
                reader.abort()
        if all(saved):
            self._other_free = True
            self._last = self._clock()
            self.checkpoints += 1
        else:
            self._retry_at = self._clock() + self._interval_s


class Journaling:
    """The writer's side of a journaling store: its place in a journal group (its own, or its
    node's) and its checkpoints (steps in the module's docstring). Writer thread only."""

    def __init__(self, env: Environment, group: JournalGroup) -> None:
        self.env = env
        self.group = group
        if group.shared and env.path.parent != group.paths[0].parent:
            raise ValueError(f"{env.path} is not beside its node's journal {group.paths[0]}")
        self._tag = tag_of(env.path) if group.shared else None
        # The LMDB file, for its syncs (an fdatasync of any descriptor of a file syncs it).
        self.data_fd = os.open(env.path / DATA_FILE, os.O_RDONLY)
        self._pinned: Any = None  # the read transaction on the last checkpoint
        group.join(self)

    @classmethod
    def alone(
        cls,
        env: Environment,
        *,
        interval_s: float = 1.0,
        max_bytes: int = 16 << 20,
        clock: Callable[[], float] = time.monotonic,
        fdatasync: Callable[[int], None] = os.fdatasync,
        writeback: Callable[[int], None] = start_writeback,
    ) -> Journaling:
        """A store's journaling in a journal of its own (in its directory)."""
        group = JournalGroup(
            journal_paths(env.path),
            interval_s=interval_s,
            max_bytes=max_bytes,
            clock=clock,
            fdatasync=fdatasync,
            writeback=writeback,
        )
        return cls(env, group)

    @property
    def seq(self) -> int:
        return self.group.seq

    @property
    def journal(self) -> Journal:
        return self.group.journal

    @property
    def checkpoints(self) -> int:
        return self.group.checkpoints

    @property
    def in_flight(self) -> bool:
        return self.group.in_flight

    def stamp(self, txn: RecordedTxn) -> int:
        """Before a commit that changed something: write its journal sequence number in
        it (recorded, so a replay restores it too); return that number."""
        seq = self.group.seq + 1
        txn.put(JOURNAL_SEQ, u64(seq), db=self.env.dbs[Db.META])
        return seq

    def record(self, seq: int, changes: list[Change]) -> None:
        """After that commit: append its changes (no sync). Its number is taken even if the
        write fails (the writer then takes a checkpoint before anyone hears of it)."""
        self.group.seq = seq
        self.group.journal.append(seq, pack(changes if self._tag is None else [self._tag, changes]))

    def sync(self) -> None:
        self.group.sync()

    def start_writeback(self) -> None:
        self.group.start_writeback()

    def seconds_until_due(self) -> float | None:
        return self.group.seconds_until_due()

    def checkpoint(self, *, clean: bool = False) -> None:
        self.group.checkpoint(self if clean else None)

    def begin(self, done: Callable[[], None]) -> bool:
        return self.group.begin(done)

    def complete(self) -> None:
        self.group.complete()

    def pin(self, clean: bool, position: int, shared: bool) -> tuple[Any, SavedCheckpoint]:
        """A read transaction on the newest commit (it keeps that tree's pages from reuse),
        and what a checkpoint of it saves: its meta pages as the commit wrote them (the
        page cache's, synced or not: the checkpoint saves them only after the LMDB file's
        sync has made the tree they name durable)."""
        env = self.env
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
            raise
        return reader, SavedCheckpoint(read_u64(raw) if raw else 0, txnid, clean, meta, position, shared)

    def saved(self, reader: Any) -> None:
        """A checkpoint is saved: its reader replaces the one before."""
        previous, self._pinned = self._pinned, reader
        if previous is not None:
            previous.abort()

    def finish(self) -> None:
        """A clean stop: the last checkpoint, marked clean; out of the group."""
        try:
            self.checkpoint(clean=True)
        finally:
            self.release()

    def release(self) -> None:
        self.group.leave(self)
        if self._pinned is not None:
            self._pinned.abort()
            self._pinned = None
        os.close(self.data_fd)
