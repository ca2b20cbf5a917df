"""A node's storage use as it publishes it in its etcd record, next to its replica positions.

A node keeps one LMDB environment per partition replica (``DIR/partitions/<id>/``), so "how
full is this node" has two answers an operator needs: the **environment nearest its maximum
map size** (a write there fails with ``503`` once it is full, whatever the others hold; what
the ``map_use`` alert watches) and the **file system** under the data directory (the maps of
every environment grow on it; RabbitMQ's disk-free alarm and JetStream's storage figures are
about this). :class:`NodeStorage` carries both, plus the sums over the node's environments.
Nodes write it (``node/storage_gauge.py`` measures it); gateways and the manager read it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ...types import StorageUsage

# Disk figures are published in whole MiB: free space moves with every log line written on
# the machine, and a change of a few KiB is no reason to rewrite the node's record.
_DISK_UNIT = 1 << 20


@dataclass(frozen=True, slots=True)
class NodeStorage:
    """One node's storage use, in bytes."""

    used_bytes: int  # pages in use, summed over the node's partition environments
    map_size: int  # their current maps, summed (they grow on demand)
    max_map_size: int  # the largest each may grow to, summed
    environments: int
    fullest: StorageUsage | None  # the environment with the highest used / max_map_size
    disk_free_bytes: int  # available to the node on its data directory's file system
    disk_total_bytes: int

    @property
    def map_used_ratio(self) -> float:
        """The fullest environment's use of its maximum map (0..1): what "map full" is about."""
        return self.fullest.used_ratio if self.fullest is not None else 0.0

    def to_dict(self) -> dict[str, Any]:
        fullest = self.fullest
        return {
            "used_bytes": self.used_bytes,
            "map_size": self.map_size,
            "max_map_size": self.max_map_size,
            "environments": self.environments,
            "fullest": None
            if fullest is None
            else [fullest.used_bytes, fullest.map_size, fullest.max_map_size],
            "disk_free_bytes": self.disk_free_bytes,
            "disk_total_bytes": self.disk_total_bytes,
        }

    @classmethod
    def from_dict(cls, value: Any) -> NodeStorage | None:
        """The record's ``storage`` map; None when absent (a node of an older version) or malformed."""
        if not isinstance(value, Mapping):
            return None
        try:
            raw = value.get("fullest")
            fullest = None if raw is None else StorageUsage(int(raw[0]), int(raw[1]), int(raw[2]))
            return cls(
                used_bytes=int(value["used_bytes"]),
                map_size=int(value["map_size"]),
                max_map_size=int(value["max_map_size"]),
                environments=int(value["environments"]),
                fullest=fullest,
                disk_free_bytes=int(value["disk_free_bytes"]),
                disk_total_bytes=int(value["disk_total_bytes"]),
            )
        except (KeyError, IndexError, TypeError, ValueError):
            return None


def summarise(usages: Iterable[StorageUsage], disk_free: int, disk_total: int) -> NodeStorage:
    """A node's figures from its environments' usages and its file system's."""
    listed = list(usages)
    fullest = max(listed, key=lambda u: u.used_ratio, default=None)
    return NodeStorage(
        used_bytes=sum(u.used_bytes for u in listed),
        map_size=sum(u.map_size for u in listed),
        max_map_size=sum(u.max_map_size for u in listed),
        environments=len(listed),
        fullest=fullest,
        disk_free_bytes=disk_free // _DISK_UNIT * _DISK_UNIT,
        disk_total_bytes=disk_total // _DISK_UNIT * _DISK_UNIT,
    )
