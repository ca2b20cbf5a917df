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

from ..coordination.layout import NodeRecord


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
