"""One run of the simulation: a seed, a fault mix, the invariants, a result.

A run (:func:`run_seed`) builds a cluster from the seed (4 or 5 nodes, two managers, a
gateway; one or two FIFO queues of one to three RF 3 partitions, two to five groups each),
waits until every partition has a leader, starts one producer per group, then:

1. **chaos** (``chaos_s``, 30 s of virtual time by default): the mix's faults;
2. **heal**: everything is mended (:meth:`~.faults.Chaos.heal_everything`) and the
   producers go on for ``settle_s`` (20 s);
3. **checks**: the producers stop; one more send to every group must be acknowledged
   (within 30 s), and a read of every partition must show every acknowledged send with
   its body, each group in send order.

The invariants of :mod:`.oracle` are checked all along; the first violation ends the run.
Everything comes from one ``random.Random(seed)`` on a virtual clock, so a seed replays
exactly: the same seed gives the same trace, whose digest the result carries.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import random
import time
from dataclasses import dataclass, field
from typing import Any

from backend_store.cluster.coordination.layout import Layout
from backend_store.types import QueueName

from .cluster import SimCluster
from .diagnosis import diagnose
from .faults import Chaos, Mix, mix_named
from .kernel import SimulationStuck, Trace, VirtualLoop
from .oracle import Fact, Oracle, Violation
from .sim_gateway import GroupProgress, QueueSpec, SimGateway
from .sim_pools import TENANT, Churn

# A minority fault must not stop a partition's sends longer than this: issue 24's target
# (a send waits at most a lease, 2 s, plus the failover; docs/testing.md).
DEFAULT_AVAILABILITY_BOUND_S = 3.0
DEFAULT_WINDOW_ENTRIES = 2048  # ReplicationLeader's default
# A pooled mix's queues (``Mix.pooled``): the producers' and idle ones, all in one pool of
# 8 partitions (``cluster.POOL_SLOTS``).
POOLED_QUEUES = 200


@dataclass(frozen=True, slots=True)
class Config:
    seed: int
    mix: Mix
    chaos_s: float = 20.0
    settle_s: float = 8.0
    availability_bound_s: float = DEFAULT_AVAILABILITY_BOUND_S
    trace_keep: int = 400
    # Each partition leader's shipping window (entries in flight to a follower). Production's
    # 2048 is never reached in a run of a few hundred entries; a small one (--window 8) puts
    # the window's bookkeeping under the faults (seed 22 of minority found issue 24's
    # restarted follower that never caught up that way).
    window_entries: int = DEFAULT_WINDOW_ENTRIES
    # The nodes' and managers' lease (``--lease-ttl``): 2 s, their default, which every
    # pinned seed was found at; 1 s is what ``pushgate dev-cluster`` runs (docs/cluster.md,
    # section 7, "Choosing the lease TTL").
    lease_ttl_s: float = 2.0


@dataclass(slots=True)
class Result:
    seed: int
    mix: str
    violation: Violation | None
    diagnosis: str | None
    digest: str
    virtual_s: float
    cpu_s: float
    acked: int
    events: int
    topology: str
    # The longest a FIFO group waited for an acknowledged send during the chaos (seconds),
    # with the fault that was active then: what a fault costs, measured.
    worst_pause_s: float = 0.0
    trace: list[tuple[float, str, str]] = field(default_factory=list)
    facts: list[Fact] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.violation is None

    def summary(self) -> str:
        head = f"seed {self.seed} [{self.mix}] {self.topology}: "
        if self.ok:
            return head + (
                f"ok ({self.acked} acknowledged, longest pause {self.worst_pause_s:.1f} s,"
                f" {self.virtual_s:.0f} s simulated, trace {self.digest})"
            )
        assert self.violation is not None
        text = (
            head
            + f"VIOLATED {self.violation.invariant} at t={self.violation.at:.3f}: {self.violation.detail}"
        )
        if self.diagnosis:
            text += f"\n  diagnosis: {self.diagnosis}"
        return text + f"\n  trace {self.digest}"

    def trace_text(self, last: int = 60) -> str:
        return "\n".join(f"  {at:9.3f} {actor:>8} {text}" for at, actor, text in self.trace[-last:])

    def report(self) -> str:
        """A failing test's message: the summary, how to replay the seed, its last events."""
        return f"{self.summary()}\nreplay: scripts/simulate --seed {self.seed} --faults {self.mix}\n{self.trace_text(40)}"


def run_seed(config: Config) -> Result:
    """Run one seed to its end (or its first violation); never raises for a violation."""
    loop = VirtualLoop()
    rng = random.Random(config.seed)
    trace = Trace(config.trace_keep)
    oracle = Oracle(trace, layout=Layout())
    run = _Run(config, rng, trace, oracle)
    started = time.process_time()
    gc_was = gc.isenabled()
    gc.disable()  # collection at allocation-count moments would finalize generators at random points
    capture = _LogCapture(trace, loop)
    try:
        asyncio.set_event_loop(loop)
        loop.set_exception_handler(run.exception_handler)
        loop.step_hooks.append(run.after_step)
        main = run.main_task = loop.create_task(run.main())
        try:
            loop.run_until_complete(main)
        except asyncio.CancelledError:
            pass  # the first violation ended the run
        except SimulationStuck as exc:
            oracle.fail("model", f"the simulation is stuck: {exc}")
        run.shutdown(loop)
    finally:
        capture.close()
        asyncio.set_event_loop(None)
        loop.close()
        if gc_was:
            gc.enable()
        gc.collect()
    violation = oracle.violation
    return Result(
        seed=config.seed,
        mix=config.mix.name,
        violation=violation,
        diagnosis=diagnose(violation, oracle.facts) if violation is not None else None,
        digest=trace.digest,
        virtual_s=run.virtual_s,
        cpu_s=time.process_time() - started,
        acked=len(oracle.acked_sends),
        worst_pause_s=run.worst_pause_s,
        events=trace.count,
        topology=run.topology,
        trace=trace.last(),
        facts=list(oracle.facts),
    )


class _LogCapture(logging.Handler):
    """Production code's log lines go to the trace (its warnings explain a failure); a
    logged exception is a bug the simulation found."""

    def __init__(self, trace: Trace, loop: VirtualLoop) -> None:
        super().__init__(logging.INFO)
        self.trace = trace
        self.loop = loop
        self.errors: list[str] = []
        self.logger = logging.getLogger("pushgate.cluster")
        self._level, self._propagate = self.logger.level, self.logger.propagate
        self.logger.setLevel(logging.INFO)
        self.logger.propagate = False
        self.logger.addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        owner = self.loop.owner()
        actor = owner.name if owner is not None else "-"
        self.trace.add(self.loop.time(), actor, record.getMessage())
        if record.exc_info:
            self.errors.append(f"{actor}: {record.getMessage()}")

    def close(self) -> None:
        self.logger.removeHandler(self)
        self.logger.setLevel(self._level)
        self.logger.propagate = self._propagate
        super().close()


class _Run:
    def __init__(self, config: Config, rng: random.Random, trace: Trace, oracle: Oracle) -> None:
        self.config = config
        self.rng = rng
        self.trace = trace
        self.oracle = oracle
        self._cluster: SimCluster | None = None
        self.gateway: SimGateway | None = None
        self.queues: list[QueueSpec] = []
        self.topology = ""
        self.virtual_s = 0.0
        self.chaos: Chaos | None = None
        self._chaos_window: tuple[float, float] = (0.0, 0.0)
        self.stopping = False
        self.worst_pause_s = 0.0
        self.main_task: asyncio.Task[None] | None = None
        self.churn: Churn | None = None
        self.made_again: list[str] = []  # producers' queues whose records a restore lost
        # The queue a ``late_queue`` mix makes during the chaos, once placed, and the ids of
        # its partitions then (what its acknowledged sends went to).
        self.late: tuple[QueueSpec, tuple[int | None, ...]] | None = None

    def after_step(self) -> None:
        if self.oracle.violation is not None and not self.stopping and self.main_task is not None:
            self.stopping = True
            self.main_task.cancel()

    def exception_handler(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        message = context.get("message", "")
        if isinstance(exc, asyncio.CancelledError) or not loop.is_running() or self.stopping:
            return
        self.oracle.fail("model", f"an unhandled error in the simulation: {message} {exc!r}")

    @property
    def cluster(self) -> SimCluster:
        assert self._cluster is not None
        return self._cluster

    async def main(self) -> None:
        # A mix without pools writes nothing under pools/: the managers' watch of it is read
        # off the network, so that it draws nothing from the run's random stream and those
        # mixes keep the schedules their pinned seeds were found on (docs/testing.md).
        quiet = frozenset() if self.config.mix.pooled else frozenset({Layout().pools})
        self._cluster = SimCluster(
            self.rng,
            self.trace,
            self.oracle,
            window_entries=self.config.window_entries,
            lease_ttl_s=self.config.lease_ttl_s,
            off_the_network=quiet,
        )
        config, rng, cluster = self.config, self.rng, self.cluster
        nodes = rng.choice([4, 4, 5])
        for i in range(nodes):
            cluster.start_node(f"n{i + 1}")
        for name in ("m1", "m2"):
            cluster.start_manager(name)
        pooled = config.mix.pooled
        self.queues = [
            QueueSpec(
                f"q{q}", rng.randint(1, 2 if pooled else 3), [f"q{q}g{g}" for g in range(rng.randint(2, 5))]
            )
            for q in range(rng.choice([2, 3] if pooled else [1, 1, 2]))
        ]
        idle = (
            [QueueSpec(f"idle{i}", 1, []) for i in range(POOLED_QUEUES - len(self.queues))] if pooled else []
        )
        self.topology = f"{nodes} nodes, " + ", ".join(
            f"{q.name}: {q.partitions} partition(s) x {len(q.groups)} groups" for q in self.queues
        )
        if pooled:
            self.topology += f", {len(idle)} idle queues, in one pool"
        # An operator creates queues once the nodes are up (docs/cluster.md): a queue placed
        # while one node had registered would start with one replica and grow one voter at
        # a time, through two voters that tolerate no fault.
        await self._until_registered(nodes, 20.0)
        if pooled:
            gateway = self.gateway = await cluster.start_gateway([])
            await self._create_pooled(gateway, idle, 60.0)
            # Taken before the producers' queues exist: a restore to it (half the restores
            # go to the oldest backup) loses their records, never their messages
            # (docs/cluster.md, "Never delete on absence"); healing makes them again.
            cluster.backup()
            await self._create_pooled(gateway, self.queues, 30.0)
        else:
            gateway = self.gateway = await cluster.start_gateway(self.queues)
        await self._until_placed(gateway, 20.0)
        cluster.backup()
        gateway.start_producers(self.queues)
        await asyncio.sleep(2.0)
        # Chaos.
        chaos = self.chaos = Chaos(cluster, config.mix, rng)
        start = asyncio.get_running_loop().time()
        backups = asyncio.get_running_loop().create_task(self._backups())
        watcher = asyncio.get_running_loop().create_task(self._watch_gateway_map())
        churn = None
        if pooled:
            self.churn = Churn(gateway, self.oracle, rng, [q.name for q in idle])
            churn = gateway.proc.spawn(self.churn.run(), "churn")
        elif config.mix.late_queue:
            churn = gateway.proc.spawn(self._make_late_queue(gateway), "late queue")
        await chaos.run(config.chaos_s)
        if churn is not None:
            churn.cancel()
        backups.cancel()
        self._chaos_window = (start, asyncio.get_running_loop().time())
        await chaos.heal_everything()
        if pooled:
            # The operator makes again the queues a restore lost (the gateway places a queue
            # where its name hashes to: the same partitions, which kept its messages).
            written = len(gateway.pools.written)
            await self._create_pooled(gateway, self.queues, 30.0)
            self.made_again = gateway.pools.written[written:]
            if self.made_again:
                self.oracle.fact("queues-made-again", f"a restore had lost the records of {self.made_again}")
        self._check_availability(enforce=config.mix.availability_checked)
        await asyncio.sleep(config.settle_s)
        if self.late is not None:
            self._check_late_queue_if_kept(gateway, *self.late)
        # Checks.
        gateway.sending = False
        await self._until_idle(gateway)
        await self._final_sends(gateway)
        await self._final_reads(gateway)
        watcher.cancel()
        if self.churn is not None:
            churned = self.churn
            self.topology += (
                f"; churn: {churned.created} created, {churned.deleted} deleted, {churned.acked} sends"
            )
            if self.made_again:
                self.topology += f"; made again after a restore: {', '.join(self.made_again)}"
        self.virtual_s = asyncio.get_running_loop().time()

    async def _make_late_queue(self, gateway: SimGateway) -> None:
        """A queue with partitions of its own, made once the chaos has begun (after the
        backup taken before it, and maybe others), then sent to like the first ones. A
        restore to an older backup loses its records; its copies, holding acknowledged
        sends, must stay on the nodes as strays (the oracle fails any deletion of a copy
        whose acknowledged entries no majority of the map's replicas holds)."""
        rng = self.rng
        await asyncio.sleep(2.0 + rng.random() * 6.0)
        spec = QueueSpec("late", rng.randint(1, 2), [f"lateg{g}" for g in range(rng.randint(2, 3))])
        await self.cluster.write_queue_record(gateway.coordinator, spec)
        self.oracle.fact(
            "late-queue-made", f"{spec.name}: {spec.partitions} partition(s), made during the chaos"
        )
        while not self._placed(gateway, spec):  # noqa: ASYNC110
            await asyncio.sleep(0.1)  # virtual time: a poll costs nothing
        self.late = (spec, self._partition_ids(gateway, spec))
        self.topology += (
            f", {spec.name}: {spec.partitions} partition(s) x {len(spec.groups)} groups made later"
        )
        gateway.start_producers([spec])

    def _partition_ids(self, gateway: SimGateway, spec: QueueSpec) -> tuple[int | None, ...]:
        parts = (
            gateway.view.map.partition(TENANT, QueueName(spec.name), i, None) for i in range(spec.partitions)
        )
        return tuple(part.id if part is not None else None for part in parts)

    def _check_late_queue_if_kept(
        self, gateway: SimGateway, spec: QueueSpec, placed: tuple[int | None, ...]
    ) -> None:
        """After healing, the late queue is checked like the first ones when etcd still holds
        its record and the partitions its sends went to; otherwise a restore lost them, and
        no gateway can reach its messages (the oracle has held its copies: none deleted)."""
        record = self.cluster.etcd.state.kv.get(self.cluster.layout.queue(TENANT, spec.name))
        if record is not None and self._partition_ids(gateway, spec) == placed:
            self.queues.append(spec)
            return
        self.oracle.fact("late-queue-lost", f"a restore lost {spec.name}'s records: its copies are strays")
        self.topology += f"; a restore lost {spec.name}'s records"
        for group in spec.groups:
            gateway.groups.pop((spec.name, group), None)

    async def _until_registered(self, nodes: int, timeout_s: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        prefix = self.cluster.layout.nodes
        while loop.time() < deadline:
            if sum(key.startswith(prefix) for key in self.cluster.etcd.state.kv) >= nodes:
                return
            await asyncio.sleep(0.1)
        self.oracle.fail("model", f"the nodes did not register within {timeout_s:g}s")

    async def _create_pooled(self, gateway: SimGateway, queues: list[QueueSpec], timeout_s: float) -> None:
        """Create every queue in the pool, as the gateway does (sim_pools.py)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        for spec in queues:
            before = gateway.pools.placements.get(spec.name)
            if not await gateway.pools.create(spec, max(0.0, deadline - loop.time())):
                self.oracle.fail("model", f"{spec.name} was not created in its pool within {timeout_s:g}s")
                return
            if before is not None and gateway.pools.placements[spec.name] != before:
                self.oracle.fail("model", f"{spec.name} made again on other partitions than before")
                return

    def _placed(self, gateway: SimGateway, spec: QueueSpec) -> bool:
        placement = gateway.pools.placements.get(spec.name)
        if placement is None:
            return gateway.view.map.complete(TENANT, QueueName(spec.name), spec.partitions)
        parts = [gateway.view.map.partitions.get(pid) for pid in placement]
        return all(p is not None and p.leader is not None for p in parts)

    async def _until_placed(self, gateway: SimGateway, timeout_s: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while loop.time() < deadline:
            ready = all(self._placed(gateway, q) for q in self.queues)
            if ready:
                return
            await asyncio.sleep(0.1)
        self.oracle.fail("model", f"the cluster did not place every partition within {timeout_s:g}s")

    async def _backups(self) -> None:
        while True:
            await asyncio.sleep(5.0 + self.rng.random() * 5.0)
            self.cluster.backup()

    async def _watch_gateway_map(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            if self.gateway is not None and self.cluster.etcd.up:
                self.gateway.note_stale_map(self.cluster.etcd.state.revision)

    async def _until_idle(self, gateway: SimGateway) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 15.0
        while loop.time() < deadline and any(g.sending > g.acked for g in gateway.groups.values()):  # noqa: ASYNC110
            await asyncio.sleep(0.2)  # polls the producers (virtual time: a poll costs nothing)

    async def _final_sends(self, gateway: SimGateway) -> None:
        """After healing, every group takes a send (the partition's leader serves)."""
        for (queue, group), progress in sorted(gateway.groups.items()):
            seq = max(progress.acked, progress.sending) + 1
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 30.0
            ok = False
            while not ok and loop.time() < deadline:
                ok = await gateway.send_one(progress, seq)
            if not ok:
                self.oracle.fail(
                    "available-after-heal",
                    f"{queue}/{group} (partition index {progress.index}) took no send for 30 s after healing",
                )
                return

    async def _final_reads(self, gateway: SimGateway) -> None:
        oracle = self.oracle
        for spec in self.queues:
            for index in range(spec.partitions):
                try:
                    messages = await gateway.read_all(spec.name, index)
                except Exception as exc:  # any failure to read is the finding
                    oracle.fail(
                        "readable-after-heal",
                        f"{spec.name} partition index {index}: the read failed: {exc!r}",
                    )
                    return
                groups = [g for g in gateway.groups.values() if g.queue == spec.name and g.index == index]
                self._check_read(spec.name, index, messages, groups)

    def _check_read(self, queue: str, index: int, messages: list[Any], groups: list[GroupProgress]) -> None:
        oracle = self.oracle
        for progress in groups:
            group = progress.group
            read = [m for m in messages if m.group_id == group]
            seqs = [int(m.body.decode().rsplit("/", 1)[1]) for m in read]
            if seqs != sorted(seqs) or len(set(seqs)) != len(seqs):
                oracle.fail("fifo-order", f"{queue}/{group}: read in the order {seqs[:40]}")
                return
            bodies = {int(m.body.decode().rsplit("/", 1)[1]): m.body for m in read}
            for seq in range(1, progress.acked + 1):
                ack = oracle.acked_sends.get((group, seq))
                if ack is None:
                    continue
                if seq not in bodies:
                    oracle.fail(
                        "readable-after-heal",
                        f"{queue}/{group}: acknowledged seq {seq} (p{ack.partition} LSN {ack.lsn}, epoch {ack.epoch})"
                        f" is not in the partition; it holds {len(read)} of the group's messages",
                    )
                    return
                if bodies[seq] != ack.body:
                    oracle.fail(
                        "acknowledged-write-changed", f"{queue}/{group}: seq {seq} reads {bodies[seq]!r}"
                    )
                    return

    def _check_availability(self, *, enforce: bool) -> None:
        """The longest a send waited during the chaos, from its first attempt (or the chaos's
        start) to its acknowledgement (or the chaos's end), retries included; under one
        minority fault at a time (``enforce``) it must stay within the bound. A group's think
        time between sends is not counted: the partition was not refusing it anything."""
        assert self.gateway is not None
        start, end = self._chaos_window
        bound = self.config.availability_bound_s
        for (queue, group), progress in sorted(self.gateway.groups.items()):
            spans = [(a, b) for a, b in progress.waits if b >= start and a <= end]
            if progress.sending_since is not None and progress.sending_since <= end:
                spans.append((progress.sending_since, end))  # still waiting when the chaos ended
            waits = [(min(b, end) - max(a, start), max(a, start)) for a, b in spans]
            worst = max(waits, default=(0.0, start))
            self.worst_pause_s = max(self.worst_pause_s, worst[0])
            if enforce and worst[0] > bound:
                self.oracle.fail(
                    "minority-fault-availability",
                    f"{queue}/{group} (partition index {progress.index}): a send waited {worst[0]:.1f} s"
                    f" from t={worst[1]:.1f} under one minority fault at a time (bound {bound:g} s)",
                )
                return

    def shutdown(self, loop: VirtualLoop) -> None:
        """Stop every task (their effects go nowhere once every process is dead)."""
        self.stopping = True
        self.virtual_s = self.virtual_s or loop.time()

        async def stop_all() -> None:
            if self._cluster is not None:
                for proc in _processes(self._cluster):
                    proc.kill()
            me = asyncio.current_task()
            for _ in range(200):
                pending = [t for t in asyncio.all_tasks() if t is not me and not t.done()]
                if not pending:
                    return
                for task in sorted(pending, key=lambda t: t.get_name()):
                    task.cancel()
                await asyncio.sleep(0.1)

        with contextlib.suppress(SimulationStuck):
            loop.run_until_complete(stop_all())


def _processes(cluster: SimCluster) -> list[Any]:
    procs = [node.proc for node in cluster.nodes.values()]
    procs += [proc for proc, _ in cluster.managers.values()]
    if cluster.gateway is not None:
        procs.append(cluster.gateway.proc)
    procs.append(cluster.etcd_proc)
    return procs


def config_for(seed: int, faults: str, **overrides: Any) -> Config:
    return Config(seed=seed, mix=mix_named(faults), **overrides)
