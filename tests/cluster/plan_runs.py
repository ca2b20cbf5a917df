"""A manager's successive plans without etcd: the test plays the nodes (what they publish)
and the clock, :class:`Run` plays the manager (its memory, its fenced writes)."""

from __future__ import annotations

from collections.abc import Collection

from backend_store.cluster.coordination.layout import NodeRecord, ReplicaPosition
from backend_store.cluster.manager.plan import ClusterView, Memory, Plan, PlanSettings, plan

SETTINGS = PlanSettings(settle_s=3.0, handover_timeout_s=5.0, replace_after_s=300.0)


class Run:
    """Plans on ``view`` at a clock the test moves; :meth:`step` also writes the plan into
    the view, as the manager's fenced commit and its watch would."""

    def __init__(self, view: ClusterView, settings: PlanSettings = SETTINGS) -> None:
        self.view = view
        self.settings = settings
        self.memory = Memory()
        self.now = 1000.0

    def plan(self, after: float = 0.0) -> Plan:
        self.now += after
        return plan(self.view, self.memory, now=self.now, settings=self.settings)

    def step(self, after: float = 0.0) -> Plan:
        out = self.plan(after)
        v = self.view
        v.partitions.update(out.puts)
        for pid in out.deletes:
            v.partitions.pop(pid, None)
        v.tombstones.update(out.tombstones)
        for key in out.tombstone_deletes:
            v.tombstones.pop(key, None)
        v.counter = out.counter
        return out


def publish(
    v: ClusterView,
    *,
    dead: Collection[str] = (),
    lagging: Collection[str] = (),
    unsettled: Collection[int] = (),
    lsn: int = 10,
    epoch: int = 3,
    extra: dict[str, dict[int, ReplicaPosition]] | None = None,
    strays: dict[str, dict[int, str]] | None = None,
) -> None:
    """What the nodes publish of a healthy cluster: every live member of every partition at
    ``(epoch, lsn)``; each key holder (``v.leaders``) as leader, counting by its record's
    voters (except for the partitions in ``unsettled``, whose leader has yet to take them
    up), with every live member but the ``lagging`` ones (500 entries behind) in sync. Nodes
    in ``dead`` publish nothing (their records are gone); ``extra``: more positions (copies
    no record names); ``strays``: the copies each node keeps unserved, with why."""
    replicas: dict[str, dict[int, ReplicaPosition]] = {n: {} for n in v.nodes if n not in dead}
    for pid, record in v.partitions.items():
        holder = v.leaders.get(pid)
        for n in record.members:
            if n in dead:
                continue
            if n == holder:
                in_sync = tuple(m for m in record.members if m not in (n, *dead, *lagging))
                voters = () if pid in unsettled else record.replicas
                position = ReplicaPosition("leader", epoch, lsn, epoch, epoch, voters, lsn, in_sync)
            else:
                behind = 500 if n in lagging else 0
                position = ReplicaPosition("follower", epoch, lsn - behind, epoch, epoch)
            replicas.setdefault(n, {})[pid] = position
    for n, positions in (extra or {}).items():
        replicas.setdefault(n, {}).update(positions)
    states = {n: r.state for n, r in v.nodes.items()}
    v.nodes = {
        n: NodeRecord("127.0.0.1:1", states.get(n, "up"), r, strays=dict((strays or {}).get(n, {})))
        for n, r in replicas.items()
    }
