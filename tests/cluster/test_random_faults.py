"""Issue 24's "real processes, random faults" test: real etcd, ``pushgate node`` processes each
behind TCP proxies the test controls, two ``pushgate manager`` processes, and a gateway's
``ClusterBackend``; a seeded schedule of faults (``fault_schedule.py``) runs under load, then
everything heals, every queue is drained, and the run checks that nothing acknowledged is
missing and that each FIFO group was read in the order it was sent.

Two mixes of queues under the same load (``fault_load.py``: producers through a gateway's
``ClusterBackend``, each send retried with its dedupe id until acknowledged; consumers through
``ClusterHarness.call`` on whoever leads a partition now):

- queues of their own partitions: a standard queue (one partition, two producers) and a FIFO
  queue (two partitions, a producer per message group), a consumer per partition;
- sixty queues made through the backend, so placed on a pool of four partitions
  (docs/cluster.md, "Shared partitions"): four producers and four consumers, each going
  round a quarter of the queues, the faults aimed at the pool's partitions.

The longest any send waited after a fault began (a send already under way counted from the
fault on) is what that fault cost a user, and each fault's report waits for the sends under
way. Checked at the end: every queue took a send once the faults were over; every
acknowledged send was delivered, each delivery with the id and seq its send's
acknowledgement gave (a message stored twice, or moved, would differ); each group's messages
were first delivered in send order; no message was delivered by a receive begun after its
ack was acknowledged; every queue is empty once drained, with counts that match its
acknowledged sends.

Seeds: ``PUSHGATE_FAULT_SEED=S`` replays seed S; ``PUSHGATE_FAULT_SEEDS=A-B`` runs seeds A..B
(inclusive); otherwise CI's seeds (``CI_SEEDS``; ``POOLED_CI_SEEDS`` for the pooled mix). A
run prints its seed, its schedule and what each fault hit (shown by pytest when it fails).
``PUSHGATE_FAULT_LEASE_TTL=1`` runs the nodes and managers on 1 s leases, as ``pushgate
dev-cluster`` does (2 s, their own default, otherwise; the session's etcd grants either).
"""

from __future__ import annotations

import asyncio
import collections
import os
import random
import signal
import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import pytest

from backend_store import StoreOptions
from backend_store.cluster.client.cluster_backend import open_cluster_backend
from backend_store.cluster.client.routing import partition_index
from backend_store.cluster.coordination import pools
from backend_store.types import (
    MessageId,
    NewMessage,
    PeekedMessage,
    QueueAttributes,
    QueueInfo,
    QueueName,
    Receipt,
    ReceivedMessage,
    SendResult,
    TenantId,
)
from tests.fixtures.etcd_server import unique_prefix

from .fault_load import VISIBILITY_S, Delivery, Load, Partition, Producer, T, Target
from .fault_schedule import ACTIVE_MANAGER, LEADER, Fault, Kind, describe, make_schedule
from .processes import ClusterHarness
from .workload import has_replicas

STANDARD = "orders"
FIFO = "fifo"
FIFO_PARTITIONS = 2
GROUPS = ("g0", "g1", "g2", "g4", "g5", "g6")  # three on each FIFO partition
NODES, RUNNING, MANAGERS = 5, 4, 2  # n4 is the spare a "join" starts
FAULTS = 6
CI_SEEDS = (1, 2, 3)
RF3 = {"replication_factor": 3, "replication_mode": "sync", "visibility_timeout_s": VISIBILITY_S}
# The pooled mix: queues on a pool's partitions (docs/cluster.md, "Shared partitions").
POOLED_QUEUES = 60
POOL_SLOTS = 4
POOL = pools.pool_name(3, "sync")
POOLED_WORKERS = 4  # producers and consumers, each over a quarter of the queues
POOLED_CI_SEEDS = (4,)  # a kill, a freeze and a cut, of partitions' leaders (see its test)


def _seeds(ci: tuple[int, ...]) -> list[int]:
    one = os.environ.get("PUSHGATE_FAULT_SEED")
    if one:
        return [int(one)]
    span = os.environ.get("PUSHGATE_FAULT_SEEDS")
    if span:
        first, _, last = span.partition("-")
        return list(range(int(first), int(last or first) + 1))
    return list(ci)


@pytest.fixture
async def harness(etcd_endpoints: list[str], tmp_path: Path) -> AsyncIterator[ClusterHarness]:
    lease_ttl = float(os.environ.get("PUSHGATE_FAULT_LEASE_TTL", "2"))
    h = ClusterHarness(etcd_endpoints, tmp_path, unique_prefix("faults") + "/", lease_ttl)
    try:
        yield h
    finally:
        await h.close()


class Run:
    """The cluster, the load and the fault schedule of one seed; ``log`` says what happened."""

    def __init__(self, h: ClusterHarness, seed: int, partitions: list[Partition], load: Load) -> None:
        self.h, self.seed, self.partitions, self.load = h, seed, partitions, load
        self.started = time.monotonic()
        self.unsettled = ""  # what settled() last found not so
        self.spare = f"n{NODES - 1}"
        self.schedule = make_schedule(
            seed,
            nodes=[f"n{i}" for i in range(RUNNING)],
            spare=self.spare,
            partitions=[p.label for p in partitions],
            managers=[m.name for m in h.managers],
            count=FAULTS,
        )
        self.log: list[str] = []
        self.note(describe(seed, self.schedule))

    def note(self, line: str) -> None:
        stamped = f"[{time.monotonic() - self.started:6.2f}s] {line}"
        self.log.append(stamped)
        print(stamped, flush=True)

    def report(self) -> str:
        return "\n".join(self.log)

    async def resolve(self, target: str) -> str:
        if target.startswith(LEADER):
            label = target.removeprefix(LEADER)
            pid = next(p.pid for p in self.partitions if p.label == label)
            node, _, _ = await self.h.serving_leader(pid)
            return node
        if target == ACTIVE_MANAGER:
            assert self.h.coordinator is not None
            entry = await self.h.coordinator.get(self.h.layout.manager)
            return entry.value.decode() if entry is not None else self.h.managers[0].name
        return target

    async def make(self, fault: Fault) -> None:
        h = self.h
        assert h.network is not None
        target = await self.resolve(fault.target)
        self.note(f"{fault.kind} {target} ({fault.target}) for {fault.hold_s:.2f}s")
        if fault.kind is Kind.JOIN:
            h.nodes[target].start()
            await h.wait_registered([target])
            return
        if fault.kind is Kind.MANAGER:
            manager = next(m for m in h.managers if m.name == target)
            manager.kill()
            await asyncio.sleep(fault.hold_s)
            manager.start()
            return
        node = h.nodes[target]
        if fault.kind is Kind.KILL:
            node.kill()
            await asyncio.sleep(fault.hold_s)
            node.start()
        elif fault.kind is Kind.FREEZE:
            node.signal(signal.SIGSTOP)
            try:
                await asyncio.sleep(fault.hold_s)
            finally:
                node.signal(signal.SIGCONT)
        elif fault.kind in (Kind.SEPARATE, Kind.ISOLATE):
            if fault.kind is Kind.SEPARATE:
                h.network.separate(target)
            else:
                h.network.isolate(target)
            await asyncio.sleep(fault.hold_s)
            h.network.heal()
        else:
            assert fault.kind is Kind.DRAIN
            await h.manager_command("--drain", target)
            await asyncio.sleep(fault.hold_s)
            await h.manager_command("--undrain", target)

    async def leader_lsns(self) -> dict[int, int] | None:
        """Each partition's last LSN as its serving leader publishes it now."""
        records = await self.h.node_records()
        lsns: dict[int, int] = {}
        for p in self.partitions:
            found = await self.h.leader(p.pid)
            position = records[found[0]].replicas.get(p.pid) if found and found[0] in records else None
            if position is None or position.role != "leader":
                return None
            lsns[p.pid] = position.lsn
        return lsns

    async def settled(self, marks: dict[int, int]) -> bool:
        """Every running node is up in etcd; every partition has its designated leader serving,
        and every other voter is in sync with it and published a position at least at the
        leader's LSN of ``marks`` (taken once the fault was undone: a position from before the
        fault, still in etcd while the node's lease lives, is lower as long as writes go on).
        What is not yet so is kept in ``unsettled`` for the timeout's message."""
        self.load.raise_failures()
        records = await self.h.node_records()
        running = {name for name, proc in self.h.nodes.items() if proc.running}
        down = [n for n in running if n not in records or records[n].state != "up"]
        if down:
            self.unsettled = f"running nodes not up in etcd: {down}"
            return False
        mapped = await self.h.partitions()
        for p in self.partitions:
            record = mapped.get(p.pid)
            found = await self.h.leader(p.pid)
            if record is None or found is None or found[0] != record.leader:
                self.unsettled = f"p{p.pid}: key held by {found and found[0]}, the record designates {record}"
                return False
            position = records[found[0]].replicas.get(p.pid) if found[0] in records else None
            if position is None or position.role != "leader":
                self.unsettled = f"p{p.pid}: {found[0]} holds the key but publishes {position}"
                return False
            followers = set(record.replicas) - {found[0]}
            if not followers <= set(position.in_sync):
                behind = {n: records.get(n) for n in sorted(followers - set(position.in_sync))}
                self.unsettled = f"p{p.pid}: not in sync with the leader's {position}: {behind}"
                return False
            for node in followers:
                theirs = records[node].replicas.get(p.pid) if node in records else None
                if theirs is None or theirs.lsn < marks[p.pid]:
                    self.unsettled = f"p{p.pid}: {node} at {theirs}, behind the mark {marks[p.pid]}"
                    return False
        self.unsettled = ""
        return True

    async def settle(self, what: str) -> None:
        began = time.monotonic()
        marks: dict[int, int] = await self.h.wait_for(f"a leader of every partition {what}", self.leader_lsns)
        try:
            await self.h.wait_for(what, lambda: self.settled(marks), timeout=45)
        except AssertionError as exc:
            exc.add_note(f"not settled: {self.unsettled}")
            raise
        self.note(f"settled {what} in {time.monotonic() - began:.2f}s (leaders' LSNs then: {marks})")


async def _partition(h: ClusterHarness, label: str, pid: int) -> Partition:
    await h.wait_for(f"three replicas of {label}", lambda: has_replicas(h, pid, 3))
    await h.serving_leader(pid)
    return Partition(label, pid)


async def _peek_all(h: ClusterHarness, target: Target) -> list[PeekedMessage]:
    peeked: list[PeekedMessage] = await h.call_until_ok(
        target.pid, "peek", tenant=TenantId(T), queue=QueueName(target.queue), max_messages=1000
    )
    return peeked


async def _drain(run: Run) -> None:
    """Until every acknowledged send was delivered and every target is empty."""
    load = run.load

    async def drained() -> bool:
        load.raise_failures()
        if not set(load.acknowledged) <= load.delivered():
            return False
        for target in load.targets:
            if await _peek_all(run.h, target):
                return False
        return True

    await run.h.wait_for(
        "every acknowledged send delivered and every queue empty", drained, timeout=VISIBILITY_S * 6
    )


async def _check_counts(run: Run) -> None:
    """Each drained target's own counts: as many messages stored as sends acknowledged to it
    (a retry deduplicated adds none; an acknowledged send a failover lost, one fewer), each
    acked, none left."""
    for target in run.load.targets:
        info: QueueInfo = await run.h.call_until_ok(
            target.pid, "get_queue", tenant=TenantId(T), name=QueueName(target.queue)
        )
        acknowledged = len(run.load.sent_to[target])
        counts = (info.stats.sent_total, info.stats.acked_total, info.stats.visible, info.stats.in_flight)
        assert counts == (acknowledged, acknowledged, 0, 0), (
            f"{target}: sent, acked, visible, in flight {counts}; {acknowledged} sends acknowledged"
        )


def check_deliveries(
    acknowledged: dict[str, SendResult],
    sent_to: Mapping[Target, list[str]],
    sent_by_group: dict[str, list[str]],
    deliveries: list[Delivery],
    ack_confirmed_at: dict[str, float],
) -> None:
    """What a drained run must show (the module's docstring)."""
    for target, bodies in sent_to.items():
        # Two messages acknowledged with one seq: a leader handed out again the seq of a
        # message it does not hold, one that a deposed leader acknowledged (delivered from
        # there, maybe, so the deliveries alone would not show it is gone).
        for what, values in (
            ("seq", [str(acknowledged[b].seq) for b in bodies]),
            ("id", [acknowledged[b].id for b in bodies]),
        ):
            shared = {v for v, n in collections.Counter(values).items() if n > 1}
            twice = [(b, v) for b, v in zip(bodies, values, strict=True) if v in shared]
            assert not twice, f"{target}: one {what} acknowledged for several sends: {twice[:20]}"
    sent = set(acknowledged)
    delivered = {d.body for d in deliveries}
    missing = sent - delivered
    assert not missing, f"{len(missing)} acknowledged sends never delivered: {sorted(missing)[:20]}"
    strangers = delivered - sent
    assert not strangers, f"delivered but never sent: {sorted(strangers)[:20]}"
    moved = {
        d.body: ((acknowledged[d.body].id, acknowledged[d.body].seq), (d.message.id, d.message.seq))
        for d in deliveries
        if (d.message.id, d.message.seq) != (acknowledged[d.body].id, acknowledged[d.body].seq)
    }
    assert not moved, f"delivered with another id or seq than acknowledged (acked, delivered): {moved}"
    again = [
        (d.body, d.asked_at, ack_confirmed_at[d.body])
        for d in deliveries
        if d.body in ack_confirmed_at and d.asked_at > ack_confirmed_at[d.body]
    ]
    assert not again, f"delivered by a receive begun after its ack was acknowledged: {again[:10]}"
    first: dict[str, list[str]] = collections.defaultdict(list)
    seen: set[str] = set()
    for d in deliveries:
        if d.body not in seen and d.message.group_id is not None:
            seen.add(d.body)
            first[d.message.group_id].append(d.body)
    for group, sent_order in sent_by_group.items():
        assert first[group] == sent_order, (
            f"group {group} first delivered out of send order: {first[group][:50]} (sent {sent_order[:50]})"
        )


async def _run_faults(h: ClusterHarness, seed: int, partitions: list[Partition], load: Load) -> None:
    """The seed's faults under the load, one at a time, each until the cluster settled; then
    the producers' last sends (one to every queue), the drain, and the checks."""
    run = Run(h, seed, partitions, load)
    try:
        await run.settle("before the load")
        load.start()
        for fault in run.schedule:
            await asyncio.sleep(fault.gap_s)  # the schedule's own pause between faults
            load.fault_at = time.monotonic()
            await run.make(fault)
            await run.settle(f"after {fault.kind}")
            settled_at = time.monotonic()

            async def caught_up(settled_at: float = settled_at) -> bool:
                # The sends under way when the cluster settled have finished: this fault's
                # report counts them, not the next one's.
                load.raise_failures()
                return all(began > settled_at for began in load.under_way.values())

            await h.wait_for("the sends under way to be acknowledged", caught_up)
            slowest, body, began = load.slowest_send
            stop, stopped = load.longest_stop
            load.slowest_send, load.longest_stop = (0.0, "", 0.0), (0.0, "")
            run.note(
                f"{len(load.acknowledged)} sends acknowledged, {len(load.deliveries)} deliveries;"
                f" longest wait since the fault began {stop:.2f}s ({stopped});"
                f" slowest send {slowest:.2f}s ({body}, began at {began - run.started:.2f}s)"
            )
        target = len(load.acknowledged) + 20

        async def more_sends() -> bool:
            load.raise_failures()
            return len(load.acknowledged) >= target

        await h.wait_for("20 more sends after the last fault", more_sends)
        await load.stop_producers()
        run.note(
            f"producers stopped: {len(load.acknowledged)} sends acknowledged, the last one to each "
            f"of the {len(load.targets)} targets"
        )
        try:
            await _drain(run)
        except AssertionError:
            # Say what is wrong with what was delivered, if anything, before the timeout.
            check_deliveries(
                load.acknowledged, load.sent_to, load.sent_by_group, load.deliveries, load.ack_confirmed_at
            )
            raise
        await load.stop_consumers()
        run.note(f"drained: {len(load.deliveries)} deliveries of {len(load.delivered())} messages")
        check_deliveries(
            load.acknowledged, load.sent_to, load.sent_by_group, load.deliveries, load.ack_confirmed_at
        )
        await _check_counts(run)
    except BaseException as exc:
        exc.add_note(run.report())
        raise
    finally:
        load.stopping.set()
        load.consumers_stopping.set()
        for task in [*load.producers, *load.consumers]:
            task.cancel()
        await asyncio.gather(*load.producers, *load.consumers, return_exceptions=True)


@pytest.mark.slow
@pytest.mark.parametrize("seed", _seeds(CI_SEEDS), ids=lambda seed: f"seed{seed}")
async def test_random_faults_under_load_lose_nothing_acknowledged_and_keep_fifo_order(
    harness: ClusterHarness, seed: int
) -> None:
    h = await harness.start(nodes=NODES, managers=MANAGERS, running=RUNNING, proxied=True)
    await h.create_queue(T, STANDARD, {**RF3, "partitions": 1})
    await h.create_queue(T, FIFO, {**RF3, "partitions": FIFO_PARTITIONS, "ordering": "fifo"})
    standard = Target(STANDARD, await h.partition_of(T, STANDARD))
    fifo = [Target(FIFO, await h.partition_of(T, FIFO, i)) for i in range(FIFO_PARTITIONS)]
    partitions = [await _partition(h, "orders/0", standard.pid)]
    partitions += [await _partition(h, f"fifo/{i}", t.pid) for i, t in enumerate(fifo)]
    attributes = QueueAttributes(partitions=FIFO_PARTITIONS, ordering="fifo")
    producers = [Producer(f"s{i}-", (standard,)) for i in range(2)]
    producers += [
        Producer(f"{g}-", (fifo[partition_index(NewMessage(b"", group_id=g), attributes, 0)],), g)
        for g in GROUPS
    ]
    url = f"cluster://{','.join(h.endpoints)}{h.prefix}"
    backend = open_cluster_backend(url, StoreOptions())
    await backend.start()
    try:
        load = Load(h, backend, producers, [(t,) for t in [standard, *fifo]])
        await _run_faults(h, seed, partitions, load)
    finally:
        await backend.close()


@pytest.mark.slow
@pytest.mark.parametrize("seed", _seeds(POOLED_CI_SEEDS), ids=lambda seed: f"seed{seed}")
async def test_random_faults_on_sixty_queues_sharing_a_pool_lose_nothing_and_serve_every_queue_again(
    harness: ClusterHarness, seed: int
) -> None:
    """Sixty queues made through the gateway's backend, placed on a pool of four partitions;
    sends spread over all of them. Per queue: every acknowledged send delivered, counts that
    match, and a send taken once the faults are over."""
    h = await harness.start(
        nodes=NODES,
        managers=MANAGERS,
        running=RUNNING,
        proxied=True,
        manager_args=["--partitions", str(POOL_SLOTS)],
    )
    url = f"cluster://{','.join(h.endpoints)}{h.prefix}"
    backend = open_cluster_backend(url, StoreOptions())
    await backend.start()
    try:
        names = [QueueName(f"inbox-{i:02d}") for i in range(POOLED_QUEUES)]
        for name in names:
            await backend.create_queue(TenantId(T), name, RF3)
        records = await h.partitions()
        slots = sorted((r.index, pid) for pid, r in records.items() if r.pool == POOL)
        assert [i for i, _ in slots] == list(range(POOL_SLOTS)), records
        partitions = [await _partition(h, f"pool/{i}", pid) for i, pid in slots]
        targets = [Target(name, await h.partition_of(T, name)) for name in names]
        assert {t.pid for t in targets} == {p.pid for p in partitions}  # every slot holds queues
        quarters = [tuple(targets[i::POOLED_WORKERS]) for i in range(POOLED_WORKERS)]
        producers = [Producer(f"p{i}-", quarter) for i, quarter in enumerate(quarters)]
        await _run_faults(h, seed, partitions, Load(h, backend, producers, quarters))
    finally:
        await backend.close()


# The schedule on its own (no processes) -------------------------------------------------------


def _schedule(seed: int) -> list[Fault]:
    return make_schedule(
        seed,
        nodes=["n0", "n1", "n2", "n3"],
        spare="n4",
        partitions=["orders/0", "fifo/0", "fifo/1"],
        managers=["m0", "m1"],
        count=40,
    )


def test_a_seed_gives_the_same_schedule_every_time() -> None:
    random.seed(12345)  # the global generator plays no part
    first = _schedule(7)
    random.seed(54321)
    assert _schedule(7) == first
    assert _schedule(8) != first
    assert describe(7, first) == describe(7, _schedule(7))


def test_a_schedule_joins_its_spare_once_and_targets_only_what_exists() -> None:
    for seed in range(200):
        faults = _schedule(seed)
        joins = [i for i, f in enumerate(faults) if f.kind is Kind.JOIN]
        assert len(joins) <= 1
        members = {"n0", "n1", "n2", "n3"}
        for i, fault in enumerate(faults):
            if fault.kind is Kind.JOIN:
                members.add(fault.target)
            elif fault.kind is Kind.MANAGER:
                assert fault.target in {"active", "m0", "m1"}
            else:
                assert fault.target in members or fault.target.removeprefix(LEADER) in {
                    "orders/0",
                    "fifo/0",
                    "fifo/1",
                }, (seed, i, fault)
            assert fault.hold_s >= 0 and fault.gap_s > 0
    kinds = {f.kind for seed in range(20) for f in _schedule(seed)}
    assert kinds == set(Kind)


def test_the_ci_seeds_make_every_kind_of_fault() -> None:
    made = {
        fault.kind
        for seed in CI_SEEDS
        for fault in make_schedule(
            seed,
            nodes=[f"n{i}" for i in range(RUNNING)],
            spare=f"n{NODES - 1}",
            partitions=["orders/0", *(f"fifo/{i}" for i in range(FIFO_PARTITIONS))],
            managers=[f"m{i}" for i in range(MANAGERS)],
            count=FAULTS,
        )
    }
    assert made == set(Kind)


def test_the_pooled_ci_seed_kills_freezes_and_cuts_partitions_leaders() -> None:
    faults = [
        fault
        for seed in POOLED_CI_SEEDS
        for fault in make_schedule(
            seed,
            nodes=[f"n{i}" for i in range(RUNNING)],
            spare=f"n{NODES - 1}",
            partitions=[f"pool/{i}" for i in range(POOL_SLOTS)],
            managers=[f"m{i}" for i in range(MANAGERS)],
            count=FAULTS,
        )
    ]
    assert {Kind.KILL, Kind.FREEZE} <= {f.kind for f in faults if f.target.startswith(LEADER)}
    assert {Kind.SEPARATE, Kind.ISOLATE} & {f.kind for f in faults}


# The end-of-run checks on made-up deliveries: each catches what it is for ---------------------


ONE = Target(FIFO, 1)


def _delivery(body: str, seq: int, asked_at: float, group: str | None = "g") -> Delivery:
    message = ReceivedMessage(
        queue=QueueName(FIFO),
        id=MessageId(f"id-{body}"),
        seq=seq,
        receipt=Receipt(f"r-{body}-{asked_at}"),
        body=body.encode(),
        is_text=True,
        attributes={},
        group_id=group,
        sent_at=0.0,
        receive_count=1,
        visible_at=0.0,
    )
    return Delivery(body, message, asked_at)


def _sent(*bodies: str) -> dict[str, SendResult]:
    return {body: SendResult(MessageId(f"id-{body}"), seq) for seq, body in enumerate(bodies, 1)}


def test_the_checks_pass_a_clean_run_with_redeliveries() -> None:
    deliveries = [_delivery("a", 1, 1.0), _delivery("a", 1, 6.0), _delivery("b", 2, 7.0)]
    check_deliveries(_sent("a", "b"), {ONE: ["a", "b"]}, {"g": ["a", "b"]}, deliveries, {"a": 6.5, "b": 7.5})


@pytest.mark.parametrize(
    ("deliveries", "acked_at", "error"),
    [
        ([_delivery("a", 1, 1.0)], {}, "never delivered"),
        ([_delivery("b", 2, 1.0), _delivery("a", 1, 2.0)], {}, "out of send order"),
        ([_delivery("a", 1, 1.0), _delivery("b", 3, 2.0)], {}, "another id or seq"),
        (
            [_delivery("a", 1, 1.0), _delivery("b", 2, 2.0), _delivery("a", 1, 3.0)],
            {"a": 1.5},
            "after its ack",
        ),
        ([_delivery("a", 1, 1.0), _delivery("b", 2, 2.0), _delivery("c", 3, 3.0)], {}, "never sent"),
    ],
)
def test_the_checks_catch_what_they_are_for(
    deliveries: list[Delivery], acked_at: dict[str, float], error: str
) -> None:
    with pytest.raises(AssertionError, match=error):
        check_deliveries(_sent("a", "b"), {ONE: ["a", "b"]}, {"g": ["a", "b"]}, deliveries, acked_at)


def test_the_checks_catch_one_seq_acknowledged_twice() -> None:
    sent = {"a": SendResult(MessageId("id-a"), 1), "b": SendResult(MessageId("id-b"), 1)}
    deliveries = [_delivery("a", 1, 1.0), _delivery("b", 1, 2.0)]
    with pytest.raises(AssertionError, match="one seq acknowledged for several sends"):
        check_deliveries(sent, {ONE: ["a", "b"]}, {"g": ["a", "b"]}, deliveries, {})
