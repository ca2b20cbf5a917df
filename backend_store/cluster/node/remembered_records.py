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
"""

from __future__ import annotations

import logging
from pathlib import Path

from ...errors import Unavailable
from ..coordination.layout import PartitionRecord
from .durable_file import numbered_files, write_durably

log = logging.getLogger("pushgate.cluster")

RECORDS_DIR = "records"


def read_remembered(data_dir: Path) -> dict[int, PartitionRecord]:
    """Every record kept under ``data_dir`` (one that cannot be read is logged and skipped)."""
    out: dict[int, PartitionRecord] = {}
    for pid, path in numbered_files(data_dir / RECORDS_DIR):
        try:
            out[pid] = PartitionRecord.unpack(path.read_bytes())
        except (OSError, Unavailable) as exc:
            log.warning("ignoring the unreadable record %s: %s", path, exc)
    return out


def remember(data_dir: Path, partition: int, record: PartitionRecord) -> None:
    write_durably(data_dir / RECORDS_DIR / str(partition), record.pack())


def forget(data_dir: Path, partition: int) -> None:
    (data_dir / RECORDS_DIR / str(partition)).unlink(missing_ok=True)
