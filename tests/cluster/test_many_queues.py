"""Many queues on shared partitions, end to end (docs/cluster.md, "Shared partitions"): real
etcd, three real ``pushgate node`` processes and a manager, a real gateway on ``cluster://``,
real HTTP.

Sixty queues are created, each sent to and received from, listed in pages with their counts,
deleted, and created again empty, while the cluster keeps the pool's partitions, one per
node, and makes none per queue. A dead-letter queue on the pool gets the poison message of
a queue feeding it and hands it out with a receipt that acks. And a queue record written as before
pools (no placement) keeps its own partition and serves beside them (the upgrade in place).
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from backend_store.cluster.coordination import pools
from tests.conftest import scaled
from tests.gateway.conftest import RunningGateway

from .processes import ClusterHarness

COUNT = 60
RF3 = {"replication_factor": 3, "replication_mode": "sync"}
POOL = pools.pool_name(3, "sync")


def names() -> list[str]:
    return [f"inbox-{i:03d}" for i in range(COUNT)]


async def each(calls: list[Any]) -> list[httpx.Response]:
    """Run requests a few at a time (one gateway, two cores: no stampede)."""
    gate = asyncio.Semaphore(8)

    async def one(call: Any) -> httpx.Response:
        async with gate:
            response: httpx.Response = await call
            return response

    return list(await asyncio.gather(*(one(c) for c in calls)))


async def walk(client: httpx.AsyncClient, limit: int) -> list[dict[str, Any]]:
    """Every queue, page by page with the cursor."""
    out: list[dict[str, Any]] = []
    params = {"limit": str(limit)}
    while True:
        r = await client.get("/v1/queues", params=params)
        assert r.status_code == 200, r.text
        doc = r.json()
        assert len(doc["queues"]) <= limit
        out.extend(doc["queues"])
        if "next_cursor" not in doc:
            return out
        params = {"limit": str(limit), "cursor": doc["next_cursor"]}


async def test_sixty_queues_share_the_pool_through_create_send_list_delete_and_again(
    harness: ClusterHarness, cluster_gateway: RunningGateway
) -> None:
    headers = {"Authorization": f"Bearer {cluster_gateway.admin_key}"}
    async with httpx.AsyncClient(base_url=cluster_gateway.url, headers=headers, timeout=scaled(60)) as client:
        created = await each([client.put(f"/v1/queues/{n}", json=RF3) for n in names()])
        assert [r.status_code for r in created] == [201] * COUNT, [
            r.text for r in created if r.status_code != 201
        ]
        # The pool's slots and nothing per queue: no partition names a queue of this tenant.
        partitions = await harness.partitions()
        assert {(p.tenant, p.queue) for p in partitions.values()} == {(pools.POOL_TENANT, POOL)}
        assert len(partitions) == len(harness.nodes)  # one slot per node (the default)
        placed = {await harness.partition_of("default", n) for n in names()}
        assert len(placed) > 1 and placed <= set(partitions)  # spread over the pool

        sent = await each(
            [
                client.post(
                    f"/v1/queues/{n}/messages", json={"messages": [{"body": f"{n}-a"}, {"body": f"{n}-b"}]}
                )
                for n in names()
            ]
        )
        assert all(r.status_code == 200 for r in sent), [r.text for r in sent if r.status_code != 200]
        got = await each([client.post(f"/v1/queues/{n}/receive", json={"max": 1}) for n in names()])
        for name, r in zip(names(), got, strict=True):
            assert r.status_code == 200, r.text
            [message] = r.json()["messages"]
            assert message["body"] in (f"{name}-a", f"{name}-b")  # its own queue's, nobody else's
        acked = await each(
            [
                client.post(f"/v1/queues/{n}/ack", json={"receipts": [r.json()["messages"][0]["receipt"]]})
                for n, r in zip(names(), got, strict=True)
            ]
        )
        assert all(r.json()["acked"] == 1 for r in acked), [r.text for r in acked]
        # A receipt of one queue is refused for another on the same gateway.
        other = await client.post(
            f"/v1/queues/{names()[1]}/ack", json={"receipts": [got[0].json()["messages"][0]["receipt"]]}
        )
        assert other.json()["acked"] == 0

        # Pages of 25 (a request per pool partition each), with each queue's counts.
        listed = await walk(client, 25)
        assert [q["name"] for q in listed] == names()
        assert {
            (q["stats"]["visible"], q["stats"]["sent_total"], q["stats"]["acked_total"]) for q in listed
        } == {(1, 2, 1)}
        whole = (await client.get("/v1/queues")).json()
        assert set(whole) == {"queues"} and [q["name"] for q in whole["queues"]] == names()

        deleted = await each([client.delete(f"/v1/queues/{n}") for n in names()])
        assert [r.status_code for r in deleted] == [204] * COUNT
        assert (await client.get("/v1/queues")).json() == {"queues": []}
        gone = await client.post(f"/v1/queues/{names()[0]}/messages", json={"body": "x"})
        assert gone.status_code == 404 and gone.json()["code"] == "queue_not_found"

        again = await each([client.put(f"/v1/queues/{n}", json=RF3) for n in names()])
        assert [r.status_code for r in again] == [201] * COUNT
        empty = await each([client.post(f"/v1/queues/{n}/receive", json={"max": 10}) for n in names()])
        assert [r.json()["messages"] for r in empty] == [[]] * COUNT
        assert {q["stats"]["visible"] for q in await walk(client, 1000)} == {0}
        assert len(await harness.partitions()) == len(harness.nodes)


async def test_a_dead_letter_queue_on_the_pool_and_a_queue_made_before_pools(
    harness: ClusterHarness, cluster_gateway: RunningGateway
) -> None:
    headers = {"Authorization": f"Bearer {cluster_gateway.admin_key}"}
    async with httpx.AsyncClient(base_url=cluster_gateway.url, headers=headers, timeout=scaled(60)) as client:
        assert (await client.put("/v1/queues/dead", json=RF3)).status_code == 201
        # Sources placed apart from their dead-letter queue (names hash to other slots).
        sources = [f"jobs-{i}" for i in range(4)]
        for name in sources:
            r = await client.put(
                f"/v1/queues/{name}",
                json={**RF3, "max_receives": 1, "dead_letter_queue": "dead", "visibility_timeout_s": 1},
            )
            assert r.status_code == 201, r.text
        homes = {await harness.partition_of("default", n) for n in [*sources, "dead"]}
        assert len(homes) > 1
        for name in sources:
            assert (
                await client.post(f"/v1/queues/{name}/messages", json={"body": f"poison {name}"})
            ).status_code == 201
            [first] = (await client.post(f"/v1/queues/{name}/receive", json={"max": 1})).json()["messages"]
            nacked = await client.post(f"/v1/queues/{name}/nack", json={"receipts": [first["receipt"]]})
            assert nacked.json()["nacked"] == 1
            # The next receive moves it (past max_receives) to the dead-letter queue.
            assert (await client.post(f"/v1/queues/{name}/receive", json={"max": 1})).json()["messages"] == []
        dead = (await client.get("/v1/queues/dead")).json()
        assert dead["stats"]["visible"] == len(sources)
        listed = {q["name"]: q["stats"]["visible"] for q in (await client.get("/v1/queues")).json()["queues"]}
        assert listed["dead"] == len(sources) and all(listed[n] == 0 for n in sources)
        r = await client.post("/v1/queues/dead/receive", json={"max": 10})
        letters = r.json()["messages"]
        assert sorted(m["body"] for m in letters) == sorted(f"poison {n}" for n in sources)
        acked = await client.post("/v1/queues/dead/ack", json={"receipts": [m["receipt"] for m in letters]})
        assert acked.json() == {"acked": len(sources), "failed": []}
        assert (await client.get("/v1/queues/dead")).json()["stats"]["visible"] == 0

        # A record as a gateway wrote it before pools: its own partition, served as before.
        await harness.create_queue("default", "legacy", {"replication_factor": 3})
        own = await harness.partition_of("default", "legacy")
        assert (await harness.partitions())[own].pool is None
        deadline = asyncio.get_running_loop().time() + scaled(30)
        while True:
            r = await client.post("/v1/queues/legacy/messages", json={"body": "old style"})
            if r.status_code == 201 or asyncio.get_running_loop().time() > deadline:
                break
            await asyncio.sleep(0.1)
        assert r.status_code == 201, r.text
        [m] = (await client.post("/v1/queues/legacy/receive", json={"max": 5})).json()["messages"]
        assert m["body"] == "old style"
        names_now = [q["name"] for q in (await client.get("/v1/queues")).json()["queues"]]
        assert "legacy" in names_now and "dead" in names_now
        assert (await client.delete("/v1/queues/legacy")).status_code == 204
        await harness.wait_for("the legacy queue's own partition dropped", _dropped(harness, own))


def _dropped(harness: ClusterHarness, pid: int) -> Any:
    async def check() -> bool:
        return pid not in await harness.partitions()

    return check
