"""The replication log: every committed batch's mutations under a log sequence number (LSN).

The leader appends the exact mutations it applied; a follower applies the same record
(:meth:`ReplicationLog.apply`) and ends up byte-for-byte equal. Entries are kept until
they are older than the newest ``keep`` batches and every registered follower has them.

Each entry is ``[epoch, record, undo]``: the epoch of the leader that wrote it (fencing),
the mutations followers replay (``record``, what is shipped), and the before-image of
every key the batch changed (``undo``, never shipped), so entries a deposed leader wrote
but nobody acknowledged can be rolled back (:meth:`ReplicationLog.truncate_after`).

Fencing lives here, in the same transaction as the data: the highest epoch this store has
seen is kept under ``\\0sys\\0epoch``; entries or a new term with an older epoch are refused
with :class:`StaleEpoch`. One store is one partition replica, so that epoch is the
partition's. The fence only grows: it is written outside the logged mutations, so undoing
entries never lowers it.

With ``keep=0`` (a standalone gateway: nobody will ever read the log) batches still get
LSNs but their mutations are not copied into the log, which halves the bytes each
message costs on disk. Backend nodes always keep a log.

LSN and epoch changes are staged while a transaction is open and made current by the
writer once it commits (:meth:`commit`), so an aborted batch leaves them as they were.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import ReplicationGap, StaleEpoch, Unavailable
from ..types import Epoch, LogEntry, Lsn
from . import log_pages
from .environment import Db, LoggedWrites, Writes
from .keys import read_u64, u64
from .records import pack, unpack

_LAST_LSN = b"\0sys\0last_lsn"
_EPOCH = b"\0sys\0epoch"
_TRIM_PER_BATCH = 64
# Short of room (room.py), the log keeps only its newest entries and what followers still
# need, trimmed faster: on a backend node an ack's entry holds the message it deletes, so
# without this, acks would free no room until ``keep`` more batches had passed.
_KEEP_SHORT_OF_ROOM = 64
_TRIM_SHORT_OF_ROOM = 1024
# Replicated mutations may touch every database but the log itself.
_DB_NUMBERS = frozenset(int(db) for db in Db if db != Db.REPLOG)
# Each database by its number: ``Db(n)`` is an enum call, which a follower made for every
# mutation it applied (8% of its samples in a profile).
_DB_BY_NUMBER = tuple(sorted(Db))
assert all(int(db) == n for n, db in enumerate(_DB_BY_NUMBER))


# (last LSN, fence, epoch of the entry at that LSN or None).
LogState = tuple[Lsn, Epoch, Epoch | None]


class NotLeading(Exception):
    """The batch would log this store's own writes at a fence its term no longer holds."""


class ReplicationLog:
    def __init__(self, keep: int) -> None:
        self.keep = max(0, keep)
        # The log's state as last committed (the writer's) and as last published (what
        # everyone else reads: :attr:`last_lsn`, :attr:`epoch`): the writer publishes a
        # batch's state once its callers may hear of it, so once it is durable (a journaling
        # store commits first and syncs after, group_commit.py). Each one tuple replaced
        # whole by the writer thread, so the event loop never reads a torn mix. The entry's
        # epoch lets a follower check a shipment's prev against its own tail, and a node
        # publish its position, without reading the log.
        self.committed: LogState = (Lsn(0), Epoch(0), None)
        self.published: LogState = self.committed
        # The lowest LSN any follower still needs (None: no followers registered).
        self.follower_floor: Lsn | None = None
        # (last_lsn, epoch, last_entry_epoch) as the open transaction leaves them; None
        # when unchanged.
        self._staged: LogState | None = None
        # The entry the open transaction appended, as followers get it (None: none, or no log kept).
        self.appended: LogEntry | None = None
        # The epoch of the term this store's own writes are logged in: the last one started
        # here (raise_epoch), or the fence as loaded. A newer leader's entries or truncation
        # raise the fence past it, and from then on this store logs none of its own writes:
        # a write queued under the deposed term and committed after the fence rose would
        # carry the new term's epoch at an LSN where the new leader wrote something else
        # (simulation seed ``all`` 231542, session 36: two different entries at LSN 58,
        # epoch ...842, and log matching took them for one).
        self.term: Epoch = Epoch(0)
        self._staged_term: Epoch | None = None

    def load(self, txn: Any, dbs: dict[Db, Any]) -> None:
        raw = txn.get(_LAST_LSN, db=dbs[Db.META])
        last = Lsn(read_u64(raw) if raw else 0)
        raw = txn.get(_EPOCH, db=dbs[Db.META])
        fence = Epoch(read_u64(raw) if raw else 0)
        raw = log_pages.get_entry(txn, dbs[Db.REPLOG], last) if last else None
        self.committed = (last, fence, Epoch(unpack(raw)[0]) if raw is not None else None)
        self.published = self.committed
        self.term = fence

    @property
    def last_lsn(self) -> Lsn:
        return self.published[0]

    @property
    def epoch(self) -> Epoch:
        return self.published[1]

    # Transaction boundaries (the writer thread calls these) ------------------

    def begin(self) -> None:
        self._staged = None
        self._staged_term = None
        self.appended = None

    def commit(self) -> None:
        if self._staged is not None:
            self.committed = self._staged
            self._staged = None
        if self._staged_term is not None:
            self.term = self._staged_term
            self._staged_term = None

    def _current(self) -> tuple[Lsn, Epoch]:
        last, fence, _ = self._staged or self.committed
        return last, fence

    def _stage(self, writes: Writes, lsn: Lsn, epoch: Epoch, entry_epoch: Epoch | None) -> None:
        last, fence = self._current()
        if lsn != last:
            writes.txn.put(_LAST_LSN, u64(lsn), db=writes.dbs[Db.META])
        if epoch != fence:
            writes.txn.put(_EPOCH, u64(epoch), db=writes.dbs[Db.META])
        self._staged = (lsn, epoch, entry_epoch)

    def _entry_epoch(self) -> Epoch | None:
        return (self._staged or self.committed)[2]

    # The leader's side ---------------------------------------------------------

    def append(self, writes: Writes) -> Lsn:
        """Write the batch's mutations as the next entry, in the batch's own transaction.

        Refused with :class:`NotLeading` when the fence has passed this store's term: a
        newer leader's entries arrived since its writes were queued."""
        last, epoch = self._current()
        term = self._staged_term if self._staged_term is not None else self.term
        if self.keep and epoch != term:
            raise NotLeading(f"this replica's term {term} is over (fence {epoch})")
        lsn = Lsn(last + 1)
        if self.keep:
            if not isinstance(writes, LoggedWrites):
                raise TypeError("a store that keeps a log writes through LoggedWrites")
            # msgpack packs a Db (an int subclass) as its number and a tuple as a list: the
            # mutations go as they are, without a list built for each (it showed in profiles).
            record = pack(writes.mutations)
            log_pages.put_entry(writes.txn, writes.dbs[Db.REPLOG], lsn, pack([epoch, record, writes.undo]))
            self.appended = LogEntry(lsn, epoch, record)
        self._stage(writes, lsn, epoch, epoch if self.keep else None)
        self._trim(writes, lsn)
        return lsn

    def raise_epoch(self, writes: Writes, epoch: Epoch) -> Epoch:
        """Start (or confirm) term ``epoch``; refuse an older one. Return the fence."""
        last, fence = self._current()
        if epoch < fence:
            raise StaleEpoch(f"epoch {epoch} is older than {fence}")
        self._stage(writes, last, epoch, self._entry_epoch())
        self._staged_term = epoch
        return epoch

    def _trim(self, writes: Writes, lsn: Lsn) -> None:
        if not self.keep:
            return  # no entries are written (a standalone store), none to trim
        short = writes.short_of_room()
        horizon = lsn - max(1, min(self.keep, _KEEP_SHORT_OF_ROOM) if short else self.keep)
        if self.follower_floor is not None:
            horizon = min(horizon, self.follower_floor - 1)
        if horizon <= 0:
            return
        # Trim a little per batch so no single commit pays for a long backlog.
        limit = _TRIM_SHORT_OF_ROOM if short else _TRIM_PER_BATCH
        log_pages.trim_through(writes.txn, writes.dbs[Db.REPLOG], horizon, limit)

    # Reading ---------------------------------------------------------------------

    @staticmethod
    def read(txn: Any, dbs: dict[Db, Any], after: Lsn, limit: int) -> list[LogEntry]:
        """Entries with LSN > ``after``, oldest first (a read transaction)."""
        out: list[LogEntry] = []
        if limit <= 0:
            return out
        for lsn, value in log_pages.entries_from(txn, dbs[Db.REPLOG], after + 1):
            epoch, record, _undo = unpack(value)
            out.append(LogEntry(Lsn(lsn), Epoch(epoch), record))
            if len(out) >= limit:
                break
        return out

    @staticmethod
    def first_lsn(txn: Any, dbs: dict[Db, Any]) -> Lsn | None:
        first = log_pages.first_lsn(txn, dbs[Db.REPLOG])
        return None if first is None else Lsn(first)

    # The follower's side -----------------------------------------------------------

    def apply(
        self,
        writes: Writes,
        entries: Sequence[LogEntry],
        epoch: Epoch | None = None,
        max_bytes: int | None = None,
    ) -> Lsn:
        """Apply a leader's entries in LSN order and log them under the same LSNs; return the
        last LSN applied.

        ``epoch`` is the term of the leader sending them (default: the newest entry's).
        The fence is checked against it, not against each entry: a new leader ships entries
        of earlier terms that a lagging follower lacks, and a follower already fenced at
        the new term must take them. The fence then rises to ``epoch``.

        Everything is checked before the first write (the group-commit rule: an operation
        fails only before it writes): the sender's term must not be older than the fence,
        entry epochs must not go down nor pass the sender's, and LSNs must follow this log
        without a gap.

        With ``max_bytes``, it stops after the entry that brings what it wrote (the entries'
        records and their log entries, undo included) to that much, or after any entry once
        the store is short of room (room.py: as the leader wrote them, an entry a commit);
        the caller applies the rest in the next commit (replica.py says why).
        """
        last, fence = self._current()
        sender = epoch if epoch is not None else (entries[-1].epoch if entries else fence)
        if sender < fence:
            raise StaleEpoch(f"a leader of epoch {sender} is older than {fence}")
        decoded: list[list[Any]] = []
        previous = Epoch(0)
        expected = last
        for entry in entries:
            if entry.epoch < previous or entry.epoch > sender:
                raise StaleEpoch(f"entry {entry.lsn} has epoch {entry.epoch}, out of order for {sender}")
            if entry.lsn != expected + 1:
                raise ReplicationGap(f"replication gap: have {expected}, got {entry.lsn}")
            mutations = unpack(entry.record)
            if not _well_formed(mutations):
                raise Unavailable(f"corrupt replicated entry {entry.lsn}")
            decoded.append(mutations)
            expected, previous = entry.lsn, entry.epoch
        written = 0
        for entry, mutations in zip(entries, decoded, strict=True):
            undo = [_apply_mutation(writes, db, key, value) for db, key, value in mutations]
            logged = pack([entry.epoch, entry.record, undo])
            log_pages.put_entry(writes.txn, writes.dbs[Db.REPLOG], entry.lsn, logged)
            last, previous = entry.lsn, entry.epoch
            written += len(entry.record) + len(logged)
            if max_bytes is not None and (written >= max_bytes or writes.short_of_room()):
                break
        if entries or sender > fence:
            self._stage(writes, last, max(fence, sender), previous if entries else self._entry_epoch())
        if entries:
            self._trim(writes, last)
        return last

    def truncate_after(self, writes: Writes, lsn: Lsn, epoch: Epoch | None = None) -> int:
        """Undo and drop every entry after ``lsn`` (newest first); return how many.

        For a deposed leader or a follower holding entries the new leader never had: they
        were never acknowledged by a majority, so rolling them back loses nothing promised.
        The fence is kept; with ``epoch`` (the term of the leader asking), an older term is
        refused with :class:`StaleEpoch` and the fence rises to it in the same transaction,
        so a deposed leader can never make a replica drop entries. Raises
        :class:`ReplicationGap` if any of them was trimmed from the log already (then the
        replica must be re-seeded from a snapshot).
        """
        last, fence = self._current()
        if epoch is not None and epoch < fence:
            raise StaleEpoch(f"a leader of epoch {epoch} is older than {fence}")
        if lsn >= last:
            return 0
        if lsn < 0:
            raise ReplicationGap("cannot truncate below LSN 0")
        undos: list[tuple[int, list[Any]]] = []
        for n in range(last, lsn, -1):
            raw = log_pages.get_entry(writes.txn, writes.dbs[Db.REPLOG], n)
            undo = unpack(raw)[2] if raw is not None else None
            if undo is None:
                # Trimmed already, or written by a store that keeps no log.
                raise ReplicationGap(f"entry {n} can no longer be undone; re-seed this replica")
            undos.append((n, undo))
        for n, undo in undos:
            for db, key, old in reversed(undo):
                if old is None:
                    writes.txn.delete(key, db=writes.dbs[_DB_BY_NUMBER[db]])
                else:
                    writes.txn.put(key, old, db=writes.dbs[_DB_BY_NUMBER[db]])
            log_pages.delete_entry(writes.txn, writes.dbs[Db.REPLOG], n)
        raw = log_pages.get_entry(writes.txn, writes.dbs[Db.REPLOG], lsn) if lsn else None
        entry_epoch = Epoch(unpack(raw)[0]) if raw is not None else None
        self._stage(writes, lsn, max(fence, epoch or fence), entry_epoch)
        return len(undos)


def _apply_mutation(writes: Writes, db: int, key: bytes, value: bytes | None) -> list[Any]:
    """Apply one replicated mutation; return its before-image ``[db, key, old]``."""
    if value is None:
        old = writes.txn.pop(key, db=writes.dbs[_DB_BY_NUMBER[db]])
    else:
        old = writes.txn.replace(key, value, db=writes.dbs[_DB_BY_NUMBER[db]])
    return [db, key, old]


def _well_formed(mutations: Any) -> bool:
    return isinstance(mutations, list) and all(
        isinstance(m, list)
        and len(m) == 3
        and m[0] in _DB_NUMBERS
        and isinstance(m[1], bytes)
        and (m[2] is None or isinstance(m[2], bytes))
        for m in mutations
    )
