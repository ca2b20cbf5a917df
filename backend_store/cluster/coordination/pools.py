"""Shared partitions: pools of partitions that hold many queues (docs/cluster.md, "Shared partitions").

A partition is a replication group (an LMDB environment, a writer thread, a replication log,
a leader key and links). Until session 50 every queue had its own; a push gateway makes an
inbox per user or device, and that cost a thread, files and an election per queue. Now
queues of one replication class share a **pool** of partitions:

- A pool is named by its class, ``rf{factor}-{mode}`` (``rf3-sync``). Its partitions are
  ordinary partition records with ``tenant == ""`` (no tenant may be empty) and
  ``queue == pool name``; ``index`` is the slot in the pool, ``queue_revision`` is None.
  Replicas, leaders, moves, drains and failover work on them exactly as on any partition:
  per partition, whatever the number of queues inside.
- ``pools/{name}`` (written by gateways, create-if-absent) asks for a pool
  (:class:`PoolRequest`); the manager makes one slot per registered node (or
  ``--partitions``), at least ``min_partitions`` (which gateways before session 66 raised
  for a queue with more partitions than the pool had), adds slots as nodes join, and never
  deletes a pool's partitions (``manager/plan.py``).
- A queue's record carries its ``placement``: the partition ids of its partitions, by index
  (:func:`place` chose them when the queue was created; they never change). A queue with
  more partitions than its pool names some twice: its own partitions are the distinct ones.
  A record with no placement is a queue made before pools: it keeps its own partitions, as
  before (the upgrade in place).
- Deleting a queue marks its record ``deleting`` first: the leaders of its placement delete
  it from their stores on that mark (never on a record's absence, which an etcd restore can
  fake), then the record goes.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...errors import InvalidRequest, Unavailable
from .layout import pack, unpack

POOL_TENANT = ""  # a pool partition's record's tenant: never a real tenant's
PLACEMENT = "placement"  # queue record field: [partition id, ...] by index
DELETING = "deleting"  # queue record field: true while its partitions delete it


def pool_name(replication_factor: int, mode: str) -> str:
    """The pool a queue of this class lives in (``rf3-sync``)."""
    if mode not in ("sync", "async"):
        raise InvalidRequest(f"replication mode {mode!r} is neither 'sync' nor 'async'")
    return f"rf{replication_factor}-{mode}"


@dataclass(frozen=True, slots=True)
class PoolRequest:
    """``pools/{name}``: a pool gateways asked for. ``min_partitions``: the most partitions a
    queue of the pool asked for (the pool has at least that many slots)."""

    replication_factor: int
    mode: str
    min_partitions: int = 1

    @property
    def name(self) -> str:
        return pool_name(self.replication_factor, self.mode)

    def pack(self) -> bytes:
        return pack(
            {
                "replication_factor": self.replication_factor,
                "replication_mode": self.mode,
                "min_partitions": self.min_partitions,
            }
        )

    @classmethod
    def unpack(cls, data: bytes) -> PoolRequest:
        v = unpack(data)
        try:
            return cls(
                int(v["replication_factor"]), str(v["replication_mode"]), int(v.get("min_partitions", 1))
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise Unavailable(f"malformed pool request: {exc}") from None


def place(tenant: str, name: str, count: int, slots: Sequence[int]) -> tuple[int, ...]:
    """The ``count`` partitions a new queue lives on, by index: consecutive slots of its pool
    from one its name hashes to. ``slots``: the pool's partition ids by slot. Deterministic, so
    that every gateway (and the simulation) places alike; spread, because CRC-32 is. A queue
    asking for more partitions than the pool has wraps around: its indexes ``i`` and
    ``i + len(slots)`` share a partition (the pool's partitions are the units of parallelism,
    and a queue's index only routes: docs/cluster.md, "More partitions than the pool")."""
    if not slots:
        raise Unavailable("the pool has no partitions yet; retry")
    start = zlib.crc32(f"{tenant}/{name}".encode()) % len(slots)
    return tuple(slots[(start + i) % len(slots)] for i in range(count))


def placement(doc: Mapping[str, Any]) -> tuple[int, ...] | None:
    """A queue record's placement (None: a queue made before pools, on its own partitions;
    empty: one this version cannot read, placed nowhere it can serve, and never given
    partitions of its own: a watch's listener must not fail on one record)."""
    raw = doc.get(PLACEMENT)
    if not isinstance(raw, list | tuple) or not raw:
        return None
    try:
        return tuple(int(pid) for pid in raw)
    except (TypeError, ValueError):
        return ()


def deleting(doc: Mapping[str, Any]) -> bool:
    """Whether a queue record is marked for deletion (its partitions delete it on this mark)."""
    return doc.get(DELETING) is True
