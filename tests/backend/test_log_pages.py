"""The replication log's entries in pieces of at most one page (backend_store/lmdb_store/log_pages.py),
on a real LMDB environment: an entry reads back whole, entries are listed, trimmed and deleted
with all their pieces, and an entry written whole by an earlier version (one value under its
LSN) reads the same, so a node's log survives the upgrade."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lmdb
import pytest

from backend_store.lmdb_store import log_pages
from backend_store.lmdb_store.keys import u64

# Entries from a few bytes to many pages; 4,080 bytes is exactly one piece.
SIZES = {lsn: size for lsn, size in enumerate([1, 4079, 4080, 4081, 9000, 70_000, 300], start=1)}


@pytest.fixture
def log(tmp_path: Path) -> Iterator[tuple[Any, Any]]:
    env = lmdb.open(str(tmp_path), map_size=64 << 20, max_dbs=2)
    try:
        yield env, env.open_db(b"replog")
    finally:
        env.close()


def write(env: Any, db: Any) -> dict[int, bytes]:
    values = {lsn: os.urandom(size) for lsn, size in SIZES.items()}
    with env.begin(write=True) as txn:
        for lsn, value in values.items():
            log_pages.put_entry(txn, db, lsn, value)
    return values


def test_entries_read_back_whole_and_in_order(log: tuple[Any, Any]) -> None:
    env, db = log
    values = write(env, db)
    with env.begin() as txn:
        assert all(log_pages.get_entry(txn, db, lsn) == value for lsn, value in values.items())
        assert log_pages.get_entry(txn, db, 99) is None
        assert list(log_pages.entries_from(txn, db, 3)) == [
            (lsn, values[lsn]) for lsn in sorted(values) if lsn >= 3
        ]
        assert log_pages.first_lsn(txn, db) == 1
        # No piece is larger than one overflow page.
        assert max(len(v) for _, v in txn.cursor(db=db)) <= 4080


def test_trimming_and_deleting_take_every_piece(log: tuple[Any, Any]) -> None:
    env, db = log
    values = write(env, db)
    with env.begin(write=True) as txn:
        log_pages.delete_entry(txn, db, 6)  # the 70,000-byte one
        log_pages.trim_through(txn, db, horizon=5, limit=3)  # stops after three entries
    with env.begin() as txn:
        assert [lsn for lsn, _ in log_pages.entries_from(txn, db, 0)] == [4, 5, 7]
        assert log_pages.get_entry(txn, db, 7) == values[7]
        assert all(
            len(key) in (8, 10) and int.from_bytes(key[:8], "big") in (4, 5, 7)
            for key, _ in txn.cursor(db=db)
        )
    with env.begin(write=True) as txn:
        log_pages.trim_through(txn, db, horizon=1000, limit=1000)
    with env.begin() as txn:
        assert log_pages.first_lsn(txn, db) is None and txn.stat(db)["entries"] == 0


def test_an_entry_written_whole_by_an_earlier_version_reads_the_same(log: tuple[Any, Any]) -> None:
    env, db = log
    whole = os.urandom(70_000)
    with env.begin(write=True) as txn:
        txn.put(u64(1), whole, db=db)  # as the log stored every entry before log_pages.py
        log_pages.put_entry(txn, db, 2, b"new")
    with env.begin() as txn:
        assert log_pages.get_entry(txn, db, 1) == whole
        assert list(log_pages.entries_from(txn, db, 1)) == [(1, whole), (2, b"new")]
    with env.begin(write=True) as txn:
        log_pages.trim_through(txn, db, horizon=1, limit=10)
    with env.begin() as txn:
        assert list(log_pages.entries_from(txn, db, 0)) == [(2, b"new")]


def test_lmdb_keeps_each_piece_on_one_page(tmp_path: Path) -> None:
    # The point of the pieces: each takes one page, so any freed page can hold it. A value
    # one byte over a page's room would take two contiguous pages.
    env = lmdb.open(str(tmp_path), map_size=64 << 20, max_dbs=2)
    try:
        db = env.open_db(b"replog")
        with env.begin(write=True) as txn:
            log_pages.put_entry(txn, db, 1, os.urandom(40 * 4080))
            assert txn.stat(db)["overflow_pages"] == 40
    finally:
        env.close()
