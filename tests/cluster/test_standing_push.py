"""Standing receives through a real gateway on ``cluster://``: a send reaches an idle
WebSocket subscriber in the commit that stores it.

Two nodes and a manager run in this process (real etcd, real TCP), so the test can look into
the partition stores; the gateway is a real one (uvicorn on an ephemeral port, its own
thread and loop) and the subscriber a real WebSocket client. What is checked is the log: with
the dispatcher's demand registered on the leader, each message costs the partition one log
entry (the send, with the receive in the same commit) where a wake-up followed by a receive
request costs two. No timing is asserted.
"""

from __future__ import annotations

import asyncio
import time

import httpx

from backend_store.cluster.client.cluster_backend import ClusterBackend
from backend_store.cluster.client.routing import stable_hash
from backend_store.cluster.coordination.layout import Layout
from backend_store.cluster.node.node import Node
from backend_store.cluster.node.partition_host import PartitionHost
from backend_store.lmdb_store.engine import LmdbBackend
from backend_store.types import QueueName, TenantId
from tests.conftest import scaled
from tests.gateway.conftest import RunningGateway
from tests.push.conftest import Http, deliveries, request, ws_connect

from .placed import leading_hosts


def lmdb(host: PartitionHost) -> LmdbBackend:
    store = host.store
    assert isinstance(store, LmdbBackend)
    return store


TENANT = "default"


async def until(what: str, check: object, timeout: float = 20) -> None:
    assert callable(check)
    deadline = time.monotonic() + scaled(timeout)
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


def leaders(nodes: list[Node], gateway: RunningGateway, queue: str) -> dict[int, tuple[Node, PartitionHost]]:
    """The partitions of ``queue`` this process leads, by partition index (its placement as
    the gateway, which created it, holds its record)."""
    backend = gateway.services.backend
    assert isinstance(backend, ClusterBackend)
    record = backend.metadata.cached_queue(TenantId(TENANT), QueueName(queue))
    assert record is not None
    return leading_hosts(nodes, TENANT, queue, record.placement)


def waiting(found: dict[int, tuple[Node, PartitionHost]], queue: str) -> bool:
    return all(node.demands.waiting(host.partition, TENANT, queue) for node, host in found.values())


async def test_a_send_reaches_an_idle_subscriber_in_the_commit_that_stores_it(
    inprocess_nodes: tuple[Layout, list[Node]], inprocess_gateway: RunningGateway
) -> None:
    _, running = inprocess_nodes
    gateway = inprocess_gateway
    headers = {"Authorization": f"Bearer {gateway.admin_key}"}
    async with httpx.AsyncClient(base_url=gateway.url, headers=headers, timeout=scaled(30)) as client:
        http = Http(client)
        await http.queue("jobs", replication_factor=2, replication_mode="sync")
        found = leaders(running, gateway, "jobs")
        assert len(found) == 1
        [(leader, host)] = found.values()
        follower = next(n for n in running if n is not leader).hosts[host.partition]
        async with ws_connect(gateway, gateway.admin_key) as ws:
            reply = await request(ws, op="subscribe", queue="jobs", id="sub", prefetch=10)
            assert reply["op"] == "ok"
            # Once the dispatcher idles (its first receive found nothing), with its demand
            # on the leader.
            await until("the dispatcher's demand", lambda: waiting(found, "jobs"))
            before, delivered = host.store.last_lsn, leader.demands.delivered
            operations = lmdb(host).stats["operations"]
            for i in range(3):
                await until("the dispatcher's demand", lambda: waiting(found, "jobs"))
                sent = await http.send("jobs", f"m{i}")
                [message] = await deliveries(ws, 1)
                assert (message["id"], message["body"], message["receive_count"]) == (sent["id"], f"m{i}", 1)
            # One log entry per message: each receive rode in its send's commit, and was
            # pushed to the gateway by the node (no receive request).
            assert host.store.last_lsn - before == 3
            assert leader.demands.delivered - delivered == 3
            # Nor did the dispatcher wake before its delivery and ask for more (the node sent
            # it no Notify for those commits): three sends were all the store did.
            assert lmdb(host).stats["operations"] - operations == 3
            # Replicated before it was pushed (sync, RF 2: the follower holds it).
            assert follower.store.last_lsn >= host.store.last_lsn
            stats = await http.stats("jobs")
            assert (stats["visible"], stats["in_flight"]) == (0, 3)
            reply = await request(ws, op="ack", receipts=[message["receipt"]], id=1)
            assert reply["acked"] == 1


async def test_each_partition_serves_the_demand_and_late_deliveries_still_arrive(
    inprocess_nodes: tuple[Layout, list[Node]], inprocess_gateway: RunningGateway
) -> None:
    _, running = inprocess_nodes
    gateway = inprocess_gateway
    headers = {"Authorization": f"Bearer {gateway.admin_key}"}
    async with httpx.AsyncClient(base_url=gateway.url, headers=headers, timeout=scaled(30)) as client:
        http = Http(client)
        await http.queue("spread", partitions=2, replication_factor=1)
        found = leaders(running, gateway, "spread")
        assert sorted(found) == [0, 1]
        # Dedupe ids that land on partition 0 and 1 (crc32 % 2).
        ids = {stable_hash(f"d{i}") % 2: f"d{i}" for i in range(10)}
        async with ws_connect(gateway, gateway.admin_key) as ws:
            reply = await request(ws, op="subscribe", queue="spread", id="sub", prefetch=10)
            assert reply["op"] == "ok"
            # Once the dispatcher received from both partitions (its demand waits there):
            # a create is a record write, and that first receive is what made the queue
            # on each leader (a log entry of its own, not a send's).
            await until("the demand on both partitions", lambda: waiting(found, "spread"))
            before = {index: host.store.last_lsn for index, (_, host) in found.items()}
            for index in (0, 1):
                await until("the demand on both partitions", lambda: waiting(found, "spread"))
                await http.send("spread", f"to-{index}", dedupe_id=f"{ids[index]}-one")
            # Both partitions at once: the first delivery wakes the dispatcher, the other
            # may come for a withdrawn registration and still reaches the subscriber.
            await until("the demand on both partitions", lambda: waiting(found, "spread"))
            batch = [{"body": f"both-{i}", "dedupe_id": f"{ids[i]}-two"} for i in (0, 1)]
            response = await client.post("/v1/queues/spread/messages", json={"messages": batch})
            assert response.status_code == 200, response.text
            got = await deliveries(ws, 4)
            assert sorted(m["body"] for m in got) == ["both-0", "both-1", "to-0", "to-1"]
            # Two messages per partition, one log entry each: every receive rode in a send.
            after = {index: host.store.last_lsn for index, (_, host) in found.items()}
            assert {index: after[index] - before[index] for index in found} == {0: 2, 1: 2}


async def test_a_lost_connection_makes_the_dispatcher_register_again_at_once(
    inprocess_nodes: tuple[Layout, list[Node]], inprocess_gateway: RunningGateway
) -> None:
    _, running = inprocess_nodes
    gateway = inprocess_gateway
    headers = {"Authorization": f"Bearer {gateway.admin_key}"}
    async with httpx.AsyncClient(base_url=gateway.url, headers=headers, timeout=scaled(30)) as client:
        http = Http(client)
        await http.queue("jobs", replication_factor=1)
        found = leaders(running, gateway, "jobs")
        [(leader, host)] = found.values()
        async with ws_connect(gateway, gateway.admin_key) as ws:
            reply = await request(ws, op="subscribe", queue="jobs", id="sub", prefetch=10)
            assert reply["op"] == "ok"
            await until("the dispatcher's demand", lambda: waiting(found, "jobs"))
            # The node drops the gateway's connections: their demands go with them.
            for stream in list(leader._clients):
                await stream.close()
            assert not waiting(found, "jobs")
            # The gateway hears of it and its dispatcher registers again (over a new
            # connection) without waiting for its safety poll (600 s here).
            await until("the demand registered again", lambda: waiting(found, "jobs"))
            before = host.store.last_lsn
            await http.send("jobs", "after")
            [message] = await deliveries(ws, 1)
            assert message["body"] == "after"
            assert host.store.last_lsn - before == 1
