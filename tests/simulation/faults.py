"""Faults, their mixes, and the schedule that throws them at the cluster.

A fault is applied, lasts a while (drawn from the seed) and heals itself; the schedule
starts one every so often (exponential gaps) up to a mix's limit of faults at once. At the
end of the chaos :meth:`Chaos.heal_everything` undoes whatever is still broken, as an
operator would: paths healed, processes thawed and restarted, disks emptied, clocks
corrected, etcd started (restored from the latest backup if it came back empty), drains
withdrawn.

Mixes (``--faults``):

=============  ==========================================================================
``minority``   issue 24's random schedule: one fault at a time, a majority always healthy
               (a node killed, frozen or cut from its peers, a drain, the manager killed);
               the availability bound is checked
``process``    nodes and managers killed, frozen, their clocks skewed
``network``    nodes cut off (from peers, etcd, the gateway; one way or both), links cut,
               losses, slow hosts, connections reset
``disk``       full disks, failed fsyncs, a map that fills, slow disks (with kills)
``etcd``       etcd stopped, wiped, restored from an older backup, slow; a partition record
               that cannot be read (with kills)
``restore``    etcd restored from an older backup (its revisions go back), with kills: the
               restore alone, without the wipes that delete replicas first
``ops``        drains, joins, replacements of dead nodes, a node restarted with another
               ``--prefix``, under cuts and kills
``all``        every fault above, up to three at once
``returns``    a node replaced after it died comes back with its disk, under restores of
               etcd and kills (not in ``all``: added in session 38, after ``all``'s seeds
               were pinned by tests, whose trajectories a new fault would move)
``bumped``     etcd restored with ``--bump-revision`` (keys go back, revisions jump ahead
               of every one made before), with the faults of ``returns`` (session 40)
``late``       etcd restored with ``--bump-revision`` from a backup taken after the last
               change of every partition record (the restored map is the current one; leader
               keys and node records go back), under kills, freezes and cuts from etcd or peers
               (session 41)
``down``       every node and manager stopped, etcd restored with ``--bump-revision`` from a
               backup, and every process started again within a moment of each other, in
               an order drawn from the seed (issue 48), with kills and freezes
``since``      a queue with partitions of its own made during the chaos, after backups, and
               sent to; etcd restored from older backups (half of them lose the queue),
               with kills, freezes and manager kills (session 64: the CI run of session 62
               lost such a queue's acknowledged messages to a manager's stale plan)
=============  ==========================================================================
A mix may also be a comma-separated list of fault names (``kill,cut-peers``).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, replace
from typing import Any

from backend_store.cluster.coordination.layout import PartitionRecord
from backend_store.errors import PushgateError

from .cluster import ETCD, GATEWAY, SimCluster


@dataclass(frozen=True, slots=True)
class Forced:
    """One fault a test schedules itself: ``fault`` (a name of ``FAULTS``) on ``target`` at
    ``at_s`` after the chaos starts, for ``lasting_s``. The target is a node (``"n2"``),
    ``"leader:P"`` (the node etcd's map designates for partition P when the fault starts) or
    ``"etcd"`` for etcd's faults (``etcd-restore-late`` restores its snapshot ``lasting_s``
    after taking it). What else the fault draws (how slow a disk, which backup, the phases of
    a wipe or a replacement) still comes from the seed. A node's forced fault goes on whether
    the node is busy with another fault or not; with no such target then, or a fault that
    does not apply (etcd busy, the node down), it is noted in the trace and skipped."""

    at_s: float
    fault: str
    target: str
    lasting_s: float


@dataclass(frozen=True, slots=True)
class Mix:
    name: str
    faults: tuple[str, ...]
    concurrent: int
    mean_gap_s: float
    quiet_s: float = 0.0  # after a fault heals, before the next may start (one at a time)
    # Many queues in a pool of shared partitions, created and deleted during the chaos
    # (simulation.py, sim_pools.py), instead of one or two queues with partitions of their own.
    pooled: bool = False
    # Faults scheduled by a test, besides the random ones (``scripted`` makes a mix of these alone).
    forced: tuple[Forced, ...] = ()
    # A queue with partitions of its own made during the chaos, after backups (simulation.py).
    late_queue: bool = False

    @property
    def availability_checked(self) -> bool:
        return self.name == "minority"


MIXES: dict[str, Mix] = {
    "minority": Mix(
        "minority", ("kill", "freeze", "cut-peers", "drain", "kill-manager"), 1, 1.0, quiet_s=3.0
    ),
    "process": Mix("process", ("kill", "freeze", "kill-manager", "freeze-manager", "clock-skew"), 2, 2.0),
    "network": Mix(
        "network",
        (
            "cut-peers",
            "cut-etcd",
            "cut-gateway",
            "cut-all",
            "cut-one-way",
            "cut-link",
            "lossy",
            "slow-host",
            "reset",
        ),
        2,
        2.0,
    ),
    "disk": Mix("disk", ("disk-full", "fsync-fail", "map-full", "slow-disk", "kill"), 2, 1.5),
    "etcd": Mix(
        "etcd",
        ("etcd-outage", "etcd-wipe", "etcd-restore", "corrupt-record", "slow-etcd", "kill", "kill-manager"),
        1,
        4.0,
    ),
    "restore": Mix("restore", ("etcd-restore", "kill", "kill", "freeze", "kill-manager"), 2, 2.0),
    "ops": Mix(
        "ops",
        ("drain", "join", "replace", "wrong-prefix", "cut-peers", "cut-one-way", "kill", "kill-manager"),
        3,
        2.0,
    ),
}
ALL_FAULTS = tuple(sorted({f for mix in MIXES.values() for f in mix.faults}))
MIXES["all"] = Mix("all", ALL_FAULTS, 3, 1.5)
MIXES["returns"] = Mix("returns", ("replace-return", "etcd-restore", "kill", "kill", "freeze"), 3, 1.5)
# A restore whose revisions jump ahead (session 40), with nodes coming back after a replacement.
MIXES["bumped"] = Mix(
    "bumped", ("etcd-restore-bumped", "replace-return", "etcd-restore", "kill", "kill", "freeze"), 3, 1.5
)
# A bumped restore no record mark can see (session 41): only leader keys and node records go back.
MIXES["late"] = Mix(
    "late", ("etcd-restore-late", "etcd-restore-late", "kill", "freeze", "cut-etcd", "cut-peers"), 3, 1.5
)
# A bumped restore made while every process was down (issue 48): the one that started first
# may hold a designation the restore brought back, before anyone sees the restore.
MIXES["down"] = Mix("down", ("etcd-restore-down", "kill", "kill", "freeze"), 2, 1.5)
# A queue made after backups, then restores (session 64): what a restore lost must not take
# its partition's copies with it (docs/cluster.md, "Never delete on absence").
MIXES["since"] = Mix(
    "since", ("etcd-restore", "etcd-restore", "kill", "freeze", "kill-manager"), 2, 2.0, late_queue=True
)
# Many queues over few partitions (issue 49): 200 queues in one pool of 8 partitions, queues
# created and deleted during the faults.
MIXES["pools"] = Mix(
    "pools",
    ("kill", "freeze", "cut-peers", "cut-etcd", "etcd-restore", "kill-manager", "drain", "slow-disk"),
    2,
    1.5,
    pooled=True,
)
MIXES["pools-all"] = Mix("pools-all", ALL_FAULTS, 3, 1.5, pooled=True)
# Every fault a comma-separated mix may name.
FAULTS = (*ALL_FAULTS, "replace-return", "etcd-restore-bumped", "etcd-restore-late", "etcd-restore-down")


def scripted(name: str, forced: tuple[Forced, ...], *, on: Mix | None = None) -> Mix:
    """A mix of the faults ``forced`` schedules, alone or on top of mix ``on``'s random ones."""
    unknown = [f.fault for f in forced if f.fault not in FAULTS]
    if unknown:
        raise ValueError(f"unknown faults {unknown}; faults: {list(FAULTS)}")
    if on is None:
        return Mix(name, (), 1, 1.0, forced=forced)
    return replace(on, name=name, forced=forced)


def mix_named(spec: str) -> Mix:
    """A mix by name, or one made of comma-separated fault names."""
    if spec in MIXES:
        return MIXES[spec]
    names = tuple(n.strip() for n in spec.split(",") if n.strip())
    unknown = [n for n in names if n not in FAULTS]
    if unknown or not names:
        raise ValueError(f"unknown faults {unknown}; mixes: {sorted(MIXES)}; faults: {list(FAULTS)}")
    return Mix(spec, names, 2, 2.0)


class Chaos:
    """Runs a mix's schedule against a cluster."""

    MAX_NODES = 6

    def __init__(self, cluster: SimCluster, mix: Mix, rng: random.Random) -> None:
        self.cluster = cluster
        self.mix = mix
        self.rng = rng
        self.active: dict[int, tuple[str, str]] = {}  # id -> (fault, target)
        self._tasks: list[asyncio.Task[None]] = []
        self._next = 0
        self.history: list[tuple[float, float | None, str, str]] = []  # (start, end, fault, target)
        self._healing = False
        # Nodes of a replace-return under way: healing brings them back too (simulation seed
        # ``returns`` 3716, session 38: healing left one retired for good, undrained, and its
        # partition with one live copy of the three its restored record named).
        self.returning: set[str] = set()
        self._forcing: Forced | None = None  # the forced fault being started, if any

    def now(self) -> float:
        return asyncio.get_running_loop().time()

    def note(self, text: str) -> None:
        self.cluster.trace.add(self.now(), "chaos", text)

    # The schedule -------------------------------------------------------------------------------

    async def run(self, duration_s: float) -> None:
        end = self.now() + duration_s
        loop = asyncio.get_running_loop()
        for forced in self.mix.forced:
            if forced.at_s < duration_s:
                loop.call_at(self.now() + forced.at_s, self._force, forced)
        if not self.mix.faults:
            await asyncio.sleep(duration_s)
            return
        while self.now() < end:
            await asyncio.sleep(self.rng.expovariate(1 / self.mix.mean_gap_s))
            while len(self.active) >= self.mix.concurrent and self.now() < end:  # noqa: ASYNC110
                await asyncio.sleep(0.1)  # a poll on virtual time
            if self.mix.quiet_s and self.history:
                last_end = max((h[1] or self.now()) for h in self.history)
                if self.now() - last_end < self.mix.quiet_s:
                    await asyncio.sleep(self.mix.quiet_s - (self.now() - last_end))
            if self.now() >= end:
                break
            self._start(self.rng.choice(self.mix.faults))

    def _force(self, forced: Forced) -> None:
        if self._healing:
            return
        self._forcing = forced
        try:
            if self._forced_target() is None:
                self.note(f"forced {forced.fault} on {forced.target} skipped: no such target now")
            else:
                self._start(forced.fault)
        finally:
            self._forcing = None

    def _forced_target(self) -> str | None:
        assert self._forcing is not None
        target = self._forcing.target
        if target == ETCD:
            return ETCD
        if target.startswith("leader:"):
            return self.cluster.designated(int(target.removeprefix("leader:")))
        return target if target in self.cluster.node_names() else None

    def _start(self, fault: str) -> None:
        action = getattr(self, "_" + fault.replace("-", "_"))
        target_and_coro: tuple[str, Coroutine[Any, Any, None]] | None = action()
        if target_and_coro is None:
            if self._forcing is not None:
                self.note(f"forced {fault} on {self._forcing.target} skipped: it does not apply now")
            return
        target, coro = target_and_coro
        self._next += 1
        fault_id = self._next
        self.active[fault_id] = (fault, target)
        index = len(self.history)
        self.history.append((self.now(), None, fault, target))
        self.note(f"fault {fault} on {target}")

        async def run() -> None:
            try:
                await coro
            finally:
                self.active.pop(fault_id, None)
                start, _, f, t = self.history[index]
                self.history[index] = (start, self.now(), f, t)

        self._tasks.append(asyncio.get_running_loop().create_task(run(), name=f"fault {fault}"))

    def _busy(self) -> set[str]:
        return {target for _, target in self.active.values()}

    def _pick_node(self, *, alive: bool = True) -> str | None:
        cluster = self.cluster
        if self._forcing is not None:
            node = self._forced_target()
            return node if node is not None and (not alive or node in cluster.live_nodes()) else None
        choices = [
            n
            for n in cluster.node_names()
            if n not in self._busy() and n not in cluster.retired and (not alive or n in cluster.live_nodes())
        ]
        return self.rng.choice(choices) if choices else None

    def _lasting(self, low: float, high: float) -> float:
        return low + self.rng.random() * (high - low)

    def _while(
        self, target: str, apply: Callable[[], None], heal: Callable[[], None], low: float, high: float
    ) -> tuple[str, Coroutine[Any, Any, None]]:
        apply()
        forced_s = None if self._forcing is None else self._forcing.lasting_s

        async def lasts() -> None:
            await asyncio.sleep(self._lasting(low, high) if forced_s is None else forced_s)
            if not self._healing:
                heal()
                self.note(f"healed {target}")

        return target, lasts()

    # Processes ----------------------------------------------------------------------------------

    def _kill(self) -> tuple[str, Coroutine[Any, Any, None]] | None:
        node = self._pick_node()
        if node is None:
            return None
        return self._while(
            node, lambda: self.cluster.kill(node), lambda: self.cluster.restart(node), 0.5, 8.0
        )

    def _freeze(self) -> tuple[str, Coroutine[Any, Any, None]] | None:
        node = self._pick_node()
        if node is None:
            return None
        proc = self.cluster.nodes[node].proc
        return self._while(node, proc.freeze, proc.thaw, 0.3, 6.0)

    def _clock_skew(self) -> tuple[str, Coroutine[Any, Any, None]] | None:
        node = self._pick_node()
        if node is None:
            return None
        proc = self.cluster.nodes[node].proc
        rate = self.rng.choice([0.95, 0.98, 1.02, 1.05])
        return self._while(
            node, lambda: proc.set_clock_rate(rate), lambda: proc.set_clock_rate(1.0), 2.0, 15.0
        )

    def _manager(self) -> str | None:
        active = self.cluster.active_manager()
        return active if active is not None and active not in self._busy() else None

    def _kill_manager(self) -> tuple[str, Coroutine[Any, Any, None]] | None:
        name = self._manager()
        if name is None:
            return None
        return self._while(
            name, lambda: self.cluster.kill(name), lambda: self.cluster.restart(name), 0.5, 6.0
        )

    def _freeze_manager(self) -> tuple[str, Coroutine[Any, Any, None]] | None:
        name = self._manager()
        if name is None:
            return None
        proc = self.cluster.managers[name][0]
        return self._while(name, proc.freeze, proc.thaw, 0.5, 5.0)

    # The network -----------------------------------------------------------------------------------

    def _cut(
        self, node: str, others: list[str], *, outgoing: bool = True, incoming: bool = True
    ) -> tuple[str, Coroutine[Any, Any, None]]:
        network = self.cluster.network

        def apply() -> None:
            for other in others:
                if outgoing:
                    network.cut(node, other)
                if incoming:
                    network.cut(other, node)

        def heal() -> None:
            for other in others:
                network.heal(node, other)
                network.heal(other, node)

        return self._while(node, apply, heal, 1.0, 12.0)

    def _peers(self, node: str) -> list[str]:
        return [n for n in self.cluster.node_names() if n != node]

    def _cut_peers(self) -> tuple[str, Coroutine[Any, Any, None]] | None:
        node = self._pick_node()
        return None if node is None else self._cut(node, self._peers(node))

    def _cut_etcd(self) -> tuple[str, Coroutine[Any, Any, None]] | None:
        node = self._pick_node()
        return None if node is None else self._cut(node, [ETCD])

    def _cut_gateway(self) -> tuple[str, Coroutine[Any, Any, None]] | None:
        node = self._pick_node()
        return None if node is None else self._cut(node, [GATEWAY])

    def _cut_all(self) -> tuple[str, Coroutine[Any, Any, None]] | None:
        node = self._pick_node()
        return None if node is None else self._cut(node, [*self._peers(node), ETCD, GATEWAY])

    def _cut_one_way(self) -> tuple[str, Coroutine[Any, Any, None]] | None:
        node = self._pick_node()
        if node is None:
            return None
        outgoing = self.rng.random() < 0.5
        return self._cut(node, self._peers(node), outgoing=outgoing, incoming=not outgoing)

    def _cut_link(self) -> tuple[str, Coroutine[Any, Any, None]] | None:
        node = self._pick_node()
        if node is None:
            return None
        other = self.rng.choice(self._peers(node))
        return self._cut(node, [other], outgoing=True, incoming=self.rng.random() < 0.5)

    def _lossy(self) -> tuple[str, Coroutine[Any, Any, None]] | None:
        network = self.cluster.network
        if "net" in self._busy():
            return None
        loss = self.rng.choice([0.01, 0.05, 0.2])

        def heal() -> None:
            network.loss = 0.0

        return self._while("net", lambda: setattr(network, "loss", loss), heal, 2.0, 10.0)

    def _slow_host(self) -> tuple[str, Coroutine[Any, Any, None]] | None:
        node = self._pick_node()
        if node is None:
            return None
        network = self.cluster.network
        extra = self.rng.choice([0.02, 0.1, 0.4])
        return self._while(
            node, lambda: network.set_slow(node, extra), lambda: network.set_slow(node, 0.0), 1.0, 10.0
        )

    def _reset(self) -> tuple[str, Coroutine[Any, Any, None]] | None:
        node = self._pick_node()
        if node is None:
            return None
        network = self.cluster.network
        return self._while(
            node,
            lambda: self.note(f"reset {network.reset(node)} connections of {node}"),
            lambda: None,
            0.0,
            0.1,
        )

    # Disks ---------------------------------------------------------------------------------------------

    def _disk_fault(
        self, set_it: Callable[[Any], None], clear: Callable[[Any], None], low: float, high: float
    ) -> tuple[str, Coroutine[Any, Any, None]] | None:
        node = self._pick_node(alive=False)
        if node is None:
            return None
        disk = self.cluster.disks[node]
        return self._while(node, lambda: set_it(disk), lambda: clear(disk), low, high)

    def _disk_full(self) -> tuple[str, Coroutine[Any, Any, None]] | None:
        return self._disk_fault(
            lambda d: setattr(d, "full", True), lambda d: setattr(d, "full", False), 0.5, 5.0
        )

    def _fsync_fail(self) -> tuple[str, Coroutine[Any, Any, None]] | None:
        count = self.rng.randint(1, 3)
        return self._disk_fault(
            lambda d: setattr(d, "failing_fsyncs", count), lambda d: setattr(d, "failing_fsyncs", 0), 0.5, 3.0
        )

    def _map_full(self) -> tuple[str, Coroutine[Any, Any, None]] | None:
        return self._disk_fault(
            lambda d: setattr(d, "map_full_once", True),
            lambda d: setattr(d, "map_full_once", False),
            0.5,
            3.0,
        )

    def _slow_disk(self) -> tuple[str, Coroutine[Any, Any, None]] | None:
        slow = self.rng.choice([0.02, 0.1, 0.5])
        return self._disk_fault(
            lambda d: setattr(d, "slow_s", slow), lambda d: setattr(d, "slow_s", 0.0), 1.0, 8.0
        )

    # etcd -------------------------------------------------------------------------------------------------

    def _etcd_busy(self) -> bool:
        return ETCD in self._busy()

    def _etcd_outage(self) -> tuple[str, Coroutine[Any, Any, None]] | None:
        if self._etcd_busy():
            return None
        cluster = self.cluster
        return self._while(ETCD, cluster.etcd_stop, lambda: cluster.etcd.start(), 0.5, 5.0)

    def _etcd_wipe(self) -> tuple[str, Coroutine[Any, Any, None]] | None:
        """Stopped, its data removed, started again empty; later an operator restores the
        latest backup."""
        if self._etcd_busy():
            return None
        cluster = self.cluster
        cluster.etcd_stop()

        async def lasts() -> None:
            await asyncio.sleep(self._lasting(0.5, 3.0))
            if self._healing:
                return
            cluster.etcd_start_empty()
            await asyncio.sleep(self._lasting(2.0, 10.0))
            if not self._healing:
                cluster.etcd_restore()

        return ETCD, lasts()

    def _etcd_restore(self) -> tuple[str, Coroutine[Any, Any, None]] | None:
        """``etcdctl snapshot restore`` of an older backup (revisions go back)."""
        if self._etcd_busy() or not self.cluster.backups:
            return None
        # Half the time the oldest backup (the setup's): the older, the further back revisions go.
        index = 0 if self.rng.random() < 0.5 else self.rng.randrange(len(self.cluster.backups))

        def restore() -> None:
            self.cluster.etcd_restore(index)

        return self._while(ETCD, restore, lambda: None, 0.5, 2.0)

    def _etcd_restore_bumped(self) -> tuple[str, Coroutine[Any, Any, None]] | None:
        """``etcdutl snapshot restore --bump-revision``, as etcd's own guide restores: keys
        go back to the backup's, while revisions jump past every one made before."""
        if self._etcd_busy() or not self.cluster.backups:
            return None
        index = 0 if self.rng.random() < 0.5 else self.rng.randrange(len(self.cluster.backups))

        def restore() -> None:
            self.cluster.etcd_restore(index, bumped=True)

        return self._while(ETCD, restore, lambda: None, 0.5, 2.0)

    def _etcd_restore_down(self) -> tuple[str, Coroutine[Any, Any, None]] | None:
        """Every node and manager stopped (a power cut, a maintenance window); etcd restored
        with ``--bump-revision`` from a backup; every process started again, one after the
        other within a moment, in an order drawn from the seed (tests/cluster/test_etcd_loss.py,
        ``test_a_restore_made_while_every_node_was_down_is_noticed_by_the_records``, as the
        simulation makes it: issue 48)."""
        cluster = self.cluster
        if self._etcd_busy() or not cluster.backups or not cluster.etcd.up:
            return None
        index = 0 if self.rng.random() < 0.5 else self.rng.randrange(len(cluster.backups))
        names = [n for n in cluster.node_names() if n not in cluster.retired] + sorted(cluster.managers)
        for name in names:
            cluster.kill(name)

        async def lasts() -> None:
            # The restore (None), then each process: the first a while after the restore
            # (its restored leases may still stand), the others within a moment of it.
            steps: list[str | None] = [None, *self.rng.sample(names, len(names))]
            for i, step in enumerate(steps):
                await asyncio.sleep(self._lasting(*[(0.5, 2.0), (0.0, 3.0), (0.0, 0.3)][min(i, 2)]))
                if self._healing:
                    return
                if step is None:
                    cluster.etcd_restore(index, bumped=True)
                else:
                    cluster.restart(step)

        return ETCD, lasts()

    def _etcd_restore_late(self) -> tuple[str, Coroutine[Any, Any, None]] | None:
        """``etcdutl snapshot restore --bump-revision`` of a backup taken now, a few seconds
        later, if no partition record changed meanwhile: the restored map is the current one,
        so no node's record marks see the restore, while leader keys and node records go back
        to the backup's (what session 40 left unseen)."""
        cluster = self.cluster
        if self._etcd_busy() or not cluster.etcd.up:
            return None
        taken_at, snapshot = self.now(), cluster.etcd.snapshot()
        forced_s = None if self._forcing is None else self._forcing.lasting_s

        async def lasts() -> None:
            # Forced, the snapshot is restored ``lasting_s`` after it was taken.
            await asyncio.sleep(self._lasting(0.5, 6.0) if forced_s is None else forced_s)
            if self._healing or not cluster.etcd.up:
                return
            if cluster.partitions_changed_since(snapshot):
                self.note(f"no late restore: a partition record changed since t={taken_at:.1f}")
                return
            cluster.etcd_restore_snapshot(taken_at, snapshot, bumped=True)
            await asyncio.sleep(self._lasting(0.5, 2.0))

        return ETCD, lasts()

    def _corrupt_record(self) -> tuple[str, Coroutine[Any, Any, None]] | None:
        """A partition record that cannot be read (written by a bug, or by hand), until
        the manager writes it again."""
        if self._etcd_busy():
            return None
        cluster = self.cluster
        keys = sorted(k for k in cluster.etcd.state.kv if k.startswith(cluster.layout.partitions))
        if not cluster.etcd.up or not keys:
            return None
        key = self.rng.choice(keys)
        return self._while(ETCD, lambda: cluster.corrupt(key), lambda: None, 0.5, 2.0)

    def _slow_etcd(self) -> tuple[str, Coroutine[Any, Any, None]] | None:
        if self._etcd_busy():
            return None
        etcd = self.cluster.etcd
        slow = self.rng.choice([0.05, 0.3, 1.5])
        return self._while(
            ETCD, lambda: setattr(etcd, "slow_s", slow), lambda: setattr(etcd, "slow_s", 0.0), 1.0, 8.0
        )

    # Operators ---------------------------------------------------------------------------------------------

    def _drain(self) -> tuple[str, Coroutine[Any, Any, None]] | None:
        cluster = self.cluster
        candidates = [
            n for n in cluster.node_names() if n not in cluster.drained and n not in cluster.retired
        ]
        if len(candidates) <= 3:
            return None  # three nodes must stay to hold an RF 3 partition
        node = self.rng.choice([n for n in candidates if n not in self._busy()] or candidates)

        async def lasts() -> None:
            await cluster.drain(node, True)
            await asyncio.sleep(self._lasting(4.0, 20.0))
            if not self._healing:
                await cluster.drain(node, False)

        return node, lasts()

    def _join(self) -> tuple[str, Coroutine[Any, Any, None]] | None:
        cluster = self.cluster
        if len(cluster.node_names()) >= self.MAX_NODES:
            return None
        name = f"n{len(cluster.node_names()) + 1}"
        cluster.start_node(name)
        return self._while(name, lambda: None, lambda: None, 0.0, 0.1)

    def _wrong_prefix(self) -> tuple[str, Coroutine[Any, Any, None]] | None:
        """A node restarted with another ``--prefix`` (an operator's typo), then fixed."""
        node = self._pick_node()
        if node is None:
            return None
        cluster = self.cluster

        def restart_wrong() -> None:
            cluster.kill(node)
            cluster.start_node(node, prefix="/typo/")

        def restart_right() -> None:
            cluster.kill(node)
            cluster.start_node(node)

        return self._while(node, restart_wrong, restart_right, 2.0, 8.0)

    def _replace(self) -> tuple[str, Coroutine[Any, Any, None]] | None:
        """A node dies for good; the operator drains it (its replicas move) and adds another."""
        cluster = self.cluster
        alive = [n for n in cluster.live_nodes() if n not in self._busy() and n not in cluster.drained]
        if len(alive) <= 3 or len(cluster.node_names()) >= self.MAX_NODES or self._still_replacing():
            return None
        alive = [n for n in alive if not self._would_lose_a_majority(cluster.retired | {n})]
        if not alive:
            return None
        node = self.rng.choice(alive)

        async def lasts() -> None:
            cluster.retired.add(node)
            cluster.kill(node)
            await asyncio.sleep(self._lasting(1.0, 5.0))
            await cluster.drain(node, True)
            await asyncio.sleep(self._lasting(0.5, 5.0))
            cluster.start_node(f"n{len(cluster.node_names()) + 1}")

        return node, lasts()

    def _replace_return(self) -> tuple[str, Coroutine[Any, Any, None]] | None:
        """A node replaced after it died (as ``replace``) comes back later with its disk: a
        host repaired after its replicas moved. Its copies are older than the set that
        replaced them, and a restore of etcd from before the replacement names it again."""
        replaced = self._replace()
        if replaced is None:
            return None
        node, replacing = replaced

        async def lasts() -> None:
            self.returning.add(node)
            await replacing
            await asyncio.sleep(self._lasting(1.0, 6.0))
            self.returning.discard(node)
            self.cluster.retired.discard(node)
            self.cluster.restart(node)

        return node, lasts()

    def _still_replacing(self) -> bool:
        """Whether a node lost for good still has a place in some partition's record: a
        second permanent loss before its replicas moved could take a majority of one
        partition for good, which RF 3 does not survive (nor would Raft, Kafka or
        JetStream); what the schedule tests is one permanent loss at a time."""
        cluster = self.cluster
        prefix = cluster.layout.partitions
        for key, found in cluster.etcd.state.kv.items():
            if not key.startswith(prefix):
                continue
            try:
                record = PartitionRecord.unpack(found.value)
            except PushgateError:
                return True  # cannot tell: wait
            if cluster.retired & set(record.members):
                return True
        return False

    def _would_lose_a_majority(self, retired: set[str]) -> bool:
        """Whether some voting set a partition's acknowledged writes may live on has a
        majority among ``retired`` (lost for good): a set a record names, in etcd now or in
        a backup a restore could bring back, or a set a node's disk remembers serving a copy
        on (node/served_sets.py). etcd's state now is not enough: while it is empty (wiped)
        it names nobody, and a restore then brings back a map whose set lost two of three
        copies (simulation seed ``all`` 100038, session 34: n2 and n3 replaced while etcd
        was empty, then the backup of t=0.5 restored; p1 was left with n1's copy alone,
        which no quorum system serves). Nor are records: a restore can undo a move, and
        the set the move made then lives on only in its members' memory (seed ``all``
        452512, session 42: p2 moved from n2 to n1, a restore put n2 back in the map, and
        n3 and then n1 were replaced; n5, behind on a full disk, remembered serving on
        {n3, n5, n1}, two of whose three copies were gone, and rightly never served)."""
        cluster = self.cluster
        prefix = cluster.layout.partitions
        sets: list[tuple[str, ...]] = []
        for state in [cluster.etcd.state, *(snap for _, snap in cluster.backups)]:
            for key, found in state.kv.items():
                if not key.startswith(prefix):
                    continue
                try:
                    sets.append(PartitionRecord.unpack(found.value).replicas)
                except PushgateError:
                    continue
        for disk in cluster.disks.values():
            sets.extend(served.voters for served in disk.served_sets.values())
        return any(len(retired & set(voters)) >= len(voters) // 2 + 1 for voters in sets)

    # Healing ---------------------------------------------------------------------------------------------------

    async def heal_everything(self) -> None:
        self._healing = True
        cluster = self.cluster
        for task in self._tasks:
            task.cancel()
        self._tasks.clear()
        self.active.clear()
        cluster.network.heal_all()
        cluster.etcd.slow_s = 0.0
        for disk in cluster.disks.values():
            disk.full, disk.failing_fsyncs, disk.map_full_once, disk.slow_s = False, 0, False, 0.0
        cluster.retired -= self.returning
        self.returning.clear()
        for name in cluster.node_names():
            node = cluster.nodes.get(name)
            if node is not None:
                node.proc.thaw()
                node.proc.set_clock_rate(1.0)
            cluster.restart(name)
        for name, (proc, _) in sorted(cluster.managers.items()):
            proc.thaw()
            cluster.restart(name)
        if not cluster.etcd.up:
            cluster.etcd.start()
        if cluster.etcd_lost_the_cluster():
            # It came back empty, or a node started on it while empty made a cluster of its
            # own (the nodes refuse it, saying so): the operator restores the latest backup
            # holding this cluster (registrations alone do not make it less empty).
            cluster.etcd_restore()
        for name in sorted(cluster.drained - cluster.retired):
            await cluster.drain(name, False)
        self.note("healed everything")
