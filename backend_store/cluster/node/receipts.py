"""What a node remembers of the copies it deleted on a move's tombstone (``DATA/receipts/``).

A move deletes the old copy only once the new voting set has committed past everything it
held (``manager/membership.py``). An etcd restored from a backup taken before the move names
the node again, and the node makes a new, empty copy; counted as a voter, that copy and one
other replica could make a majority that lacks what the newer set acknowledged (simulation
seeds ``all`` 222767, 234061, 240328, session 37). So before it deletes the copy, the node
writes the tombstone's :class:`~..coordination.layout.MoveReceipt` here, with the copy's label;
a copy of the same partition of the same queue made again, and still empty, is published as
``remade`` with that receipt (:func:`remade`), and the manager counts it for nothing and
looks for a majority of the receipt's set instead (``manager/election.py``).

One file per partition, ``DATA/receipts/<id>``: msgpack, written to a new file, fsynced and
renamed into place before the copy's directories go. A newer receipt replaces an older one.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import msgpack

from ..coordination.layout import MoveReceipt, ReplicaPosition
from .durable_file import numbered_files, write_durably
from .node_identity import pack_label, unpack_label
from .reconcile import ReplicaLabel

log = logging.getLogger("pushgate.cluster")

RECEIPTS_DIR = "receipts"


@dataclass(frozen=True, slots=True)
class KeptReceipt:
    """A deleted copy's label (which queue's partition it was) and its tombstone's receipt."""

    label: ReplicaLabel
    receipt: MoveReceipt


def remade(
    kept: KeptReceipt | None, label: ReplicaLabel | None, position: ReplicaPosition
) -> ReplicaPosition:
    """``position`` as published: marked ``remade`` if it is an empty copy of the very
    partition (same cluster, queue and queue revision) a move deleted here."""
    if kept is None or label != kept.label or position.lsn != 0 or position.last_epoch != 0:
        return position
    return replace(position, remade=kept.receipt)


def published_receipts(
    kept: Mapping[int, KeptReceipt], hosted: Collection[int], named: Collection[int]
) -> dict[int, MoveReceipt]:
    """The receipts a node publishes beside its positions: those of partitions the map names
    (``named``) that it does not hold again (``hosted``: a copy made again carries its receipt
    as ``remade``)."""
    return {pid: k.receipt for pid, k in kept.items() if pid in named and pid not in hosted}


def read_receipts(data_dir: Path) -> dict[int, KeptReceipt]:
    """Every receipt kept under ``data_dir`` (one that cannot be read is logged and skipped:
    its copy then counts as any empty copy did before receipts)."""
    out: dict[int, KeptReceipt] = {}
    for pid, path in numbered_files(data_dir / RECEIPTS_DIR):
        try:
            doc = msgpack.unpackb(path.read_bytes(), raw=False)
            label = unpack_label(doc["label"])
            receipt = MoveReceipt.from_doc(doc["receipt"])
            if label is None or receipt is None:
                raise ValueError("no label or no receipt")
        except (OSError, KeyError, TypeError, ValueError, msgpack.UnpackException) as exc:
            log.warning("ignoring the unreadable receipt %s: %s", path, exc)
            continue
        out[pid] = KeptReceipt(label, receipt)
    return out


def keep_receipt(data_dir: Path, partition: int, kept: KeptReceipt) -> None:
    """Write ``DATA/receipts/<partition>`` durably."""
    doc = {"label": pack_label(kept.label), "receipt": kept.receipt.to_doc()}
    write_durably(data_dir / RECEIPTS_DIR / str(partition), msgpack.packb(doc, use_bin_type=True))
