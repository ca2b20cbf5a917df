"""Usage files: hour-partitioned Parquet, each written whole or not at all.

Layout (Hive-style partitions, which Spark and pyarrow understand)::

    <usage dir>/date=YYYY-MM-DD/hour=HH/<gateway-id>-<sequence>.parquet

The usage directory is ``<data>/usage`` unless ``--usage-dir`` names another, which several
gateways may share (an NFS mount): names carry the gateway id, new at every start, so two
gateways never write one name, and each file is one atomic rename.

A file is written as ``.<name>.tmp`` in its final directory, fsynced, renamed to its
name and the directory fsynced. Readers skip names that start with ``.`` (Spark and
``spark/io.py`` both do), and a rename within a directory is atomic, so a reader sees
either no file or the whole file. A crash mid-write leaves at most a ``.tmp`` file,
which :meth:`UsageWriter.remove_stale_temps` deletes at a later start.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import time
from pathlib import Path

import pyarrow.parquet as pq

from backend_store.durable import fsync_directory
from backend_store.private_files import open_private, private_dir

from .record import FILE_ID_KEY, UsageRecord, to_table

USAGE_SUBDIR = "usage"
TMP_SUFFIX = ".tmp"


def partition_dir(root: Path, window_start_us: int) -> Path:
    """The directory of the hour ``window_start_us`` (UTC) falls in."""
    when = dt.datetime.fromtimestamp(window_start_us / 1_000_000, tz=dt.UTC)
    return root / f"date={when:%Y-%m-%d}" / f"hour={when:%H}"


class UsageWriter:
    """Writes one flush's records to one file under ``root`` (the usage directory)."""

    def __init__(self, root: Path, gateway_id: str) -> None:
        self.root = root
        self.gateway_id = gateway_id

    def write(self, records: list[UsageRecord], sequence: int) -> Path:
        """Write ``records`` (all of one window) atomically; return the file's path.

        Blocking (file I/O and fsync): call it from a worker thread.
        """
        if not records:
            raise ValueError("nothing to write")
        directory = partition_dir(self.root, records[0].window_start_us)
        private_dir(directory)
        name = f"{self.gateway_id}-{sequence:010d}.parquet"
        final = directory / name
        tmp = directory / f".{name}{TMP_SUFFIX}"
        try:
            with os.fdopen(open_private(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "wb") as f:
                table = to_table(records)
                # The file's identity (its records' id prefix): a reader that finds two
                # files with one id (a copy) reads one, without comparing every record.
                file_id = f"{self.gateway_id}-{sequence}".encode()
                table = table.replace_schema_metadata({**table.schema.metadata, FILE_ID_KEY: file_id})
                pq.write_table(table, f, compression="zstd")
                f.flush()
                os.fsync(f.fileno())
            os.rename(tmp, final)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        fsync_directory(directory)
        return final

    def remove_stale_temps(self, older_than_s: float = 600.0) -> int:
        """Delete ``.tmp`` files a crashed writer left; return how many.

        Only old ones: another gateway sharing the directory may be writing one now.
        """
        if not self.root.is_dir():
            return 0
        removed = 0
        cutoff = time.time() - older_than_s
        for tmp in self.root.glob(f"date=*/hour=*/.*{TMP_SUFFIX}"):
            with contextlib.suppress(FileNotFoundError):
                if tmp.stat().st_mtime < cutoff:
                    tmp.unlink()
                    removed += 1
        return removed
