"""The partition record each replica was last served on, kept on the node's disk
(``DATA/records/<id>``).

A record etcd holds unreadable is rebuilt by the manager from the records the nodes kept
(``NodeRecord.kept``, manager/recovery.py). Kept in memory only, that knowledge went with a
restart or with a reload of the map after etcd was wiped: in simulation seed ``all`` 245739
(session 37) p2's record was corrupted, etcd was backed up, wiped and restored from that
backup, every node had restarted or reloaded its map meanwhile, and the partition stayed
unserved for good. So a node writes each record it serves a replica on here when it changes
(a membership change or a designation: rare), and publishes it for a partition whose record
etcd holds unreadable and this process never read (:meth:`.reconcile.MapView.kept`). It is
only published, never served on: serving waits for a readable record.

Beside each record, its mark (``DATA/records/<id>.mark``): the incarnation and the record's
mod revision in etcd when it was written here. etcd holding the record at an older mod
revision in that incarnation went back in time (coordination/timeline.py, ``check_marks``):
a node that was down while etcd was restored sees it there, whatever etcd's revision.
"""

from __future__ import annotations

import logging
from pathlib import Path

from ...errors import Unavailable
from ..coordination.layout import PartitionRecord
from ..coordination.timeline import RecordMark
from .durable_file import numbered_files, write_durably

log = logging.getLogger("pushgate.cluster")

RECORDS_DIR = "records"
MARK_SUFFIX = ".mark"


def read_remembered(data_dir: Path) -> dict[int, PartitionRecord]:
    """Every record kept under ``data_dir`` (one that cannot be read is logged and skipped)."""
    out: dict[int, PartitionRecord] = {}
    for pid, path in numbered_files(data_dir / RECORDS_DIR):
        try:
            out[pid] = PartitionRecord.unpack(path.read_bytes())
        except (OSError, Unavailable) as exc:
            log.warning("ignoring the unreadable record %s: %s", path, exc)
    return out


def read_marks(data_dir: Path) -> dict[int, RecordMark]:
    """Every record's mark kept under ``data_dir`` (one that cannot be read is skipped)."""
    out: dict[int, RecordMark] = {}
    for pid, path in numbered_files(data_dir / RECORDS_DIR):
        mark = path.with_name(path.name + MARK_SUFFIX)
        try:
            out[pid] = RecordMark.unpack(mark.read_bytes())
        except FileNotFoundError:
            continue  # kept by a version before marks
        except (OSError, ValueError) as exc:
            log.warning("ignoring the unreadable mark %s: %s", mark, exc)
    return out


def worth_keeping(
    record: PartitionRecord,
    mark: RecordMark | None,
    kept: PartitionRecord | None,
    kept_mark: RecordMark | None,
) -> bool:
    """Whether ``record`` (with ``mark``) is to be written over what is ``kept``: it changed,
    or a record kept by a version before marks can get one now."""
    return record != kept or (mark is not None and kept_mark is None)


def remember(data_dir: Path, partition: int, record: PartitionRecord, mark: RecordMark | None) -> None:
    path = data_dir / RECORDS_DIR / str(partition)
    write_durably(path, record.pack())
    if mark is not None:
        write_durably(path.with_name(path.name + MARK_SUFFIX), mark.pack())


def forget(data_dir: Path, partition: int) -> None:
    path = data_dir / RECORDS_DIR / str(partition)
    path.unlink(missing_ok=True)
    path.with_name(path.name + MARK_SUFFIX).unlink(missing_ok=True)
