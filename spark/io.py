"""The pipeline's edges: finding and checking usage files, reading them with the fixed
schema, and replacing report directories atomically.

Usage files live under ``<data>/usage/date=YYYY-MM-DD/hour=HH/*.parquet`` (see
``gateway/usage/writer.py``). Names starting with ``.`` or ``_`` are unfinished writes or
markers and are never read. Every file is checked before Spark reads it: its Parquet
footer must parse and its columns must be the usage schema's, otherwise it is counted,
named in the report's manifest, and left out (a truncated file, a foreign file, a file
of another schema version). Reading the footer also gives each file's row count for
free, which the manifest uses to report duplicate records.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import datetime as dt
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession

from .schema import ARROW_TYPES, USAGE_SCHEMA

USAGE_SUBDIR = "usage"
_PARTITION = re.compile(r"date=(\d{4}-\d{2}-\d{2})/hour=(\d{2})$")


FILE_ID_KEY = b"pushgate.usage.file_id"


@dataclass(frozen=True, slots=True)
class UsageFile:
    path: Path
    hour: dt.datetime  # the UTC hour of its partition
    rows: int
    # "<gateway id>-<sequence>", the prefix of every record id in the file (None: a file
    # not written by a gateway, whose records must be deduplicated one by one).
    file_id: str | None = None


@dataclass(frozen=True, slots=True)
class BadFile:
    path: Path
    hour: dt.datetime
    reason: str


def hours(start: dt.datetime, end: dt.datetime) -> Iterator[dt.datetime]:
    """Every UTC hour that starts in [start, end), from the hour ``start`` is in."""
    hour = start.replace(minute=0, second=0, microsecond=0)
    while hour < end:
        yield hour
        hour += dt.timedelta(hours=1)


def partition_of(root: Path, hour: dt.datetime) -> Path:
    return root / f"date={hour:%Y-%m-%d}" / f"hour={hour:%H}"


def check_file(path: Path) -> tuple[int | None, str | None, str | None]:
    """(row count, file id, None) for a readable usage file, (None, None, reason) for a bad one."""
    try:
        meta = pq.read_metadata(path)
        schema = meta.schema.to_arrow_schema()
    except (OSError, pa.ArrowException) as exc:
        return None, None, f"unreadable: {exc}"
    types = {f.name: f.type for f in schema}
    for name, expected in ARROW_TYPES.items():
        got = types.get(name)
        if got is None:
            return None, None, f"missing column {name}"
        # A list's item field name and nullability differ between writers; compare the value type.
        if isinstance(expected, pa.ListType):
            if not (
                isinstance(got, pa.ListType | pa.LargeListType) and got.value_type == expected.value_type
            ):
                return None, None, f"column {name} is {got}, expected {expected}"
        elif got != expected:
            return None, None, f"column {name} is {got}, expected {expected}"
    file_id = (meta.metadata or {}).get(FILE_ID_KEY)
    return meta.num_rows, file_id.decode() if file_id else None, None


def find_usage_files(
    data_dir: Path, start: dt.datetime, end: dt.datetime
) -> tuple[list[UsageFile], list[BadFile]]:
    """The usage files of every hour in [start, end), checked; late files are simply
    files found now that were not there at the last run."""
    root = data_dir / USAGE_SUBDIR
    good: list[UsageFile] = []
    bad: list[BadFile] = []
    for hour in hours(start, end):
        directory = partition_of(root, hour)
        if not directory.is_dir():
            continue
        for entry in sorted(directory.iterdir()):
            if entry.name.startswith((".", "_")) or not entry.is_file():
                continue
            rows, file_id, reason = check_file(entry)
            if reason is None and rows is not None:
                good.append(UsageFile(entry, hour, rows, file_id))
            else:
                bad.append(BadFile(entry, hour, reason or "unreadable"))
    return good, bad


def drop_copies(files: list[UsageFile]) -> tuple[list[UsageFile], list[UsageFile]]:
    """(files to read, copies): files with one file id hold the same records (ids are
    unique per file), so all but one are left out whole instead of record by record. The
    one kept is the file named as the gateway names it, if there is one."""
    keep: dict[str, UsageFile] = {}
    for f in files:
        if f.file_id is None:
            continue
        current = keep.get(f.file_id)
        named = _written_name(f.file_id)
        if current is None or (f.path.name == named and current.path.name != named):
            keep[f.file_id] = f
    kept = [f for f in files if f.file_id is None or keep[f.file_id] is f]
    copies = [f for f in files if f.file_id is not None and keep[f.file_id] is not f]
    return kept, copies


def _written_name(file_id: str) -> str:
    """The name ``gateway/usage/writer.py`` gives the file of ``<gateway id>-<sequence>``."""
    gateway, _, sequence = file_id.rpartition("-")
    return f"{gateway}-{int(sequence):010d}.parquet" if sequence.isdigit() else ""


def read_usage(spark: SparkSession, files: list[UsageFile]) -> DataFrame:
    """The records of ``files`` with the usage schema (never inferred)."""
    if not files:
        return spark.createDataFrame([], USAGE_SCHEMA)
    return spark.read.schema(USAGE_SCHEMA).parquet(*(str(f.path) for f in files))


# Atomic replacement of a directory ------------------------------------------------------

_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _libc_renameat2() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    libc = ctypes.CDLL(name, use_errno=True)
    return getattr(libc, "renameat2", None)


_renameat2 = _libc_renameat2()


def replace_dir(new: Path, target: Path) -> None:
    """Put directory ``new`` at ``target``, replacing what was there in one step.

    Linux ``renameat2(RENAME_EXCHANGE)`` swaps the two names atomically: a reader sees the
    old directory or the new one, never neither and never a mix. Where it is missing
    (another OS, an old libc, a file system without it), the old directory is moved aside
    first: a reader may then briefly find no directory, still never a half-written one.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    if not target.exists():
        os.rename(new, target)
        return
    if _renameat2 is not None:
        rc = _renameat2(_AT_FDCWD, os.fsencode(new), _AT_FDCWD, os.fsencode(target), _RENAME_EXCHANGE)
        if rc == 0:
            _remove_tree(new)  # ``new`` now names the old directory
            return
    aside = target.with_name(f".{target.name}.old-{os.getpid()}")
    os.rename(target, aside)
    os.rename(new, target)
    _remove_tree(aside)


def _remove_tree(path: Path) -> None:
    import shutil

    with contextlib.suppress(FileNotFoundError):
        shutil.rmtree(path)


def write_atomic(path: Path, data: bytes) -> None:
    """Write a small file whole: temp file, fsync, rename."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, path)
