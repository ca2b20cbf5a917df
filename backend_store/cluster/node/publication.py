"""When a node writes its record (``nodes/{id}``: address, replicas' positions, strays) again.

Sans-I/O, so that the node process and the simulation's node follow one rule. A record is
written:

- at once when asked (a new session; a replica's role, a leader key or a stray changed);
- at once when the cluster's incarnation moved since the last write, even if the record is
  unchanged: after etcd went back in time a promotion counts only records written since the
  incarnation was raised (``manager/plan.py``), and the record etcd holds may be the
  snapshot's (simulation seed ``restore`` 90601, session 34: a second restore changed no
  leader key, so two voters never wrote their records again and the manager waited for them
  for good);
- otherwise only if it changed, and at most every ``every_s``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from ..coordination.layout import NodeRecord, PartitionRecord, ReplicaPosition
from ..coordination.storage_record import NodeStorage
from .receipts import KeptReceipt, published_receipts
from .reconcile import MapView
from .served_sets import ServedSets


def node_record(
    address: str,
    replicas: dict[int, ReplicaPosition],
    storage: NodeStorage | None,
    *,
    refusal: str | None,
    strays: Mapping[int, str],
    stray_ranks: Mapping[int, tuple[int, int]],
    partitions: MapView | None,
    remembered: Mapping[int, PartitionRecord],
    receipts: Mapping[int, KeptReceipt],
    served_sets: ServedSets,
    incarnation: int,
) -> NodeRecord:
    """The record a node writes: the positions of the replicas it hosts (``replicas``), its
    strays, and what its disk remembers that a manager needs after etcd lost or garbled
    something (kept records, receipts, earlier served sets). Built here for the node process
    and the simulation's node alike."""
    hosted = replicas.keys()
    return NodeRecord(
        address,
        "up" if refusal is None else "refused",
        replicas,
        storage,
        dict(strays),
        refusal,
        {pid: rank for pid, rank in stray_ranks.items() if pid in strays},
        partitions.kept(hosted, remembered) if partitions is not None else {},
        published_receipts(receipts, hosted, partitions.records if partitions is not None else {}),
        served_sets.earlier({*hosted, *strays}, incarnation),
    )


class Publication:
    def __init__(self, every_s: float) -> None:
        self.every_s = every_s
        self._asked = False
        self._forced = False
        self._last: NodeRecord | None = None
        self._at = -math.inf
        self._incarnation = 0
        self._building_in = 0

    def ask(self) -> None:
        """Write the record at the next round, changed or not."""
        self._asked = True

    def due(self, now: float, incarnation: int) -> bool:
        """Whether to build the record now. A request made while it is built stands for the
        next round (the record built may predate what was asked for)."""
        forced = self._asked or incarnation != self._incarnation
        if not forced and now - self._at < self.every_s:
            return False
        self._asked, self._forced, self._building_in = False, forced, incarnation
        return True

    def wanted(self, record: NodeRecord) -> bool:
        """Whether the record built after :meth:`due` is to be written."""
        return self._forced or record != self._last

    def written(self, record: NodeRecord, now: float) -> None:
        self._last, self._at, self._incarnation = record, now, self._building_in
