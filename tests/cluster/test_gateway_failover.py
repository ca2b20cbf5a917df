"""A gateway on ``cluster://`` following a leader failover: real etcd, three real ``pushgate
node`` processes and a manager (their own key prefix in the session's etcd), a real gateway
on an ephemeral port, real HTTP.

Producers send over HTTP, each message with its own dedupe id, retrying a 503 as a client
should; the partition's leader is SIGKILLed mid-stream. Sends resume once the manager has
promoted a follower and the gateway's watch has seen it, and every message the gateway
acknowledged (2xx) is received afterwards (duplicates allowed: at-least-once). And a node
frozen with SIGSTOP holds up only the partitions it leads.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time

import httpx

from backend_store import StoreOptions
from backend_store.cluster.client.cluster_backend import ClusterBackend, open_cluster_backend
from backend_store.cluster.client.routing import partition_index
from backend_store.errors import Unavailable
from backend_store.types import NewMessage, QueueAttributes, QueueName, SendResult, TenantId
from tests.conftest import scaled
from tests.gateway.conftest import RunningGateway

from .processes import ClusterHarness

QUEUE = "orders"


class Producer:
    """Sends numbered messages; each is retried (same dedupe id) until the gateway says 2xx."""

    def __init__(self, client: httpx.AsyncClient, name: str) -> None:
        self.client, self.name = client, name
        self.acked: list[str] = []
        self.acked_at: list[float] = []
        self.stop = asyncio.Event()

    async def run(self) -> None:
        n = 0
        while not self.stop.is_set():
            body = f"{self.name}-{n}"
            while True:
                try:
                    r = await self.client.post(
                        f"/v1/queues/{QUEUE}/messages", json={"body": body, "dedupe_id": body}
                    )
                except httpx.HTTPError:
                    r = None
                if r is not None and r.status_code in (200, 201):
                    break
                assert r is None or r.status_code == 503, r.text
                await asyncio.sleep(0.05)
            self.acked.append(body)
            self.acked_at.append(time.monotonic())
            n += 1


async def test_sends_resume_after_the_leader_is_killed_and_nothing_acknowledged_is_lost(
    harness: ClusterHarness, cluster_gateway: RunningGateway
) -> None:
    headers = {"Authorization": f"Bearer {cluster_gateway.admin_key}"}
    async with httpx.AsyncClient(base_url=cluster_gateway.url, headers=headers, timeout=scaled(30)) as client:
        r = await client.put(
            f"/v1/queues/{QUEUE}", json={"replication_factor": 3, "replication_mode": "sync"}
        )
        assert r.status_code == 201, r.text
        await _cluster_document_and_readiness(
            cluster_gateway, client, await harness.partition_of("default", QUEUE)
        )
        producers = [Producer(client, f"p{i}") for i in range(3)]
        tasks = [asyncio.create_task(p.run()) for p in producers]
        await _until(lambda: sum(len(p.acked) for p in producers) >= 60, "sends before the kill")

        doc = (await client.get("/v1/cluster")).json()
        pid = await harness.partition_of("default", QUEUE)  # the pool partition it is placed on
        [partition] = [p for p in doc["partitions"] if p["id"] == pid]
        old_leader = partition["leader"]
        before = sum(len(p.acked) for p in producers)
        harness.nodes[old_leader].kill()
        killed_at = time.monotonic()
        await _until(lambda: sum(len(p.acked) for p in producers) >= before + 60, "sends after the kill", 30)
        for p in producers:
            p.stop.set()
        await asyncio.gather(*tasks)
        first_after = min(t for p in producers for t in p.acked_at if t > killed_at)
        print(f"first acknowledged send {first_after - killed_at:.2f}s after SIGKILL of the leader")

        doc = (await client.get("/v1/cluster")).json()
        [partition] = [p for p in doc["partitions"] if p["id"] == pid]
        assert partition["leader"] not in (None, old_leader)
        states = {n["id"]: n["state"] for n in doc["nodes"]}
        # Its lease expired with it; while the partition still names it, it is shown down.
        assert states.get(old_leader, "down") == "down"
        assert sorted(s for n, s in states.items() if n != old_leader) == ["up", "up"]

        received: set[str] = set()
        while True:
            r = await client.post(f"/v1/queues/{QUEUE}/receive", json={"max": 100, "wait_s": 0})
            assert r.status_code == 200, r.text
            batch = r.json()["messages"]
            if not batch:
                break
            received.update(m["body"] for m in batch)
        acknowledged = {body for p in producers for body in p.acked}
        assert acknowledged - received == set()


async def _cluster_document_and_readiness(
    gateway: RunningGateway, client: httpx.AsyncClient, pid: int
) -> None:
    """``GET /v1/cluster`` through the real route, for the operator and for another tenant.
    The queue lives on partition ``pid`` of the pool of its class (docs/cluster.md, "Shared
    partitions"), which the operator sees with the pool's other slots."""
    assert (await client.get("/readyz")).status_code == 200
    doc = (await client.get("/v1/cluster")).json()
    assert sorted(n["id"] for n in doc["nodes"]) == ["n0", "n1", "n2"]
    assert all(n["state"] == "up" and n["address"].startswith("127.0.0.1:") for n in doc["nodes"])
    assert {(p["tenant"], p["queue"], p["mode"]) for p in doc["partitions"]} == {("", "rf3-sync", "sync")}
    [partition] = [p for p in doc["partitions"] if p["id"] == pid]
    assert partition["leader"] in ("n0", "n1", "n2") and partition["epoch"] > 0
    assert sorted([partition["leader"], *partition["followers"]]) == ["n0", "n1", "n2"]
    tenant = gateway.make_tenant()
    other = {"Authorization": f"Bearer {gateway.make_key('admin', tenant)}"}
    theirs = (await client.get("/v1/cluster", headers=other)).json()
    assert len(theirs["nodes"]) == 3 and theirs["partitions"] == []
    plain = {"Authorization": f"Bearer {gateway.make_key(f'send:{QUEUE}')}"}
    assert (await client.get("/v1/cluster", headers=plain)).status_code == 403


async def _until(condition: object, what: str, timeout: float = 20) -> None:
    assert callable(condition)
    deadline = time.monotonic() + scaled(timeout)
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


async def test_a_frozen_node_stalls_only_the_partitions_it_leads(harness: ClusterHarness) -> None:
    """One node SIGSTOPped: sends to partitions led elsewhere carry on while its own wait."""
    # Deadlines of seconds: the free partition's send is an fsync on a disk that may be busy;
    # the frozen one's send waits out the whole deadline (its only replica is stopped).
    url = f"cluster://{','.join(harness.endpoints)}{harness.prefix}?node_timeout_s=5&request_deadline_s=20"
    backend = open_cluster_backend(url, StoreOptions())
    await backend.start()
    frozen: str | None = None
    try:
        tenant, queue = TenantId("acme"), QueueName("spread")
        assert await backend.view.wait_for(lambda m: len(m.nodes) == 3, scaled(20)), "nodes did not register"
        # One replica each, so the manager spreads the partitions (and their leaders) over
        # the nodes; with three replicas on three nodes it may make one node lead them all.
        await backend.create_queue(tenant, queue, {"partitions": 3, "replication_factor": 1})
        parts = backend.queue_parts.parts(await backend.metadata.queue(tenant, queue))
        leaders = {p.index: p.leader.node for p in parts if p.leader is not None}
        assert len(set(leaders.values())) >= 2, f"the manager put every leader on one node: {leaders}"
        stuck_index = 0
        frozen = leaders[stuck_index]
        free_index = next(i for i, node in leaders.items() if node != frozen)
        attrs = (await backend.metadata.queue(tenant, queue)).attributes
        keyed = {i: _dedupe_id_for(i, attrs) for i in (stuck_index, free_index)}
        harness.nodes[frozen].signal(signal.SIGSTOP)
        stuck = asyncio.ensure_future(
            backend.send(tenant, queue, [NewMessage(b"a", dedupe_id=keyed[stuck_index])])
        )
        started = time.monotonic()
        [free] = await backend.send(tenant, queue, [NewMessage(b"b", dedupe_id=keyed[free_index])])
        assert isinstance(free, SendResult), free
        print(f"a send to a partition led elsewhere took {time.monotonic() - started:.3f}s")
        assert not stuck.done()  # still waiting for the frozen node (or its successor)
        # Its lease expires; with one replica nobody can be promoted: the backend is not
        # ready (what /readyz answers 503 with), naming the leaderless partition.
        pool_part = backend.view.map.partitions[parts[stuck_index].id]  # as check_writable names it
        await _until_unready(backend, f"{pool_part.queue}[{pool_part.index}]")
        harness.nodes[frozen].signal(signal.SIGCONT)
        frozen = None
        # Its own send ends: served once the node runs again, or 503 if it gave up first.
        with contextlib.suppress(Unavailable):
            await asyncio.wait_for(stuck, scaled(30))
        # Back: it campaigns again and the backend is ready again.
        deadline = time.monotonic() + scaled(20)
        while True:
            try:
                await backend.check_writable()
                break
            except Unavailable:
                assert time.monotonic() < deadline, "the frozen node's partition never got its leader back"
                await asyncio.sleep(0.1)
    finally:
        if frozen is not None:
            harness.nodes[frozen].signal(signal.SIGCONT)
        await backend.close()


async def _until_unready(backend: ClusterBackend, partition: str) -> None:
    deadline = time.monotonic() + scaled(20)
    while True:
        try:
            await backend.check_writable()
        except Unavailable as exc:
            assert "no leader" in exc.detail and partition in exc.detail, exc.detail
            return
        assert time.monotonic() < deadline, "a leaderless partition left the backend ready"
        await asyncio.sleep(0.1)


def _dedupe_id_for(index: int, attributes: QueueAttributes) -> str:
    """A dedupe id that routes a send to partition ``index``."""
    for n in range(10_000):
        candidate = f"k{n}"
        if partition_index(NewMessage(b"", dedupe_id=candidate), attributes, 0) == index:
            return candidate
    raise AssertionError("no dedupe id found for the partition")
