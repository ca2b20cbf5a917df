"""The simulated cluster: etcd, nodes, managers and a gateway on one network, started and stopped.

:class:`SimCluster` owns every process and what outlives them (the nodes' disks, etcd's
data and the backups an operator took). It starts the production :class:`Manager` as is (on
a :class:`~.sim_coordinator.SimCoordinator`) and the simulated nodes and gateway, and offers
the operations faults are made of: kill, restart, freeze and thaw a process; cut and heal
paths; stop, wipe and restore etcd; drain a node; add one.
"""

from __future__ import annotations

import asyncio
import random
from collections import deque

from backend_store.cluster.coordination.identity import ClusterRecord
from backend_store.cluster.coordination.layout import Layout, PartitionRecord, pack
from backend_store.cluster.manager.manager import Manager
from backend_store.cluster.manager.plan import PlanSettings
from backend_store.errors import PushgateError
from backend_store.types import Epoch

from .etcd_model import EtcdServer, EtcdState
from .kernel import Process, Trace
from .network import Network
from .oracle import Oracle
from .sim_coordinator import SimCoordinator
from .sim_gateway import QueueSpec, SimGateway
from .sim_node import SimNode, start_node
from .sim_pools import TENANT
from .sim_store import NodeDisk

GATEWAY = "gw"
POOL_SLOTS = 8  # each pool's partitions (the manager's --partitions)
ETCD = "etcd"
# The most writes of one etcd key within a second of virtual time (the ``record-write-storm``
# invariant). A plan writes a partition record once, a failover or a membership step a few
# times; a node publishes its record at most 11 times a second in sweeps of every mix
# (session 88). A manager that designated a resigned leader anew at every plan, each plan
# following its own last commit, wrote one record 175 times a second.
RECORD_WRITES_PER_S = 30


class SimCluster:
    def __init__(
        self,
        rng: random.Random,
        trace: Trace,
        oracle: Oracle,
        *,
        window_entries: int,
        lease_ttl_s: float = 2.0,
        off_the_network: frozenset[str] = frozenset(),
    ) -> None:
        self.rng = rng
        # Prefixes the managers read from etcd's model on the spot (SimCoordinator).
        self.off_the_network = off_the_network
        self.window_entries = window_entries
        self.lease_ttl_s = lease_ttl_s
        self.trace = trace
        self.oracle = oracle
        self.layout = Layout()
        self.network = Network(rng, trace)
        self.etcd_proc = Process(ETCD)
        self.network.attach(self.etcd_proc)
        self.etcd = EtcdServer(self.etcd_proc, rng, trace)
        oracle.etcd = self.etcd
        self.etcd.on_revision.append(self._watch_designations)
        self.etcd.on_revision.append(self._count_record_writes)
        self._record_writes: dict[str, deque[float]] = {}
        self.disks: dict[str, NodeDisk] = {}
        self.nodes: dict[str, SimNode] = {}
        self.managers: dict[str, tuple[Process, Manager]] = {}
        self.gateway: SimGateway | None = None
        self.backups: list[tuple[float, EtcdState]] = []
        self._highest_revision = 0  # what a bumped restore must pass (``etcd_restore``)
        self.retired: set[str] = set()  # nodes replaced for good: never restarted
        self.drained: set[str] = set()
        self._incarnations: dict[str, int] = {}
        self._designated: dict[int, str | None] = {}
        self._clock_offsets: dict[str, float] = {}

    def now(self) -> float:
        return asyncio.get_running_loop().time()

    def note(self, text: str) -> None:
        self.trace.add(self.now(), "world", text)

    def _process(self, name: str) -> Process:
        incarnation = self._incarnations.get(name, -1) + 1
        self._incarnations[name] = incarnation
        proc = Process(name, incarnation)
        self.network.attach(proc)
        return proc

    # Nodes -------------------------------------------------------------------------------------

    def start_node(self, name: str, *, prefix: str | None = None) -> SimNode:
        disk = self.disks.get(name)
        if disk is None:
            disk = self.disks[name] = NodeDisk(name, self.rng, self.oracle)
            self._clock_offsets[name] = self.rng.uniform(-5.0, 5.0)  # wall clocks differ too
        proc = self._process(name)
        offset = self._clock_offsets[name]
        layout = Layout(prefix) if prefix is not None else self.layout
        coordinator = SimCoordinator(proc, self.network, self.etcd)
        node = start_node(
            proc,
            disk,
            self.network,
            coordinator,
            self.oracle,
            layout=layout,
            store_clock=lambda: 1_700_000_000.0 + offset + proc.clock(),
            window_entries=self.window_entries,
            lease_ttl_s=self.lease_ttl_s,
        )
        self.nodes[name] = node
        self.note(f"{name} started (incarnation {proc.incarnation}{', prefix ' + prefix if prefix else ''})")
        if prefix is not None:
            self.oracle.fact("wrong-prefix", f"{name} started with --prefix {prefix}", node=name)
        return node

    def node_names(self) -> list[str]:
        return sorted(self.disks)

    def live_nodes(self) -> list[str]:
        return [n for n in self.node_names() if n in self.nodes and self.nodes[n].proc.alive]

    def kill(self, name: str) -> None:
        proc = self.process(name)
        if proc is not None and proc.alive:
            proc.kill()
            self.note(f"{name} killed")

    def process(self, name: str) -> Process | None:
        if name in self.nodes:
            return self.nodes[name].proc
        if name in self.managers:
            return self.managers[name][0]
        return None

    def restart(self, name: str) -> None:
        """Start ``name`` again if it is down, or runs with another ``--prefix`` (a healing
        operator fixes the typo too)."""
        proc = self.process(name)
        node = self.nodes.get(name)
        if proc is not None and proc.alive and (node is None or node.layout == self.layout):
            return
        if proc is not None and proc.alive:
            self.kill(name)
        if name in self.managers:
            self.start_manager(name)
        elif name not in self.retired:
            self.start_node(name)

    # Managers ----------------------------------------------------------------------------------

    def start_manager(self, name: str) -> None:
        proc = self._process(name)
        manager = Manager(
            SimCoordinator(proc, self.network, self.etcd, off_the_network=self.off_the_network),
            manager_id=name,
            ttl_s=self.lease_ttl_s,
            tick_s=0.25,
            layout=self.layout,
            # Eight slots a pool, more than nodes: the pooled mixes' queues spread over more
            # partitions than one per node (the default) would give, and their seeds keep the
            # schedules they were pinned with.
            settings=PlanSettings(pool_partitions=POOL_SLOTS),
            clock=proc.clock,
        )
        self.managers[name] = (proc, manager)
        proc.spawn(manager.start(), "start")
        self.note(f"manager {name} started (incarnation {proc.incarnation})")

    def active_manager(self) -> str | None:
        for name, (proc, manager) in sorted(self.managers.items()):
            if proc.alive and manager.epoch is not None:
                return name
        return None

    # The gateway ---------------------------------------------------------------------------------

    async def start_gateway(self, queues: list[QueueSpec]) -> SimGateway:
        proc = self._process(GATEWAY)
        coordinator = SimCoordinator(proc, self.network, self.etcd)
        for spec in queues:
            await self.write_queue_record(coordinator, spec)
        gateway = self.gateway = SimGateway(
            proc, self.network, coordinator, self.oracle, self.rng, layout=self.layout
        )
        await gateway.start()
        return gateway

    async def write_queue_record(self, coordinator: SimCoordinator, spec: QueueSpec) -> None:
        """Write a queue's record (a queue with partitions of its own), as an operator would:
        again every 0.5 s of virtual time until etcd takes it."""
        while True:
            try:
                await coordinator.put(self.layout.queue(TENANT, spec.name), pack(spec.attributes()))
                return
            except PushgateError:
                await asyncio.sleep(0.5)

    # etcd ------------------------------------------------------------------------------------------

    def backup(self) -> None:
        if self.etcd.up:
            self.backups.append((self.now(), self.etcd.snapshot()))
            self.note(f"etcd backed up at revision {self.etcd.state.revision}")

    def etcd_stop(self) -> None:
        self._highest_revision = max(self._highest_revision, self.etcd.state.revision)
        self.etcd.stop()
        self.oracle.fact("etcd-stopped", f"etcd stopped at revision {self.etcd.state.revision}")

    def etcd_start_empty(self) -> None:
        """Started again with its data directory removed."""
        was = self.etcd.state.revision
        self.etcd.start(EtcdState())
        self.oracle.fact("etcd-empty", f"etcd came back empty (revision {was} -> {self.etcd.state.revision})")

    def etcd_restore(self, index: int = -1, bumped: bool = False) -> bool:
        if not self.backups:
            return False
        if index == -1:
            # The operator restores the latest backup that holds the cluster (its record):
            # one taken of the emptied etcd would leave every node refusing it, as it should
            # (docs/cluster.md, "Backup and restore").
            held = [i for i, (_, snap) in enumerate(self.backups) if self._holds_the_cluster(snap)]
            index = held[-1] if held else -1
        taken_at, snapshot = self.backups[index]
        self.etcd_restore_snapshot(taken_at, snapshot, bumped=bumped)
        return True

    def etcd_restore_snapshot(self, taken_at: float, snapshot: EtcdState, *, bumped: bool) -> None:
        was = self.etcd.state.revision
        # etcd's guide bumps past every revision the lost store may have reached: here past
        # the highest this store ever made, so every revision after the restore is newer.
        self._highest_revision = max(self._highest_revision, was)
        bump = self._highest_revision - snapshot.revision + 1000 if bumped else 0
        self.etcd.restore(snapshot, bump)
        self.oracle.fact(
            "etcd-restored",
            f"etcd restored from the backup of t={taken_at:.1f}: revision {was} -> {self.etcd.state.revision}"
            + (f" (bumped by {bump})" if bump else ""),
        )

    def partitions_changed_since(self, snapshot: EtcdState) -> bool:
        """Whether etcd's partition records differ from ``snapshot``'s (their mod revisions)."""

        def records(state: EtcdState) -> dict[str, int]:
            prefix = self.layout.partitions
            return {k: v.mod_revision for k, v in state.kv.items() if k.startswith(prefix)}

        return records(self.etcd.state) != records(snapshot)

    def cluster_id_in(self, state: EtcdState) -> str | None:
        found = state.kv.get(self.layout.cluster)
        identity = ClusterRecord.parse(found.value if found is not None else None).identity
        return identity.cluster_id if identity is not None else None

    def _holds_the_cluster(self, state: EtcdState) -> bool:
        """Whether ``state`` holds this cluster's record: the id the first backup holding one
        shows (a node started on an empty etcd makes a cluster of its own, which the others
        refuse; the operator restores past it)."""
        first = next((c for _, snap in self.backups if (c := self.cluster_id_in(snap)) is not None), None)
        return first is not None and self.cluster_id_in(state) == first

    def etcd_lost_the_cluster(self) -> bool:
        """Whether etcd holds no record of this cluster (empty, or another cluster's)."""
        return bool(self.backups) and not self._holds_the_cluster(self.etcd.state)

    def corrupt(self, key: str) -> None:
        """Write a value no decoder reads under ``key`` (one revision, as a put would)."""
        if self.etcd.up:
            before = self.etcd.state.kv.get(key)
            self.etcd.put_raw(key, b"\xc1not msgpack")
            self.oracle.corrupted(key, before.value if before is not None else None)

    # Operators -------------------------------------------------------------------------------------

    async def drain(self, name: str, drain: bool) -> None:
        """``pushgate manager --drain`` (or undrain), by an operator's process."""
        proc = self._process("operator")
        coordinator = SimCoordinator(proc, self.network, self.etcd)
        key = self.layout.drain + name
        try:
            if drain:
                await coordinator.put(key, b"")
                self.drained.add(name)
            else:
                entry = await coordinator.get(key)
                if entry is not None:
                    await coordinator.fenced_commit(
                        key, Epoch(entry.create_revision), {}, [key], holder=entry.value
                    )
                self.drained.discard(name)
            self.note(f"{'drained' if drain else 'undrained'} {name}")
        except PushgateError as exc:
            self.note(f"could not {'drain' if drain else 'undrain'} {name}: {exc.detail}")
        finally:
            proc.kill()

    # Ground truth for diagnoses ------------------------------------------------------------------------

    def designated(self, pid: int) -> str | None:
        """The node etcd's map designates to lead partition ``pid`` now, if any."""
        return self._designated.get(pid)

    def reaches(self, a: str, b: str) -> bool:
        """Whether ``a`` and ``b`` can talk both ways, and both are up and not frozen."""
        for name in (a, b):
            proc = self.process(name)
            if proc is None or not proc.alive or proc.frozen:
                return False
        return self.network.passes(a, b) and self.network.passes(b, a)

    def _count_record_writes(self, server: EtcdServer, keys: list[str]) -> None:
        """Fail on a key written (or deleted) more than ``RECORD_WRITES_PER_S`` times within a
        second: each write is an etcd transaction and a watch event on every process that
        watches its prefix, and a storm of them is a process that no longer waits for what
        it asked (a manager designating anew at every plan, session 88)."""
        now = self.now()
        for key in keys:
            writes = self._record_writes.setdefault(key, deque())
            writes.append(now)
            while writes[0] <= now - 1.0:
                writes.popleft()
            if len(writes) > RECORD_WRITES_PER_S:
                self.oracle.fail("record-write-storm", f"{key} written {len(writes)} times within a second")

    def _watch_designations(self, server: EtcdServer, keys: list[str]) -> None:
        """A fact when the map designates a leader that cannot lead: it is cut off from a
        majority of its replica set (or down), or resigned for lack of a quorum lately."""
        prefix = self.layout.partitions
        for key in keys:
            if not key.startswith(prefix) or not key[len(prefix) :].isdigit():
                continue
            pid = int(key[len(prefix) :])
            found = server.state.kv.get(key)
            if found is None:
                self._designated.pop(pid, None)
                continue
            try:
                record = PartitionRecord.unpack(found.value)
            except PushgateError:
                continue
            before = self._designated.get(pid)
            self._designated[pid] = record.leader
            if record.leader is None or record.leader == before or before is None:
                continue
            leader = record.leader
            reachable = sum(1 for n in record.replicas if n == leader or self.reaches(leader, n))
            resigned = self.oracle.resigned_recently(leader, pid, 4.0)
            if reachable <= len(record.replicas) // 2 or resigned:
                why = (
                    "resigned for lack of a quorum lately"
                    if resigned
                    else (f"reaches {reachable - 1} of the other {len(record.replicas) - 1} replicas")
                )
                self.oracle.fact(
                    "designated-cannot-lead",
                    f"the map moved p{pid}'s leadership from {before} to {leader}, which {why}",
                    partition=pid,
                    node=leader,
                )
            else:
                self.trace.add(self.now(), "etcd", f"map: p{pid} leadership {before} -> {leader}")
