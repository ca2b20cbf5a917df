"""Backups of the embedded store: a consistent copy taken while it serves, and its restore.

``backup`` opens the store's LMDB environment read-only, as one more reader beside whatever
process serves it, and copies one read transaction's snapshot, compacted, into a single file
(LMDB's ``mdb_env_copyfd2``): every commit before the copy began is in it whole, none after.
Nothing in the serving process changes: a reader only keeps the writer from reusing the pages
its snapshot still shows. Messages a gateway was holding in memory for a consumer (holds.py)
are on disk as visible and come back visible after a restore: delivered again, which
at-least-once allows, as after a crash.

``restore`` puts such a file in place of a store that no process has open. It refuses while
one does (the store's own lock files, hold_lock.py, say so), checks that the file is a
Pushgate store this version can read before it touches anything, and never deletes the store
it replaces: that one is renamed ``<store>.before-restore-<UTC time>``.

What a backup does not hold: the gateway's usage files and audit log (plain files beside the
store, ``DATA/usage`` and ``DATA/audit``: copy them as files), and the encryption keys (the
backup's bodies stay sealed; a gateway starts on the restored store only with the same keys,
as on the original). docs/store.md, "Backup and restore".
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lmdb

from ..durable import fsync_directory
from ..errors import ConfigurationError
from .engine import FORMAT_KEY, STORE_FORMAT
from .environment import Db
from .hold_lock import HoldLock
from .keys import read_u64

DATA_FILE = "data.mdb"
_META = Db.META.name.lower().encode()


@dataclass(frozen=True, slots=True)
class BackupInfo:
    path: Path
    bytes: int
    format: int
    seconds: float


@dataclass(frozen=True, slots=True)
class RestoreInfo:
    store: Path
    bytes: int
    format: int
    replaced: Path | None  # where the store it replaced was kept (None: there was none)


# How many times a backup adopts a map its store's writer grew while the copy began: each
# growth doubles the map, so eight in a row mean a store grown 256-fold meanwhile.
_RESIZES = 8


def open_reader(store: Path) -> Any:
    """The store's environment, read-only, as one more reader in its lock file. Mapped at the
    size its writer last committed (``map_size=0``); py-lmdb's default 10 MiB, or the data's
    end if larger, would make a read fail once the writer added a page past it."""
    return lmdb.open(str(store), readonly=True, lock=True, max_dbs=1, subdir=True, map_size=0)


def backup(store: Path, target: Path, *, open_env: Callable[[Path], Any] = open_reader) -> BackupInfo:
    """Copy the store at ``store`` (a directory, served or not) into the new file ``target``."""
    if not (store / DATA_FILE).is_file():
        raise ConfigurationError(f"no store at {store} (no {DATA_FILE})")
    if target.exists():
        raise ConfigurationError(f"{target} exists; a backup never overwrites a file")
    started = time.monotonic()
    partial = target.with_name(target.name + ".partial")
    env = open_env(store)
    try:
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            _copy(env, fd)
            os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            partial.unlink()
        raise
    finally:
        env.close()
    try:
        found = store_format(partial)
    except BaseException:
        partial.unlink()
        raise
    os.rename(partial, target)
    fsync_directory(target.parent)
    return BackupInfo(target, target.stat().st_size, found, time.monotonic() - started)


def _copy(env: Any, fd: int) -> None:
    """One read transaction's snapshot, compacted, into ``fd``. A serving writer that grew
    its map past this reader's since it opened fails the copy's read transaction with
    ``MDB_MAP_RESIZED`` before anything is written; LMDB's answer is to adopt the new size
    (``set_mapsize(0)``) and begin again."""
    for _ in range(_RESIZES):
        try:
            env.copyfd(fd, compact=True)
            return
        except lmdb.MapResizedError:
            env.set_mapsize(0)
            os.ftruncate(fd, 0)
            os.lseek(fd, 0, os.SEEK_SET)
    env.copyfd(fd, compact=True)


def restore(source: Path, store: Path) -> RestoreInfo:
    """Put the backup file ``source`` in place of the store directory ``store`` (which no
    process may have open; a missing one is created)."""
    found = store_format(source)  # before anything is touched
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    staging = store.with_name(store.name + ".restoring")
    replaced = store.with_name(f"{store.name}.before-restore-{stamp}")
    for n in itertools.count(2):
        if not replaced.exists():
            break
        replaced = store.with_name(f"{store.name}.before-restore-{stamp}-{n}")
    store.parent.mkdir(parents=True, exist_ok=True)
    with _alone_with(store):
        if staging.exists():
            shutil.rmtree(staging)  # a restore that stopped half-way: never a store anyone used
        staging.mkdir()
        shutil.copyfile(source, staging / DATA_FILE)
        with open(staging / DATA_FILE, "rb+") as copied:
            os.fsync(copied.fileno())
        fsync_directory(staging)
        kept: Path | None = None
        if store.exists():
            os.rename(store, replaced)
            kept = replaced
        os.rename(staging, store)
        fsync_directory(store.parent)
    return RestoreInfo(store, (store / DATA_FILE).stat().st_size, found, kept)


def store_format(path: Path) -> int:
    """The store format of an LMDB file (a backup), if it is a Pushgate store this version
    reads; a clear error otherwise."""
    if not path.is_file():
        raise ConfigurationError(f"no backup file at {path}")
    try:
        env = lmdb.open(str(path), readonly=True, lock=False, subdir=False, max_dbs=1)
    except lmdb.Error as exc:
        raise ConfigurationError(f"{path} is not a store backup: {exc}") from None
    try:
        with env.begin() as txn:
            try:
                meta = env.open_db(_META, txn=txn, create=False)
            except lmdb.NotFoundError:
                raise ConfigurationError(f"{path} is not a Pushgate store (no meta database)") from None
            raw = txn.get(FORMAT_KEY, db=meta)
    finally:
        env.close()
    found = read_u64(raw) if raw else 1
    if found > STORE_FORMAT:
        raise ConfigurationError(
            f"{path} was written by a newer Pushgate (store format {found}); this version reads"
            f" formats up to {STORE_FORMAT}"
        )
    return found


@contextlib.contextmanager
def _alone_with(store: Path) -> Iterator[None]:
    """Hold the store's lock files as its only user for the block, or refuse."""
    if not store.exists():
        yield
        return
    lock = HoldLock(store)
    try:
        if not lock.elect():
            raise ConfigurationError(
                f"the store {store} is open in another process (a running gateway or"
                " pushgate admin): stop it first"
            )
        yield
    finally:
        lock.close()
