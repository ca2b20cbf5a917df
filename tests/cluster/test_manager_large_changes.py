"""A manager's change larger than one etcd transaction may hold (``--max-txn-ops``, 128 by
default) is committed a bounded part at a time, each part whole partitions (plan.bounded):
on a real etcd, and on the plan alone."""

from __future__ import annotations

import asyncio

from backend_store.cluster.coordination.etcd_coordinator import EtcdCoordinator
from backend_store.cluster.coordination.layout import ClusterIdentity, Layout, NodeRecord, pack, unpack
from backend_store.cluster.manager.manager import Manager
from backend_store.cluster.manager.plan import ClusterView, Plan, bounded, plan
from tests.conftest import scaled
from tests.fixtures.etcd_server import unique_prefix

from .plan_runs import Run

QUEUES = 300  # each made before pools, with its own partition: 300 records to write at once


def legacy_queues() -> dict[tuple[str, str], dict[str, object]]:
    return {("t", f"q{i:03d}"): {"replication_factor": 3} for i in range(QUEUES)}


def ops(change: Plan) -> int:
    return len(change.puts) + len(change.deletes) + len(change.tombstones) + len(change.tombstone_deletes) + 1


def test_a_change_past_one_transaction_is_made_a_bounded_part_at_a_time_whole_partitions() -> None:
    view = ClusterView()
    view.queues = legacy_queues()
    view.nodes = {n: NodeRecord("127.0.0.1:1") for n in ("n1", "n2", "n3")}
    run = Run(view)
    whole = run.plan()
    assert len(whole.puts) == QUEUES  # one change: past etcd's limit
    parts = []
    while not (part := bounded(run.plan(), 128)).empty:
        assert ops(part) <= 128
        parts.append(part)
        view.partitions.update(part.puts)
        view.counter = part.counter
    assert len(parts) == 3
    placed = sorted((r.tenant, r.queue, r.index) for r in view.partitions.values())
    assert placed == sorted((t, q, 0) for t, q in legacy_queues())  # each once, none twice
    # Deleting them all: each partition's deletion goes with its own tombstones.
    strays = {
        n: NodeRecord("127.0.0.1:1", strays={pid: "kept" for pid in view.partitions}) for n in view.nodes
    }
    view.queues, view.nodes = {}, strays
    change = plan(view, now=run.now)
    part = bounded(change, 128)
    assert ops(part) <= 128 and part.deletes
    for pid in part.deletes:
        assert {k for k in change.tombstones if k[0] == pid} <= set(part.tombstones)
    assert {k[0] for k in part.tombstones} <= set(part.deletes)


async def test_the_manager_places_hundreds_of_queues_made_before_pools_at_once(
    etcd_endpoints: list[str],
) -> None:
    # Three nodes registered and 300 queue records without placement in etcd when the manager
    # starts: its first plan makes 300 partitions. In one transaction etcd refused it every
    # tick ("too many operations in txn request"), and no queue got a partition.
    layout = Layout(unique_prefix("txn-ops") + "/")
    async with EtcdCoordinator(etcd_endpoints) as etcd:
        await etcd.put(layout.cluster, ClusterIdentity("c1").pack())
        for n in ("n1", "n2", "n3"):
            await etcd.put(layout.node(n), NodeRecord("127.0.0.1:1").pack())
        for (tenant, queue), record in legacy_queues().items():
            await etcd.put(layout.queue(tenant, queue), pack(record))
        manager = Manager(etcd, layout=layout, tick_s=0.05)
        await manager.start()
        try:
            deadline = asyncio.get_running_loop().time() + scaled(30)
            placed: set[str] = set()
            while len(placed) < QUEUES and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.1)
                state = await etcd.read_prefix(layout.partitions)
                placed = {unpack(e.value)["queue"] for e in state.entries.values()}
            assert len(placed) == QUEUES
        finally:
            await manager.stop()
