"""The journal: an append-only file of committed transactions' changes, one sync per batch.

A store that journals (``checkpoint.py`` says when) commits to LMDB without any sync,
appends each committed transaction's changes here under its journal sequence number
(``recorded_txn.py``), and syncs this file once per batch before the batch's callers hear of
it: one fdatasync per commit at every load, where LMDB alone needs two (its data pages, then
its meta page).

An entry is a header (payload length, CRC-32 of sequence number and payload, sequence
number: ``<IIQ``) and its payload (the msgpack of ``[[db, key, value or None], ...]``, or
of ``[replica, that]`` in a journal a node's replicas share). The
file is written from offset 0 again after each checkpoint (everything in it is then in the
synced LMDB file), over the entries of the round before, and grown in zero-filled steps: a
sync of a write that fits in the file changes no file size, so it has no file-system
metadata to commit. Reading (:func:`entries_after`) stops at the first entry whose checksum
fails (a write the machine's crash tore, or zeros) or whose sequence number does not follow
(an entry of the round before).
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

from ..private_files import FILE_MODE

_HEADER = struct.Struct("<IIQ")
_SEQ = struct.Struct("<Q")
# The file grows in steps of this many zero bytes (one size change, so one metadata commit,
# per step instead of one per sync).
_GROW_STEP = 1 << 20
_ZEROS = bytes(_GROW_STEP)
# A payload longer than this is taken as a torn header, not read.
_MAX_PAYLOAD = 1 << 31

Syncer = Callable[[int], None]


def _crc(seq: int, payload: bytes) -> int:
    return zlib.crc32(payload, zlib.crc32(_SEQ.pack(seq)))


class Journal:
    """A journal opened for writing (its commit thread's): two files, ``paths`` (``journal``
    and ``journal.b``, in a store's directory or beside a node's replicas), one written at a
    time.

    A checkpoint taken on the writer's thread (:meth:`rewind`) writes the current file from
    its start again. One whose data sync runs on a thread of its own (``checkpoint.py``)
    switches to the other file as it begins (:meth:`switch`), so the entries committed while
    it syncs go there, and the entries before it stay where they were until it is saved; the
    other file is written over only once that checkpoint is saved (the caller's rule)."""

    def __init__(self, paths: tuple[Path, Path], fdatasync: Syncer = os.fdatasync) -> None:
        self.paths = paths
        self._fdatasync = fdatasync
        self._fds = [os.open(path, os.O_RDWR | os.O_CREAT, FILE_MODE) for path in paths]
        self._sizes = [os.fstat(fd).st_size for fd in self._fds]
        self._current = 0
        self._position = 0
        self._unsynced = False

    @property
    def written(self) -> int:
        """Bytes appended since the last rewind or switch."""
        return self._position

    def append(self, seq: int, payload: bytes) -> None:
        """Write one entry after the last (into the page cache: a process crash keeps it)."""
        entry = _HEADER.pack(len(payload), _crc(seq, payload), seq) + payload
        end = self._position + len(entry)
        fd, current = self._fds[self._current], self._current
        while end > self._sizes[current]:
            os.pwrite(fd, _ZEROS, self._sizes[current])
            self._sizes[current] += _GROW_STEP
        os.pwrite(fd, entry, self._position)
        self._position = end
        self._unsynced = True

    def sync(self) -> None:
        """Make every entry appended so far durable (one fdatasync; none if nothing is new)."""
        if self._unsynced:
            self._fdatasync(self._fds[self._current])
            self._unsynced = False

    def rewind(self) -> None:
        """Write the next entry at offset 0 (every entry so far is in a synced checkpoint)."""
        self._position = 0
        self._unsynced = False

    def switch(self) -> None:
        """Write the next entry at offset 0 of the other file (every entry in it is in a
        saved checkpoint); what this file holds is synced first."""
        self.sync()
        self._current = 1 - self._current
        self._position = 0

    def close(self) -> None:
        for fd in self._fds:
            os.close(fd)


def journaled_after(paths: tuple[Path, Path], seq: int) -> list[tuple[int, bytes]]:
    """The entries numbered ``seq + 1, seq + 2, ...`` across both files of a journal: those a
    checkpoint running off the writer's thread left in one file, then those written in the
    other since it began (:meth:`Journal.switch`)."""
    out: list[tuple[int, bytes]] = []
    left = list(paths)
    while left:
        for path in left:
            found = list(entries_after(path, seq))
            if found:
                out += found
                seq = found[-1][0]
                left.remove(path)
                break
        else:
            break
    return out


def _whole_entries(path: Path) -> Iterator[tuple[int, bytes]]:
    """Every entry of a journal file from its start, as far as they are whole (reading stops
    at a torn entry or zeros), whatever their numbers."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return
    offset = 0
    while offset + _HEADER.size <= len(data):
        length, crc, entry_seq = _HEADER.unpack_from(data, offset)
        start = offset + _HEADER.size
        if length > _MAX_PAYLOAD or start + length > len(data):
            return
        payload = data[start : start + length]
        if (length == 0 and crc == 0) or _crc(entry_seq, payload) != crc:
            return
        yield entry_seq, payload
        offset = start + length


def entries_after(path: Path, seq: int) -> Iterator[tuple[int, bytes]]:
    """The journal's entries numbered ``seq + 1, seq + 2, ...`` in order, as far as they are
    whole: entries numbered ``seq`` or less before them are skipped (a round the checkpoint at
    ``seq`` made obsolete), and reading stops at a torn entry, zeros or a gap."""
    expected = seq + 1
    for entry_seq, payload in _whole_entries(path):
        if entry_seq > seq:
            if entry_seq != expected:
                return
            yield entry_seq, payload
            expected += 1
        elif expected != seq + 1:
            return  # an older entry after newer ones: the round before


def newest_seq(paths: tuple[Path, Path]) -> int:
    """The highest sequence number of any whole entry in a journal's files (0: none), so
    that a journal written again numbers its entries past everything in it."""
    return max((entry_seq for path in paths for entry_seq, _ in _whole_entries(path)), default=0)
