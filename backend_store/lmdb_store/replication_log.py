"""The replication log: every committed batch's mutations under a log sequence number (LSN).

The leader appends the exact mutations it applied; a follower applies the same record
(:meth:`ReplicationLog.apply`) and ends up byte-for-byte equal. Entries are kept until
they are older than the newest ``keep`` batches and every registered follower has them.

With ``keep=0`` (a standalone gateway: nobody will ever read the log) batches still get
LSNs but their mutations are not copied into the log, which halves the bytes each
message costs on disk. Backend nodes always keep a log.
"""

from __future__ import annotations

from typing import Any

from ..errors import Unavailable
from ..types import Lsn
from .environment import Db, Writes
from .keys import read_u64, u64
from .records import pack, unpack

_LAST_LSN = b"\0sys\0last_lsn"
_TRIM_PER_BATCH = 64


class ReplicationLog:
    def __init__(self, keep: int) -> None:
        self.keep = max(0, keep)
        self.last_lsn = Lsn(0)
        # The lowest LSN any follower still needs (None: no followers registered).
        self.follower_floor: Lsn | None = None

    def load(self, txn: Any, dbs: dict[Db, Any]) -> None:
        raw = txn.get(_LAST_LSN, db=dbs[Db.META])
        self.last_lsn = Lsn(read_u64(raw) if raw else 0)

    def append(self, writes: Writes) -> Lsn:
        """Write the batch's mutations as the next entry, in the batch's own transaction."""
        lsn = Lsn(self.last_lsn + 1)
        writes.txn.put(_LAST_LSN, u64(lsn), db=writes.dbs[Db.META])
        if self.keep:
            record = pack([[int(db), key, value] for db, key, value in writes.mutations])
            writes.txn.put(u64(lsn), record, db=writes.dbs[Db.REPLOG])
        self._trim(writes, lsn)
        # The writer sets ``last_lsn`` once the transaction is committed.
        return lsn

    def _trim(self, writes: Writes, lsn: Lsn) -> None:
        horizon = lsn - max(1, self.keep)
        if self.follower_floor is not None:
            horizon = min(horizon, self.follower_floor - 1)
        if horizon <= 0:
            return
        cursor = writes.txn.cursor(db=writes.dbs[Db.REPLOG])
        # Trim a little per batch so no single commit pays for a long backlog.
        for _ in range(_TRIM_PER_BATCH):
            if not cursor.first() or read_u64(cursor.key()) > horizon:
                break
            cursor.delete()

    @staticmethod
    def read(txn: Any, dbs: dict[Db, Any], after: Lsn, limit: int) -> list[tuple[Lsn, bytes]]:
        """Entries with LSN > ``after``, oldest first (a read transaction)."""
        out: list[tuple[Lsn, bytes]] = []
        cursor = txn.cursor(db=dbs[Db.REPLOG])
        if not cursor.set_range(u64(after + 1)):
            return out
        for key, value in cursor:
            out.append((Lsn(read_u64(key)), bytes(value)))
            if len(out) >= limit:
                break
        return out

    @staticmethod
    def first_lsn(txn: Any, dbs: dict[Db, Any]) -> Lsn | None:
        cursor = txn.cursor(db=dbs[Db.REPLOG])
        return Lsn(read_u64(cursor.key())) if cursor.first() else None

    def apply(self, writes: Writes, lsn: Lsn, record: bytes) -> None:
        """Apply a leader's entry on a follower, in LSN order, and log it under the same LSN."""
        if lsn != self.last_lsn + 1:
            raise Unavailable(f"replication gap: have {self.last_lsn}, got {lsn}")
        for db, key, value in unpack(record):
            if value is None:
                writes.txn.delete(key, db=writes.dbs[Db(db)])
            else:
                writes.txn.put(key, value, db=writes.dbs[Db(db)])
        writes.txn.put(u64(lsn), record, db=writes.dbs[Db.REPLOG])
        writes.txn.put(_LAST_LSN, u64(lsn), db=writes.dbs[Db.META])
        self._trim(writes, lsn)
        self.last_lsn = lsn
