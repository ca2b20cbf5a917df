"""How the replication log's entries lie in LMDB: each in pieces of at most one page.

An entry is one packed value (``[epoch, record, undo]``, replication_log.py), as large as its
batch: a send of 50 messages of 1 KiB, or an ack of 50 whose before-images hold the
messages it deletes, is over 50 KiB. LMDB keeps a value that large in a run of contiguous
overflow pages, and on a store whose disk is full a run is what the pages freed by acks
(leaf pages, and records of other sizes) rarely make: acks of many messages at once then
found no room although the store had megabytes free, and a store at its reserve could no
longer be drained (tests/backend/test_room.py). Each piece here fills at most one overflow
page, so any free page takes it.

Keys: the first piece under ``u64(lsn)``, the next ones under ``u64(lsn) + u16(n)``, so an
entry's pieces sort together and before the next LSN, and an entry written whole by an
earlier version (one value under ``u64(lsn)``) reads the same.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

from .keys import read_u64, u64

# An overflow page holds its page size less a 16-byte page header.
_PIECE = 4096 - 16
_U16 = struct.Struct(">H")


def put_entry(txn: Any, db: Any, lsn: int, value: bytes) -> None:
    key = u64(lsn)
    txn.put(key, value[:_PIECE], db=db)
    for n, start in enumerate(range(_PIECE, len(value), _PIECE), 1):
        txn.put(key + _U16.pack(n), value[start : start + _PIECE], db=db)


def get_entry(txn: Any, db: Any, lsn: int) -> bytes | None:
    key = u64(lsn)
    cursor = txn.cursor(db=db)
    if not cursor.set_key(key):
        return None
    pieces = [bytes(cursor.value())]
    while cursor.next() and cursor.key()[:8] == key:
        pieces.append(bytes(cursor.value()))
    return pieces[0] if len(pieces) == 1 else b"".join(pieces)


def delete_entry(txn: Any, db: Any, lsn: int) -> None:
    key = u64(lsn)
    cursor = txn.cursor(db=db)
    if not cursor.set_key(key):
        return
    pieces = [bytes(cursor.key())]
    while cursor.next() and cursor.key()[:8] == key:
        pieces.append(bytes(cursor.key()))
    _delete(txn, db, pieces)


def _delete(txn: Any, db: Any, keys: list[bytes]) -> None:
    """Delete through the transaction, not a cursor: a journaling store's transaction
    records what it deletes (recorded_txn.py)."""
    for key in keys:
        txn.delete(key, db=db)


def entries_from(txn: Any, db: Any, first: int) -> Iterator[tuple[int, bytes]]:
    """``(lsn, value)`` of every entry from LSN ``first`` on, oldest first."""
    cursor = txn.cursor(db=db)
    if not cursor.set_range(u64(first)):
        return
    lsn: int | None = None
    pieces: list[bytes] = []
    for key, value in cursor:
        if len(key) == 8:
            if lsn is not None:
                yield lsn, b"".join(pieces)
            lsn, pieces = read_u64(key), []
        pieces.append(bytes(value))
    if lsn is not None:
        yield lsn, b"".join(pieces)


def first_lsn(txn: Any, db: Any) -> int | None:
    cursor = txn.cursor(db=db)
    return read_u64(cursor.key()) if cursor.first() else None


def trim_through(txn: Any, db: Any, horizon: int, limit: int) -> None:
    """Delete the oldest entries up to LSN ``horizon``, at most ``limit`` of them."""
    cursor = txn.cursor(db=db)
    if not cursor.first():
        return
    entries = 0
    doomed: list[bytes] = []
    for key in cursor.iternext(keys=True, values=False):
        if read_u64(key) > horizon:
            break
        if len(key) == 8:
            if entries == limit:
                break
            entries += 1
        doomed.append(bytes(key))
    _delete(txn, db, doomed)
