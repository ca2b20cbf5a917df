"""LMDB's meta pages: the one place Pushgate reads and writes LMDB's file format itself.

An LMDB file starts with two meta pages (pages 0 and 1). Each names the root of one committed
tree and that commit's transaction id; LMDB opens at the one with the higher id, and a commit
rewrites the other one in place (every other page is copy-on-write). The journal
(``journal.py``, ``checkpoint.py``) saves both pages when a checkpoint is synced and writes
them back after a crash of the machine, so LMDB opens at the checkpoint whatever happened to
the meta pages written since.

The layout below is liblmdb 0.9's (``mdb.c``: ``MDB_page`` header, then ``MDB_meta``) on a
64-bit machine: magic ``0xBEEFC0DE``, data version 1. Any other liblmdb release, py-lmdb
release, page kind, magic or version is refused here (:class:`UnsupportedFormat`), and the
store then runs on LMDB's own syncs instead (docs/store.md, "Durability"): never a guess at
a format this module was not tested with.
"""

from __future__ import annotations

import os
import struct
import sys
from dataclasses import dataclass
from pathlib import Path

import lmdb

from ..tested_versions import RELEASES, ReleaseCheck, VersionRange

MAGIC = 0xBEEFC0DE
DATA_VERSION = 1
_P_META = 0x08
# MDB_page: mp_pgno (size_t), mp_pad (u16), mp_flags (u16), then lower/upper (u16 each).
_PAGE_HEADER = struct.Struct("<QHH")
_HEADER_SIZE = 16
# MDB_meta after the page header: mm_magic, mm_version (u32), mm_address, mm_mapsize,
# mm_dbs[2] (48 bytes each), mm_last_pg, mm_txnid (size_t each).
_MAGIC_VERSION = struct.Struct("<II")
_TXNID_AT = _HEADER_SIZE + 4 + 4 + 8 + 8 + 2 * 48 + 8
_U64 = struct.Struct("<Q")

# py-lmdb: the binding whose environment flags (sync=False) and sync() the journal relies
# on; liblmdb: the C library whose file format the offsets above are.
PY_LMDB = VersionRange(
    "lmdb",
    "1.4",
    "3.1",
    reliance="backend_store/lmdb_store/meta_pages.py reads and writes LMDB's meta pages "
    "(the journal's checkpoints)",
    fallback="the store runs on LMDB's own syncs, two fdatasyncs per commit when idle "
    "(docs/store.md, Durability)",
)
LIBLMDB_LOWEST = (0, 9, 14)
LIBLMDB_BELOW = (0, 9, 37)


class UnsupportedFormat(Exception):
    """This LMDB release or file is not the format this module was tested with."""


def check_release(releases: ReleaseCheck = RELEASES, liblmdb: tuple[int, int, int] | None = None) -> None:
    """Raise :class:`UnsupportedFormat` unless py-lmdb, liblmdb and this machine are the
    ones the meta-page layout was tested with (``releases`` and ``liblmdb``: a test's)."""
    if sys.byteorder != "little" or struct.calcsize("P") != 8:
        raise UnsupportedFormat("LMDB meta pages are read as a 64-bit little-endian machine writes them")
    if not releases.tested(PY_LMDB):
        raise UnsupportedFormat(f"py-lmdb {releases.version('lmdb')} is outside {PY_LMDB.specifier}")
    found = liblmdb if liblmdb is not None else lmdb.version()
    if not LIBLMDB_LOWEST <= tuple(found) < LIBLMDB_BELOW:
        raise UnsupportedFormat(
            f"liblmdb {'.'.join(map(str, found))} is outside the tested "
            f"{'.'.join(map(str, LIBLMDB_LOWEST))} to below {'.'.join(map(str, LIBLMDB_BELOW))}"
        )


@dataclass(frozen=True, slots=True)
class MetaPages:
    """Pages 0 and 1 of an LMDB file, as read."""

    page_size: int
    pages: tuple[bytes, bytes]

    @property
    def txnids(self) -> tuple[int, int]:
        return (_txnid(self.pages[0]), _txnid(self.pages[1]))

    @property
    def newest_txnid(self) -> int:
        return max(self.txnids)


def read(data_file: Path, page_size: int) -> MetaPages:
    """Read and check both meta pages of ``data_file`` (its writes must be synced first for
    them to be what the disk holds)."""
    fd = os.open(data_file, os.O_RDONLY)
    try:
        raw = os.pread(fd, 2 * page_size, 0)
    finally:
        os.close(fd)
    if len(raw) != 2 * page_size:
        raise UnsupportedFormat(f"{data_file} is shorter than its two meta pages")
    pages = (raw[:page_size], raw[page_size:])
    for number, page in enumerate(pages):
        check_page(page, number)
    return MetaPages(page_size, pages)


def check_page(page: bytes, number: int) -> None:
    """Raise :class:`UnsupportedFormat` unless ``page`` is meta page ``number`` as liblmdb
    0.9 writes it."""
    pgno, _pad, flags = _PAGE_HEADER.unpack_from(page, 0)
    magic, version = _MAGIC_VERSION.unpack_from(page, _HEADER_SIZE)
    if pgno != number or not flags & _P_META:
        raise UnsupportedFormat(f"page {number} is not an LMDB meta page (pgno {pgno}, flags {flags:#x})")
    if magic != MAGIC or version != DATA_VERSION:
        raise UnsupportedFormat(
            f"LMDB meta page {number} has magic {magic:#x} version {version}, "
            f"not {MAGIC:#x} version {DATA_VERSION}"
        )


def write_back(data_file: Path, meta: MetaPages) -> None:
    """Write both saved pages over ``data_file``'s and sync: LMDB then opens at the saved
    commit. Only with the environment closed in every process."""
    fd = os.open(data_file, os.O_WRONLY)
    try:
        os.pwrite(fd, meta.pages[0] + meta.pages[1], 0)
        os.fsync(fd)
    finally:
        os.close(fd)


def _txnid(page: bytes) -> int:
    value: int = _U64.unpack_from(page, _TXNID_AT)[0]
    return value
