"""Where the report reads usage files and writes its output: a local file system, or any
file system the Spark session's Hadoop configuration provides.

A location is a string: a local path or ``file:`` URI (:class:`LocalStorage`, the
operating system and pyarrow, no JVM), or a URI of any other scheme (``hdfs://``,
``s3a://``, ``viewfs://``, ...: :class:`HadoopStorage`, Hadoop's ``FileSystem`` in the
driver's JVM, as Spark itself reaches it). Spark reads and writes the bulk data itself
(:meth:`Storage.spark_path`); the driver only lists directories, reads file footers and
small files, and renames directories into place.

What differs between the two is written down on each method: a local directory is swapped
in one step (``renameat2(RENAME_EXCHANGE)``) and two runs on one output wait for each other
(``flock``); Hadoop file systems have neither, so a directory is moved aside and the new one
moved in (a reader may briefly find none), and a second run on one output is refused while
the first holds its lock file.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import fcntl
import os
import posixpath
import re
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from pyspark.sql import SparkSession

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")


class StorageError(Exception):
    """A location the report cannot use as asked; ``code`` is stable."""

    code = "storage_error"


def scheme_of(location: str) -> str | None:
    """The URI scheme (lower case), or None for a plain path."""
    match = _SCHEME.match(location)
    return match.group(1).lower() if match else None


def join(location: str, *parts: str) -> str:
    """``location/part/...`` for paths and URIs alike."""
    return "/".join([location.rstrip("/"), *parts]) if parts else location


def name_of(location: str) -> str:
    return posixpath.basename(location.rstrip("/"))


def parent_of(location: str) -> str:
    return location.rstrip("/").rsplit("/", 1)[0]


def hidden(name: str) -> bool:
    """Unfinished writes (``.x.tmp``) and markers (``_SUCCESS``), never read as data."""
    return name.startswith((".", "_"))


class Storage(Protocol):
    """The driver's file operations. Locations passed in are :meth:`qualify`'d ones."""

    def qualify(self, location: str) -> str:
        """The location's one canonical form: a file reached by two spellings (a trailing
        slash, a symbolic link, a relative path) is one file."""
        ...

    def spark_path(self, location: str) -> str:
        """What to hand Spark's readers and writers for this location."""
        ...

    def list_files(self, directory: str) -> list[tuple[str, int]]:
        """(location, size) of the visible files directly in ``directory``, sorted by name;
        none if it does not exist."""
        ...

    def list_dirs(self, directory: str) -> list[str]:
        """The visible subdirectories of ``directory``, sorted by name."""
        ...

    def read_tail(self, location: str, size: int, length: int) -> bytes:
        """The last ``length`` bytes of a file of ``size`` bytes."""
        ...

    def read_bytes(self, location: str) -> bytes: ...

    def write_bytes(self, location: str, data: bytes) -> None:
        """Write a small file whole: a reader sees the old content or the new, never part."""
        ...

    def exists(self, location: str) -> bool: ...

    def mkdirs(self, location: str) -> None: ...

    def rename(self, source: str, target: str) -> None:
        """Move ``source`` to ``target``, which must not exist."""
        ...

    def replace_dir(self, new: str, target: str) -> None:
        """Put directory ``new`` at ``target``, replacing what was there."""
        ...

    def delete(self, location: str) -> None:
        """Remove a file or a whole directory; nothing if it is missing."""
        ...

    def lock(self, location: str) -> contextlib.AbstractContextManager[None]:
        """Held while one run writes an output tree."""
        ...


def open_storage(location: str, spark: SparkSession | None) -> Storage:
    """The storage of ``location``: local for a path or ``file:`` URI, Hadoop for the rest
    (which needs the session's JVM)."""
    if scheme_of(location) in (None, "file"):
        return LocalStorage()
    if spark is None:
        raise StorageError(f"{location}: a URI of this scheme is read through Spark")
    return HadoopStorage(spark)


# Local files ------------------------------------------------------------------------------

_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _libc_renameat2() -> Any:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    return getattr(ctypes.CDLL(name, use_errno=True), "renameat2", None)


_renameat2 = _libc_renameat2()


def _local_path(location: str) -> str:
    if scheme_of(location) == "file":
        parts = urlsplit(location)
        if parts.netloc not in ("", "localhost"):
            raise StorageError(f"{location}: a file: URI names no host")
        return parts.path
    return location


class LocalStorage:
    """Files on this machine (on a cluster: a mount every executor sees at the same path)."""

    def qualify(self, location: str) -> str:
        return os.path.realpath(_local_path(location))

    def spark_path(self, location: str) -> str:
        # Explicitly file: so a cluster whose default file system is HDFS reads the same
        # files the driver listed. Not percent-encoded: Hadoop's Path takes the characters
        # as they are (as_uri() would turn date= into date%3D, a directory that is not there).
        return "file://" + os.path.abspath(location)

    def list_files(self, directory: str) -> list[tuple[str, int]]:
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except (FileNotFoundError, NotADirectoryError):
            return []
        return [(e.path, e.stat().st_size) for e in entries if not hidden(e.name) and e.is_file()]

    def list_dirs(self, directory: str) -> list[str]:
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except (FileNotFoundError, NotADirectoryError):
            return []
        return [e.path for e in entries if not hidden(e.name) and e.is_dir()]

    def read_tail(self, location: str, size: int, length: int) -> bytes:
        with open(location, "rb") as f:
            f.seek(max(0, size - length))
            return f.read(length)

    def read_bytes(self, location: str) -> bytes:
        return Path(location).read_bytes()

    def write_bytes(self, location: str, data: bytes) -> None:
        tmp = join(parent_of(location), f".{name_of(location)}.tmp")
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, location)

    def exists(self, location: str) -> bool:
        return os.path.exists(location)

    def mkdirs(self, location: str) -> None:
        os.makedirs(location, exist_ok=True)

    def rename(self, source: str, target: str) -> None:
        if os.path.exists(target):
            raise StorageError(f"{target} exists")
        os.rename(source, target)

    def replace_dir(self, new: str, target: str) -> None:
        """In one step: Linux ``renameat2(RENAME_EXCHANGE)`` swaps the two names, so a reader
        sees the old directory or the new one, never neither and never a mix. Where it is
        missing (another OS, an old libc, a file system without it) the old directory is
        moved aside first: a reader may then briefly find none, never a half-written one."""
        os.makedirs(parent_of(target), exist_ok=True)
        if not os.path.exists(target):
            os.rename(new, target)
            return
        if _renameat2 is not None:
            rc = _renameat2(_AT_FDCWD, os.fsencode(new), _AT_FDCWD, os.fsencode(target), _RENAME_EXCHANGE)
            if rc == 0:
                self.delete(new)  # ``new`` now names the old directory
                return
        aside = join(parent_of(target), f".{name_of(target)}.old-{uuid.uuid4().hex[:12]}")
        os.rename(target, aside)
        os.rename(new, target)
        self.delete(aside)

    def delete(self, location: str) -> None:
        if os.path.isdir(location) and not os.path.islink(location):
            shutil.rmtree(location, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(location)

    @contextlib.contextmanager
    def lock(self, location: str) -> Iterator[None]:
        """``flock``: a second run waits for the first (and a crashed run holds nothing)."""
        with open(location, "w") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            yield


# Hadoop file systems ----------------------------------------------------------------------


class HadoopStorage:
    """Any file system of the session's Hadoop configuration, through the driver's JVM
    (each call is a py4j round trip: listing and checking a file costs a few of them)."""

    def __init__(self, spark: SparkSession) -> None:
        self._jvm: Any = spark._jvm  # Spark's only door to Hadoop's FileSystem
        self._conf: Any = spark._jsc.hadoopConfiguration()

    def _path(self, location: str) -> Any:
        return self._jvm.org.apache.hadoop.fs.Path(location)

    def _fs(self, path: Any) -> Any:
        return path.getFileSystem(self._conf)

    def _missing(self, exc: Exception) -> bool:
        return "java.io.FileNotFoundException" in str(exc)

    def qualify(self, location: str) -> str:
        path = self._path(location)
        return str(self._fs(path).makeQualified(path).toString())

    def spark_path(self, location: str) -> str:
        return location

    def _list(self, directory: str) -> list[Any]:
        path = self._path(directory)
        try:
            return list(self._fs(path).listStatus(path))
        except Exception as exc:  # py4j's Py4JJavaError, typed only at run time
            if self._missing(exc):
                return []
            raise

    def list_files(self, directory: str) -> list[tuple[str, int]]:
        found = []
        for status in self._list(directory):
            name = str(status.getPath().getName())
            if not hidden(name) and status.isFile():
                found.append((join(directory, name), int(status.getLen())))
        return sorted(found)

    def list_dirs(self, directory: str) -> list[str]:
        found = []
        for status in self._list(directory):
            name = str(status.getPath().getName())
            if not hidden(name) and status.isDirectory():
                found.append(join(directory, name))
        return sorted(found)

    def read_tail(self, location: str, size: int, length: int) -> bytes:
        path = self._path(location)
        stream = self._fs(path).open(path)
        try:
            stream.seek(max(0, size - length))
            # readNBytes returns a byte[], which py4j hands over as bytes in one piece.
            return bytes(stream.readNBytes(min(length, size)))
        finally:
            stream.close()

    def read_bytes(self, location: str) -> bytes:
        path = self._path(location)
        stream = self._fs(path).open(path)
        try:
            return bytes(stream.readAllBytes())
        finally:
            stream.close()

    def write_bytes(self, location: str, data: bytes) -> None:
        """Written aside and renamed in; the old file is deleted first (a Hadoop rename does
        not replace), so a reader may briefly find none, never a part."""
        tmp = join(parent_of(location), f".{name_of(location)}.tmp-{uuid.uuid4().hex[:12]}")
        path = self._path(tmp)
        stream = self._fs(path).create(path, True)
        try:
            stream.write(bytearray(data))
            stream.hsync()
        finally:
            stream.close()
        self.delete(location)
        self.rename(tmp, location)

    def exists(self, location: str) -> bool:
        path = self._path(location)
        return bool(self._fs(path).exists(path))

    def mkdirs(self, location: str) -> None:
        path = self._path(location)
        if not self._fs(path).mkdirs(path):
            raise StorageError(f"cannot create {location}")

    def rename(self, source: str, target: str) -> None:
        src, dst = self._path(source), self._path(target)
        if self._fs(dst).exists(dst):
            raise StorageError(f"{target} exists")
        if not self._fs(src).rename(src, dst):
            raise StorageError(f"cannot rename {source} to {target}")

    def replace_dir(self, new: str, target: str) -> None:
        """The old directory is moved aside, the new one moved in, the old one deleted: a
        reader may briefly find no directory, never a half-written one."""
        self.mkdirs(parent_of(target))
        if not self.exists(target):
            self.rename(new, target)
            return
        aside = join(parent_of(target), f".{name_of(target)}.old-{uuid.uuid4().hex[:12]}")
        self.rename(target, aside)
        self.rename(new, target)
        self.delete(aside)

    def delete(self, location: str) -> None:
        path = self._path(location)
        self._fs(path).delete(path, True)

    @contextlib.contextmanager
    def lock(self, location: str) -> Iterator[None]:
        """A lock file made with an exclusive create: a second run is refused (not made to
        wait) while it exists. A crashed run leaves it behind; remove it by hand then."""
        path = self._path(location)
        if not self._fs(path).createNewFile(path):
            raise StorageError(
                f"another report is writing this output ({location} exists; "
                "if no report runs, a crashed one left it: remove it)"
            )
        try:
            yield
        finally:
            self.delete(location)
