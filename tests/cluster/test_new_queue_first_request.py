"""A new queue's first request on its pool partition's leader, whose watch of ``queues/`` is
behind the creating gateway's (real etcd, nodes and manager in this process, real TCP). A
create is a record write, which does not wait for the leader; the first request the leader
answers ``not_leader`` is asked again at once naming the record's revision, and the leader
waits for its watch to bring the record the request names and makes the queue, where
it answered ``not_leader`` and the gateway re-read the map and asked again 25 ms and more
later (issue 49: one create in five at 64 creates at a time). And a GET of one queue asks
etcd nothing: the record comes from the gateway's watched copy, the counts from its
partition; and a GET through a gateway whose watched copy still holds a queue another
gateway deleted answers ``queue_not_found``, not 503 at the request deadline."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from backend_store.attributes import parse_attributes
from backend_store.cluster.client.cluster_backend import ClusterBackend, open_cluster_backend
from backend_store.cluster.client.node_pool import NodePool
from backend_store.cluster.coordination.coordinator import Entry
from backend_store.cluster.coordination.etcd_coordinator import EtcdCoordinator
from backend_store.cluster.coordination.layout import Layout
from backend_store.cluster.manager.manager import Manager
from backend_store.cluster.node.local_ports import local_node
from backend_store.cluster.node.node import Node
from backend_store.cluster.node.node_config import NodeConfig
from backend_store.errors import PushgateError, QueueNotFound
from backend_store.options import StoreOptions
from backend_store.types import NewMessage, QueueName, QueueStats, SendResult, TenantId
from tests.conftest import scaled
from tests.fixtures.etcd_server import unique_prefix
from tests.fixtures.lagging_etcd import LaggingWatch

T = TenantId("acme")
RF2 = {"replication_factor": 2, "replication_mode": "sync"}
LAG_S = 0.5  # how late the nodes' watch of queues/ delivers each state


class CountedReads(EtcdCoordinator):
    """etcd counting reads of one key (linearizable reads, a round trip each)."""

    key_reads = 0

    async def get(self, key: str) -> Entry | None:
        self.key_reads += 1
        return await super().get(key)


@pytest.fixture
async def running(
    etcd_endpoints: list[str], tmp_path: Path
) -> AsyncIterator[tuple[list[Node], ClusterBackend]]:
    layout = Layout(unique_prefix("firstrequest") + "/")
    late = [await LaggingWatch(etcd_endpoints, LAG_S, {layout.queues}).connect() for _ in range(2)]
    nodes: list[Node] = [
        local_node(NodeConfig(f"n{i}", tmp_path / f"n{i}", layout=layout), late[i], sweep_every_s=0)
        for i in range(2)
    ]
    manager_etcd = await EtcdCoordinator(etcd_endpoints).connect()
    manager = Manager(manager_etcd, layout=layout)
    backend = open_cluster_backend(f"cluster://{','.join(etcd_endpoints)}{layout.prefix}", StoreOptions())
    for node in nodes:
        await node.start()
    await manager.start()
    await backend.start()
    try:
        yield nodes, backend
    finally:
        await backend.close()
        await manager.stop()
        for node in nodes:
            await node.stop()
        for coordinator in [*late, manager_etcd]:
            await coordinator.close()


@pytest.fixture
def cluster(running: tuple[list[Node], ClusterBackend]) -> ClusterBackend:
    return running[1]


async def test_a_create_is_a_record_write_and_the_first_send_waits_for_the_leaders_watch(
    running: tuple[list[Node], ClusterBackend], etcd_endpoints: list[str]
) -> None:
    # Issue 49: creating a queue is a metadata write. It returns before the leader of the
    # queue's partition applied it (its watch is LAG_S behind); the first send and receive
    # at once are served, the leader waiting for its watch to bring the record they name
    # (the gateway names it from its own watched copy: no etcd read).
    nodes, backend = running
    await backend.create_queue(T, QueueName("first"), RF2)  # makes the pool
    info, created = await backend.create_queue(T, QueueName("inbox"), RF2)
    assert created and info.stats == QueueStats()
    record = await backend.queue_parts.record(T, QueueName("inbox"))
    assert record.placement is not None
    part = backend.view.map.partitions[record.placement[0]]
    assert part.leader is not None
    [leader] = [node for node in nodes if node.node_id == part.leader.node]
    assert (T, "inbox") not in leader.hosts[part.id].pool_queues.applied  # the create did not wait
    counted, etcd = CountedReads(etcd_endpoints), backend.metadata.coordinator
    await counted.connect()
    try:
        backend.metadata.coordinator = counted  # the etcd the gateway's single reads go to
        [sent] = await backend.send(T, QueueName("inbox"), [NewMessage(b"hello")])
        assert counted.key_reads == 0
    finally:
        backend.metadata.coordinator = etcd
        await counted.close()
    assert isinstance(sent, SendResult)
    assert (T, "inbox") in leader.hosts[part.id].pool_queues.applied
    [got] = await backend.receive(T, QueueName("inbox"), 10)
    assert got.body == b"hello"


async def test_a_new_queues_first_request_waits_for_the_leaders_watch_not_not_leader(
    cluster: ClusterBackend,
) -> None:
    backend = cluster
    await backend.create_queue(T, QueueName("first"), RF2)  # makes the pool, led
    record, created = await backend.metadata.create_queue(
        T,
        QueueName("second"),
        RF2,
        placement=await backend.pool_slots.place(T, QueueName("second"), parse_attributes(RF2)),
    )
    assert created and record.placement is not None
    # At once, as the creating gateway does once its own watch has the record: the leader's
    # watch is LAG_S behind.
    part = backend.view.map.partitions[record.placement[0]]
    assert part.leader is not None
    pool = NodePool("test")
    try:
        client = pool.client(part.leader.node, part.leader.address)
        info, _ = await client.call_with(
            "create_queue",
            part.id,
            part.leader.epoch,
            {"tenant": T, "name": "second", "attributes": {}, "revision": record.mod_revision},
            timeout_s=5,
        )
    finally:
        await pool.close()
    assert info.name == "second"  # made by this request (by its record: `made` says by whom)


async def test_a_send_to_several_queues_serves_those_applied_and_refuses_a_new_one_alone(
    cluster: ClusterBackend,
) -> None:
    # send_queues (send_batcher.py): an entry whose queue the leader has not applied answers
    # not_leader alone, nothing of it written; the others are served at once. The gateway
    # sends that caller again alone, which waits for the queue as a lone send does.
    backend = cluster
    await backend.create_queue(T, QueueName("first"), RF2)  # makes the pool, led
    # A create is a record write: the first request naming the queue has its leader make it.
    await backend.get_queue(T, QueueName("first"))
    record, created = await backend.metadata.create_queue(
        T,
        QueueName("second"),
        RF2,
        placement=await backend.pool_slots.place(T, QueueName("second"), parse_attributes(RF2)),
    )
    assert created and record.placement is not None
    first = await backend.queue_parts.record(T, QueueName("first"))
    assert first.placement == record.placement  # one pool partition: one request may name both
    part = backend.view.map.partitions[record.placement[0]]
    assert part.leader is not None
    pool = NodePool("test")
    try:
        client = pool.client(part.leader.node, part.leader.address)
        sends = [(QueueName("first"), [NewMessage(b"f1")]), (QueueName("second"), [NewMessage(b"s1")])]
        served, refused = await client.call_with(
            "send_queues", part.id, part.leader.epoch, {"tenant": T, "sends": sends}, timeout_s=5
        )
    finally:
        await pool.close()
    assert isinstance(served[0], SendResult)
    assert isinstance(refused, PushgateError) and refused.code == "not_leader", refused
    assert [m.body for m in await backend.peek(T, QueueName("first"), 10)] == [b"f1"]
    # Through the gateway's own path (alone, once the leader's watch has the record).
    [result] = await backend.send(T, QueueName("second"), [NewMessage(b"s2")])
    assert isinstance(result, SendResult)
    assert [m.body for m in await backend.peek(T, QueueName("second"), 10)] == [b"s2"]


async def test_a_get_of_one_queue_asks_etcd_nothing(
    cluster: ClusterBackend, etcd_endpoints: list[str]
) -> None:
    backend = cluster
    await backend.create_queue(T, QueueName("inbox"), RF2)
    counted = CountedReads(etcd_endpoints)
    await counted.connect()
    try:
        backend.metadata.coordinator = counted  # the etcd the gateway's single reads go to
        for _ in range(5):
            info = await backend.get_queue(T, QueueName("inbox"))
            assert info.name == "inbox" and info.stats.visible == 0
        assert counted.key_reads == 0
    finally:
        await counted.close()


async def test_a_get_of_a_queue_another_gateway_deleted_answers_not_found_from_a_stale_copy(
    cluster: ClusterBackend, etcd_endpoints: list[str]
) -> None:
    deleting = cluster
    stale = open_cluster_backend(
        f"cluster://{','.join(etcd_endpoints)}{deleting.paths.prefix}", StoreOptions()
    )
    await stale.start()
    try:
        await deleting.create_queue(T, QueueName("gone"), RF2)
        await stale.get_queue(T, QueueName("gone"))  # in its watched copy now
        await stale.metadata.queues.close()  # its watch stops: the copy keeps the queue
        await deleting.delete_queue(T, QueueName("gone"))
        assert stale.metadata.cached_queue(T, QueueName("gone")) is not None
        # Once the leader's own watch (LAG_S behind) took the deletion, it answers that the
        # queue is not applied: etcd says whether it is gone, where the call asked the
        # leader again until its deadline and answered 503 (unavailable).
        deadline = time.monotonic() + scaled(10)
        while time.monotonic() < deadline:
            try:
                await stale.get_queue(T, QueueName("gone"))
            except PushgateError as exc:
                assert isinstance(exc, QueueNotFound), exc
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the deleted queue still reads as existing")
    finally:
        await stale.close()
