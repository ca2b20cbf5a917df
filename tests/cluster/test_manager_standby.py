"""A standby manager keeps no copy of the queue records (at 10,000 queues that copy cost it
as much CPU a create as the leader's, issue 49), and one that takes over plans on every
record etcd holds, those written while it stood by included: on a real etcd. Which queue
changes wake the leader's plan: on the handler alone."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import cast

from backend_store.cluster.coordination.coordinator import Coordinator, Entry, PrefixState
from backend_store.cluster.coordination.etcd_coordinator import EtcdCoordinator
from backend_store.cluster.coordination.layout import (
    ClusterIdentity,
    Layout,
    NodeRecord,
    PartitionRecord,
    pack,
    unpack,
)
from backend_store.cluster.coordination.pools import POOL_TENANT
from backend_store.cluster.manager.manager import Manager
from tests.conftest import scaled
from tests.fixtures.etcd_server import unique_prefix


async def placed_queues(etcd: EtcdCoordinator, layout: Layout) -> set[str]:
    state = await etcd.read_prefix(layout.partitions)
    return {unpack(e.value)["queue"] for e in state.entries.values()}


async def test_a_standby_that_takes_over_places_the_queues_made_while_it_stood_by(
    etcd_endpoints: list[str],
) -> None:
    layout = Layout(unique_prefix("standby") + "/")
    async with EtcdCoordinator(etcd_endpoints) as etcd:
        await etcd.put(layout.cluster, ClusterIdentity("c1").pack())
        for n in ("n1", "n2", "n3"):
            await etcd.put(layout.node(n), NodeRecord("127.0.0.1:1").pack())
        # The test holds the manager's key: the manager stands by until it lets go.
        holder = await etcd.open_session(2.0)
        assert (await etcd.campaign(holder, layout.manager, b"test")).won
        manager = Manager(etcd, layout=layout, tick_s=0.05)
        await manager.start()
        try:
            # A queue made before pools (no placement): only a leading manager places it.
            await etcd.put(layout.queue("t", "early"), pack({"replication_factor": 3}))
            await asyncio.sleep(scaled(1.0))
            assert not manager.leading.is_set()
            assert manager.view.queues == {}  # not watched while standing by
            assert await placed_queues(etcd, layout) == set()
            await holder.close()  # the key goes with the lease: the manager wins
            await asyncio.wait_for(manager.leading.wait(), scaled(10))
            await etcd.put(layout.queue("t", "late"), pack({"replication_factor": 3}))
            deadline = asyncio.get_running_loop().time() + scaled(10)
            placed: set[str] = set()
            while placed != {"early", "late"} and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.05)
                placed = await placed_queues(etcd, layout)
            assert placed == {"early", "late"}
        finally:
            await manager.stop()


def queue_state(layout: Layout, revision: int, records: Mapping[str, Mapping[str, object]]) -> PrefixState:
    entries = {
        layout.queue("t", name): Entry(layout.queue("t", name), pack(record), revision, revision)
        for name, record in records.items()
    }
    return PrefixState(layout.queues, revision, entries)


def test_a_pool_s_queues_wake_no_plan_unless_a_partition_names_them() -> None:
    manager = Manager(cast(Coordinator, None), manager_id="m1")
    layout = manager.layout
    pooled: dict[str, object] = {"placement": [8]}  # on partition 8, a pool's slot
    assert not manager._on_queues(queue_state(layout, 10, {"a": pooled}))
    # A queue made before pools: its partitions are the plan's.
    assert manager._on_queues(queue_state(layout, 11, {"a": pooled, "old": {}}))
    # A pool's queue under the name of an earlier one that still has a partition: the plan
    # deletes that partition, so it is woken.
    manager.view.partitions = {7: PartitionRecord("t", "gone", 0, ("n1",), "n1")}
    assert manager._on_queues(queue_state(layout, 12, {"a": pooled, "old": {}, "gone": pooled}))
    # Deleting the queue made before pools wakes it too; a pool's slot record does not count.
    manager.view.partitions = {8: PartitionRecord(POOL_TENANT, "default", 0, ("n1",), "n1")}
    assert manager._on_queues(queue_state(layout, 13, {"a": pooled, "gone": pooled}))
    assert not manager._on_queues(queue_state(layout, 14, {"gone": pooled}))
