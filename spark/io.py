"""The pipeline's input edge: finding and checking usage files in any number of usage
directories, and reading them with the fixed schema.

A usage directory holds ``date=YYYY-MM-DD/hour=HH/*.parquet`` (see
``gateway/usage/writer.py``); several gateways may write into one, and a report may read
several (``--usage``, repeatable), on any storage (``spark/storage.py``). Names starting
with ``.`` or ``_`` are unfinished writes or markers and are never read. Every file is
checked before Spark reads it: its Parquet footer must parse and its columns must be the
usage schema's, otherwise it is counted, named in the report's manifest, and left out (a
truncated file, a foreign file, a file of another schema version). The footer also gives
each file's row count and file id for free.

Records are counted once however the inputs overlap: one file reached through two
directories (``--usage d --usage d/``, ``--data D`` and ``--usage D/usage``) is one file,
and files with one file id (a copy under another name, in another directory) are read once
(:func:`drop_copies`).
"""

from __future__ import annotations

import datetime as dt
import struct
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession

from .schema import ARROW_TYPES, USAGE_SCHEMA
from .storage import LocalStorage, Storage, join, name_of

FILE_ID_KEY = b"pushgate.usage.file_id"
_MAGIC = b"PAR1"
# The tail read in one go: a usage file's footer is a few KiB; a bigger one is read again.
_TAIL = 64 * 1024
# Footers read at once from a file system reached through the JVM (each read is a few
# round trips that mostly wait).
_READERS = 8


@dataclass(frozen=True, slots=True)
class UsageRoot:
    """A usage directory, qualified, and the storage it lives on."""

    location: str
    storage: Storage


@dataclass(frozen=True, slots=True)
class UsageFile:
    path: str  # qualified location
    spark_path: str  # what Spark reads
    hour: dt.datetime  # the UTC hour of its partition
    rows: int
    # "<gateway id>-<sequence>", the prefix of every record id in the file (None: a file
    # not written by a gateway, whose records must be deduplicated one by one).
    file_id: str | None = None

    @property
    def name(self) -> str:
        return name_of(self.path)

    @property
    def gateway_id(self) -> str | None:
        """The gateway that wrote it (from its file id)."""
        return self.file_id.rpartition("-")[0] if self.file_id else None


@dataclass(frozen=True, slots=True)
class BadFile:
    path: str
    hour: dt.datetime
    reason: str

    @property
    def name(self) -> str:
        return name_of(self.path)


def hours(start: dt.datetime, end: dt.datetime) -> Iterator[dt.datetime]:
    """Every UTC hour that starts in [start, end), from the hour ``start`` is in."""
    hour = start.replace(minute=0, second=0, microsecond=0)
    while hour < end:
        yield hour
        hour += dt.timedelta(hours=1)


def partition_of(root: str, hour: dt.datetime) -> str:
    return join(root, f"date={hour:%Y-%m-%d}", f"hour={hour:%H}")


def parse_footer(size: int, tail: bytes) -> tuple[pq.FileMetaData | None, str | None]:
    """(metadata, None) from a file's last bytes, or (None, reason). Only the footer is
    parsed (the tail, behind a magic number), so any storage that can read a file's end
    can have its files checked without reading them whole."""
    if size < 12 or tail[-4:] != _MAGIC:
        return None, "unreadable: not a Parquet file (no footer)"
    (length,) = struct.unpack("<i", tail[-8:-4])
    if length <= 0 or length + 8 > len(tail):
        return None, "unreadable: truncated footer"
    try:
        return pq.read_metadata(pa.BufferReader(_MAGIC + tail[-(length + 8) :])), None
    except (OSError, pa.ArrowException) as exc:
        return None, f"unreadable: {exc}"


def check_schema(meta: pq.FileMetaData) -> str | None:
    """None for a usage file's columns, else why not."""
    try:
        schema = meta.schema.to_arrow_schema()
    except (OSError, pa.ArrowException) as exc:
        return f"unreadable: {exc}"
    types = {f.name: f.type for f in schema}
    for name, expected in ARROW_TYPES.items():
        got = types.get(name)
        if got is None:
            return f"missing column {name}"
        # A list's item field name and nullability differ between writers; compare the value type.
        if isinstance(expected, pa.ListType):
            if not (
                isinstance(got, pa.ListType | pa.LargeListType) and got.value_type == expected.value_type
            ):
                return f"column {name} is {got}, expected {expected}"
        elif got != expected:
            return f"column {name} is {got}, expected {expected}"
    return None


def check_file(storage: Storage, location: str, size: int) -> tuple[int | None, str | None, str | None]:
    """(row count, file id, None) for a readable usage file, (None, None, reason) for a bad one."""
    try:
        tail = storage.read_tail(location, size, min(size, _TAIL))
        meta, reason = parse_footer(size, tail)
        if meta is None and reason == "unreadable: truncated footer" and size > len(tail):
            (length,) = struct.unpack("<i", tail[-8:-4])
            meta, reason = parse_footer(size, storage.read_tail(location, size, min(size, length + 8)))
    except OSError as exc:
        return None, None, f"unreadable: {exc}"
    if meta is None:
        return None, None, reason
    reason = check_schema(meta)
    if reason is not None:
        return None, None, reason
    file_id = (meta.metadata or {}).get(FILE_ID_KEY)
    return meta.num_rows, file_id.decode() if file_id else None, None


def find_usage_files(
    roots: Sequence[UsageRoot], start: dt.datetime, end: dt.datetime
) -> tuple[list[UsageFile], list[BadFile]]:
    """The usage files of every hour in [start, end) in every root, checked, each file
    once however many roots reach it; late files are simply files found now that were not
    there at the last run."""
    listed: dict[str, tuple[UsageRoot, dt.datetime, int]] = {}
    for root in roots:
        for hour in hours(start, end):
            for location, size in root.storage.list_files(partition_of(root.location, hour)):
                listed.setdefault(location, (root, hour, size))

    def check(item: tuple[str, tuple[UsageRoot, dt.datetime, int]]) -> UsageFile | BadFile:
        location, (root, hour, size) = item
        rows, file_id, reason = check_file(root.storage, location, size)
        if reason is None and rows is not None:
            return UsageFile(location, root.storage.spark_path(location), hour, rows, file_id)
        return BadFile(location, hour, reason or "unreadable")

    # Local footers are read in microseconds; through the JVM a read mostly waits.
    local = all(isinstance(root.storage, LocalStorage) for root in roots)
    if local or len(listed) < 2:
        checked = [check(item) for item in listed.items()]
    else:
        with ThreadPoolExecutor(_READERS, thread_name_prefix="usage-footers") as pool:
            checked = list(pool.map(check, listed.items()))
    good = [c for c in checked if isinstance(c, UsageFile)]
    bad = [c for c in checked if isinstance(c, BadFile)]
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
        if current is None or (f.name == named and current.name != named):
            keep[f.file_id] = f
    kept = [f for f in files if f.file_id is None or keep[f.file_id] is f]
    copies = [f for f in files if f.file_id is not None and keep[f.file_id] is not f]
    return kept, copies


def _written_name(file_id: str) -> str:
    """The name ``gateway/usage/writer.py`` gives the file of ``<gateway id>-<sequence>``."""
    gateway, _, sequence = file_id.rpartition("-")
    return f"{gateway}-{int(sequence):010d}.parquet" if sequence.isdigit() else ""


def gateways_of(files: Sequence[UsageFile]) -> dict[str, dict[str, int]]:
    """Per gateway id (``""`` for files without a file id): files and records read."""
    found: dict[str, dict[str, int]] = {}
    for f in files:
        entry = found.setdefault(f.gateway_id or "", {"files": 0, "records": 0})
        entry["files"] += 1
        entry["records"] += f.rows
    return dict(sorted(found.items()))


def read_usage(spark: SparkSession, files: list[UsageFile]) -> DataFrame:
    """The records of ``files`` with the usage schema (never inferred)."""
    if not files:
        return spark.createDataFrame([], USAGE_SCHEMA)
    return spark.read.schema(USAGE_SCHEMA).parquet(*(f.spark_path for f in files))
