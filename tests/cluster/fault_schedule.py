"""A seeded schedule of faults for the random-faults test on real processes
(``test_random_faults.py``; docs/testing.md, "Random faults on real processes").

Sans-I/O: :func:`make_schedule` turns a seed into a list of :class:`Fault` with one
``random.Random(seed)`` and nothing else, so a seed printed by a failing run gives the same
schedule again. What a fault's target means at run time (which node leads a partition at
that moment) is resolved by the test and logged next to the schedule; the schedule itself
names it by role (``leader:<partition label>``) or by node.

One fault at a time, each undone before the next (``hold_s`` after it was made), so a
majority of every partition's replicas is healthy throughout: a node killed and restarted,
frozen and thawed, cut from its peers (``separate``) or from everything (``isolate``) and
healed, drained and undrained, a spare node joining, a manager killed and restarted.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum


class Kind(StrEnum):
    KILL = "kill"  # SIGKILL, started again after hold_s
    FREEZE = "freeze"  # SIGSTOP, SIGCONT after hold_s
    SEPARATE = "separate"  # cut from the other nodes (etcd and gateways still reach it)
    ISOLATE = "isolate"  # cut from the other nodes, etcd and gateways
    DRAIN = "drain"  # pushgate manager --drain, --undrain after hold_s
    JOIN = "join"  # the spare node starts (for good)
    MANAGER = "manager"  # a manager SIGKILLed, started again after hold_s


NODE_FAULTS = (Kind.KILL, Kind.FREEZE, Kind.SEPARATE, Kind.ISOLATE, Kind.DRAIN)
# How long each fault lasts before it is undone (seconds), drawn uniformly. Node leases live
# 2 s, check-quorum gives way after about 4 s: the ranges straddle both, so some faults end
# before anyone notices and others force a failover.
HOLD_S: dict[Kind, tuple[float, float]] = {
    Kind.KILL: (0.5, 3.0),
    Kind.FREEZE: (0.5, 4.0),
    Kind.SEPARATE: (1.0, 5.0),
    Kind.ISOLATE: (1.0, 5.0),
    Kind.DRAIN: (2.0, 6.0),
    Kind.JOIN: (0.0, 0.0),
    Kind.MANAGER: (0.5, 3.0),
}
GAP_S = (0.3, 2.0)  # the pause before a fault, once the cluster settled from the last one
ACTIVE_MANAGER = "active"
LEADER = "leader:"


@dataclass(frozen=True, slots=True)
class Fault:
    kind: Kind
    # A node name, ``leader:<partition label>`` (whoever leads it when the fault is made),
    # a manager's name or ``active`` (the manager holding the key).
    target: str
    hold_s: float
    gap_s: float

    def __str__(self) -> str:
        return f"{self.kind} {self.target} for {self.hold_s:.2f}s (after {self.gap_s:.2f}s)"


def make_schedule(
    seed: int,
    *,
    nodes: Sequence[str],
    spare: str | None,
    partitions: Sequence[str],
    managers: Sequence[str],
    count: int,
) -> list[Fault]:
    """``count`` faults for a cluster of ``nodes`` (running from the start), ``spare`` (a node
    that may join once), the partitions' labels and the managers' names."""
    rng = random.Random(seed)
    members = list(nodes)
    faults: list[Fault] = []
    for _ in range(count):
        kinds = [*NODE_FAULTS, Kind.MANAGER]
        if spare is not None and spare not in members:
            kinds.append(Kind.JOIN)
        kind = rng.choice(kinds)
        if kind is Kind.JOIN:
            assert spare is not None
            target = spare
            members.append(spare)
        elif kind is Kind.MANAGER:
            target = rng.choice([ACTIVE_MANAGER, *managers])
        elif rng.random() < 0.5:  # a leader half the time: the faults that cost a failover
            target = LEADER + rng.choice(list(partitions))
        else:
            target = rng.choice(members)
        low, high = HOLD_S[kind]
        faults.append(Fault(kind, target, round(rng.uniform(low, high), 2), round(rng.uniform(*GAP_S), 2)))
    return faults


def describe(seed: int, faults: Sequence[Fault]) -> str:
    lines = [f"seed {seed}: {len(faults)} faults (replay: PUSHGATE_FAULT_SEED={seed})"]
    lines += [f"  {i}. {fault}" for i, fault in enumerate(faults, 1)]
    return "\n".join(lines)
