"""Dead replicas are replaced (issue 24, defect 8), and ``GET /v1/cluster`` says so: real
etcd, four real ``pushgate node`` processes behind proxies, a manager run with
``--replace-after 3``, a real gateway on ``cluster://`` in front.

A follower of an RF 3 partition is killed and stays dead. After the delay the manager adds
the spare node as a learner (held cut off here, so the step stays visible) and marks the dead
replica leaving; ``/v1/cluster`` shows both. Once the spare is let through it catches up,
votes, and the dead replica leaves the set: the partition is three live replicas again,
with every acknowledged send.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import scaled
from tests.fixtures.etcd_server import unique_prefix

from .conftest import running_cluster_gateway
from .processes import ClusterHarness, ClusterProcess
from .workload import RF3_SYNC, Producers, Q, T, check_acknowledged_in_place, has_replicas


@pytest.fixture
async def harness(etcd_endpoints: list[str], tmp_path: Path) -> AsyncIterator[ClusterHarness]:
    h = ClusterHarness(etcd_endpoints, tmp_path, unique_prefix("replacement") + "/")
    try:
        yield h
    finally:
        await h.close()


async def _partition_doc(client: httpx.AsyncClient, queue: str) -> dict[str, Any] | None:
    r = await client.get("/v1/cluster")
    assert r.status_code == 200, r.text
    return next((p for p in r.json()["partitions"] if p["queue"] == queue), None)


async def test_a_dead_replica_is_replaced_after_the_delay_and_the_cluster_document_shows_it(
    harness: ClusterHarness, tmp_path: Path
) -> None:
    h = await harness.start(nodes=4, managers=0, proxied=True)
    assert h.network is not None
    argv = ["manager", "--etcd", ",".join(h.endpoints), "--id", "m0", "--prefix", h.prefix]
    argv += ["--lease-ttl", str(h.lease_ttl), "--log-level", "info", "--replace-after", "3"]
    manager = ClusterProcess("m0", argv, h.root / "m0.log")
    h.managers.append(manager)
    manager.start()
    with running_cluster_gateway(h, tmp_path / "gateway") as gateway:
        headers = {"Authorization": f"Bearer {gateway.admin_key}"}
        async with httpx.AsyncClient(base_url=gateway.url, headers=headers, timeout=scaled(30)) as client:
            await h.create_queue(T, Q, RF3_SYNC)  # the operator's document lists every tenant's
            pid = await h.partition_of(T, Q)
            await h.wait_for("three replicas", lambda: has_replicas(h, pid, 3))
            leader, _, _ = await h.serving_leader(pid)
            record = (await h.partitions())[pid]
            dead = next(n for n in record.replicas if n != leader)
            spare = next(n for n in h.nodes if n not in record.replicas)
            producers = Producers(h, pid)
            producers.start()
            await producers.more(20, "sends before the kill")
            h.network.separate(spare)  # the learner can catch up with nothing for now
            h.nodes[dead].kill()
            killed = time.monotonic()

            async def replacing() -> dict[str, Any] | None:
                doc = await _partition_doc(client, Q)
                return doc if doc is not None and doc["leaving"] == [dead] else None

            doc = await h.wait_for("the cluster document to show the replacement", replacing)
            assert time.monotonic() - killed >= 3.0  # not before the delay
            assert doc["learners"] == [spare] and dead in doc["followers"]
            states = {n["id"]: n["state"] for n in (await client.get("/v1/cluster")).json()["nodes"]}
            assert states[dead] == "down" and states[spare] == "up"
            await producers.more(20, "sends while the learner is cut off (it counts in no majority)")
            h.network.heal()

            async def replaced() -> bool:
                now = (await h.partitions())[pid]
                return (
                    set(now.replicas) == set(record.replicas) - {dead} | {spare}
                    and not now.learners
                    and not now.leaving
                )

            await h.wait_for("the spare to replace the dead replica", replaced, timeout=60)
            await producers.more(20, "sends after the replacement")
            await producers.stop()
            doc = await _partition_doc(client, Q)
            assert doc is not None and doc["learners"] == [] and doc["leaving"] == []
            assert sorted([doc["leader"], *doc["followers"]]) == sorted(
                set(record.replicas) - {dead} | {spare}
            )
            log = await h.read_log(pid, T, Q)
            producers.check([m.body.decode() for m in log])
            check_acknowledged_in_place(producers.results, log)
