"""A write transaction that records every change it makes: a journaling store's commit is
journaled as exactly what it changed (checkpoint.py), whoever changed it.

Below the store's roles, not in them: a standalone store's operations, a node replica's
replication log (its entries, its LSN and fence, a follower's applied entries, a truncation)
and a replica's label all write through the transaction they are given, and the journal
holds all of it without any of them knowing. So one journal, one recovery, for every kind of
store (docs/store.md, "Durability").

Changes go through :meth:`put`, :meth:`replace`, :meth:`delete` and :meth:`pop`. A cursor is
for reading: a write through one would not be recorded, and none is made (``log_pages.py``
deletes through the transaction).
"""

from __future__ import annotations

from typing import Any

# One change: (database number, key, value; None: deleted).
Change = tuple[int, bytes, bytes | None]


class RecordedTxn:
    """An LMDB write transaction (``txn``) and the changes made through it, in order.

    ``numbers``: each database handle's number (``Environment.db_numbers``), what a change
    names its database by."""

    __slots__ = ("_numbers", "changes", "txn")

    def __init__(self, txn: Any, numbers: dict[Any, int]) -> None:
        self.txn = txn
        self._numbers = numbers
        self.changes: list[Change] = []

    def get(self, key: bytes, default: Any = None, db: Any = None) -> Any:
        return self.txn.get(key, default, db=db)

    def cursor(self, db: Any = None) -> Any:
        return self.txn.cursor(db=db)

    def stat(self, db: Any) -> Any:
        return self.txn.stat(db)

    def put(self, key: bytes, value: bytes, db: Any = None) -> bool:
        self.txn.put(key, value, db=db)
        self.changes.append((self._numbers[db], key, value))
        return True

    def replace(self, key: bytes, value: bytes, db: Any = None) -> bytes | None:
        old: bytes | None = self.txn.replace(key, value, db=db)
        self.changes.append((self._numbers[db], key, value))
        return old

    def delete(self, key: bytes, db: Any = None) -> bool:
        deleted: bool = self.txn.delete(key, db=db)
        if deleted:
            self.changes.append((self._numbers[db], key, None))
        return deleted

    def pop(self, key: bytes, db: Any = None) -> bytes | None:
        old: bytes | None = self.txn.pop(key, db=db)
        if old is not None:
            self.changes.append((self._numbers[db], key, None))
        return old

    def commit(self) -> None:
        self.txn.commit()

    def abort(self) -> None:
        self.txn.abort()
