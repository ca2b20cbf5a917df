"""Nodes and a manager in this process (real etcd, real TCP), where a test can look inside
their stores: only the leader sweeps (retention, dedupe expiry), and its deletions reach the
followers through the log, so replicas stay equal."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from backend_store.cluster.client.node_pool import NodeClient, NodePool
from backend_store.cluster.coordination.etcd_coordinator import EtcdCoordinator
from backend_store.cluster.coordination.layout import Layout, LeaderRecord, pack
from backend_store.cluster.manager.manager import Manager
from backend_store.cluster.node.node import Node
from backend_store.cluster.node.partition_host import PartitionHost
from backend_store.cluster.protocol.ops import NotLeader
from backend_store.errors import PushgateError, Unavailable
from backend_store.lmdb_store.engine import LmdbBackend
from backend_store.lmdb_store.environment import Db
from backend_store.types import Epoch, NewMessage, QueueName, TenantId
from tests.cluster.test_replication import contents
from tests.conftest import scaled
from tests.fixtures.etcd_server import unique_prefix

T = TenantId("tenant-one")
Q = QueueName("orders")


@pytest.fixture
async def cluster(
    etcd_endpoints: list[str], tmp_path: Path
) -> AsyncIterator[tuple[Layout, list[Node], NodePool]]:
    layout = Layout(unique_prefix("inprocess") + "/")
    coordinators = [await EtcdCoordinator(etcd_endpoints).connect() for _ in range(3)]
    nodes = [
        Node(f"n{i}", tmp_path / f"n{i}", coordinators[i], layout=layout, sweep_every_s=0.2) for i in range(2)
    ]
    manager = Manager(coordinators[2], layout=layout)
    pool = NodePool("test")
    for node in nodes:
        await node.start()
    await manager.start()
    try:
        yield layout, nodes, pool
    finally:
        await pool.close()
        await manager.stop()
        for node in nodes:
            await node.stop()
        for coordinator in coordinators:
            await coordinator.close()


async def until(what: str, check: object, timeout: float = 15) -> None:
    assert callable(check)
    deadline = time.monotonic() + scaled(timeout)
    while not await check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


@dataclass
class Led:
    """Partition 1 of queue Q, served: a client on its leader, the term, both replicas."""

    client: NodeClient
    epoch: Epoch
    leader: PartitionHost
    follower: PartitionHost


async def first_send(
    cluster: tuple[Layout, list[Node], NodePool], attributes: dict[str, Any], messages: list[NewMessage]
) -> Led:
    """Create Q with ``attributes``, wait for its leader and replicas, send ``messages`` there."""
    layout, nodes, pool = cluster
    coordinator = nodes[0].coordinator
    await coordinator.put(layout.queue(T, Q), pack(attributes))

    async def leader_known() -> bool:
        return await coordinator.get(layout.leader(1)) is not None and all(1 in n.hosts for n in nodes)

    await until("a leader and two replicas", leader_known)
    entry = await coordinator.get(layout.leader(1))
    assert entry is not None
    record = LeaderRecord.unpack(entry.value)
    host = next(n for n in nodes if n.node_id == record.node).hosts[1]

    async def both_vote() -> bool:
        # A node placed after the first one joins as a learner, which a commit does not
        # wait for: only once the leader counts by both voters does a follower's refusal
        # reach a write.
        return len((await host.position(0)).voters) == len(nodes)

    await until("both replicas voting", both_vote)
    client = pool.client(record.node, record.address)
    epoch = record.epoch(entry.create_revision)

    async def sent() -> bool:
        try:
            await client.call("send", 1, epoch, tenant=T, queue=Q, messages=messages)
        except PushgateError:  # not ready yet (the queue's attributes on their way)
            return False
        return True

    await until("the first send", sent)
    leader = next(n for n in nodes if n.node_id == record.node).hosts[1]
    follower = next(n for n in nodes if n.node_id != record.node).hosts[1]
    return Led(client, epoch, leader, follower)


async def test_only_the_leader_sweeps_and_replicas_stay_equal(
    cluster: tuple[Layout, list[Node], NodePool],
) -> None:
    messages = [NewMessage(f"m{i}".encode(), dedupe_id=f"d{i}") for i in range(5)]
    led = await first_send(cluster, {"replication_factor": 2, "dedupe_window_s": 1}, messages)
    leader, follower = led.leader, led.follower

    async def dedupe_entries(node_store: LmdbBackend) -> int:
        return len((await contents(node_store))[Db.DEDUPE.name])

    assert await dedupe_entries(leader.store) == 5

    # After the 1 s window the leader's sweep drops them, and the follower drops them by
    # applying the leader's entry (it never sweeps itself: its LSNs stay the leader's).
    async def swept_everywhere() -> bool:
        return (
            await dedupe_entries(leader.store) == 0
            and await dedupe_entries(follower.store) == 0
            and follower.store.last_lsn == leader.store.last_lsn
        )

    await until("the sweep to reach both replicas", swept_everywhere)
    assert await contents(follower.store) == await contents(leader.store)
    assert follower.store.options.sweep_interval_s == 0


async def test_a_write_cut_off_by_a_deposition_is_answered_as_outcome_unknown(
    cluster: tuple[Layout, list[Node], NodePool],
) -> None:
    # The leader wrote it to its own log but learned of a newer term before a majority held
    # it. "not_leader" would tell the gateway nothing was applied, and it retries any
    # request after not_leader; this one may have been applied (the leader's log has it, and
    # a follower might), so the answer must be "unavailable": retried only when that is safe.
    led = await first_send(cluster, {"replication_factor": 2}, [NewMessage(b"first")])
    leader, follower, client, epoch = led.leader, led.follower, led.client, led.epoch
    # A newer term began elsewhere and reached the follower's storage, not the leader yet.
    await follower.store.raise_epoch(Epoch(epoch + 1000))
    before = leader.store.last_lsn

    with pytest.raises(Unavailable) as raised:
        await client.call("send", 1, epoch, tenant=T, queue=Q, messages=[NewMessage(b"cut off")])
    assert not isinstance(raised.value, NotLeader), "not_leader promises nothing was applied"
    assert raised.value.code == "unavailable"
    assert leader.store.last_lsn > before, "the write is in the deposed leader's log"
