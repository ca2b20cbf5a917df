"""Storage use on a cluster, end to end: three real ``pushgate node`` processes publish their
disk and map use in their etcd records; a real gateway on ``cluster://`` shows it per node in
``GET /v1/cluster``, on the console's nodes page and in ``/metrics``, and the ``map_use``
alert watches the fullest partition environment (docs/cluster.md, "Storage use")."""

from __future__ import annotations

import asyncio
import os
import random
import string
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from backend_store.cluster.coordination.layout import NodeRecord
from backend_store.cluster.coordination.storage_record import summarise
from backend_store.types import StorageUsage
from tests.conftest import scaled
from tests.console.conftest import scrape
from tests.console.test_console_http import logged_in
from tests.gateway.conftest import RunningGateway

from .conftest import running_cluster_gateway
from .processes import ClusterHarness

QUEUE = "big"
BODY_CHARS = 200_000
MESSAGES = 5
MIB = 1 << 20


@pytest.fixture
def cluster_gateway(harness: ClusterHarness, tmp_path: Path) -> Iterator[RunningGateway]:
    # Samples often: the test waits for the console's figures and an alert.
    with running_cluster_gateway(harness, tmp_path / "gateway", monitor_interval_s=0.2) as running:
        yield running


async def test_each_node_publishes_its_storage_use(
    harness: ClusterHarness, cluster_gateway: RunningGateway, tmp_path: Path
) -> None:
    headers = {"Authorization": f"Bearer {cluster_gateway.admin_key}"}
    async with httpx.AsyncClient(base_url=cluster_gateway.url, headers=headers, timeout=scaled(30)) as client:

        async def nodes() -> dict[str, dict[str, Any]]:
            r = await client.get("/v1/cluster")
            assert r.status_code == 200, r.text
            return {n["id"]: n for n in r.json()["nodes"]}

        r = await client.put(f"/v1/queues/{QUEUE}", json={"replication_factor": 3, "max_message_bytes": MIB})
        assert r.status_code == 201, r.text
        # Every node hosts the partitions of the queue's pool (the queue is on one of them:
        # docs/cluster.md, "Shared partitions") and has published what it holds.
        await _until(
            nodes,
            lambda doc: (
                len(doc) == 3
                and all(
                    (n["storage"] or {}).get("environments") == len(harness.nodes)  # a pool slot per node
                    for n in doc.values()
                )
            ),
            "each node to publish the storage of its replica",
        )
        before = {node: doc["storage"]["used_bytes"] for node, doc in (await nodes()).items()}

        rng = random.Random(9)
        for _ in range(MESSAGES):
            body = "".join(rng.choices(string.ascii_letters, k=BODY_CHARS))
            r = await client.post(f"/v1/queues/{QUEUE}/messages", json={"body": body})
            assert r.status_code == 201, r.text
        # Every replica holds every body (a sync queue replicated three times).
        grown = await _until(
            nodes,
            lambda doc: all(
                doc[n]["storage"]["used_bytes"] >= before[n] + MESSAGES * BODY_CHARS for n in before
            ),
            "every node's published use to show the bodies",
        )

    statvfs = os.statvfs(tmp_path)
    for node in grown.values():
        storage = node["storage"]
        assert node["state"] == "up"
        assert storage["map_size"] <= storage["max_map_size"]
        assert storage["used_bytes"] <= storage["map_size"]
        assert 0 < storage["map_used_ratio"] < 1
        # The file system under the node's data directory (here: the test's), in whole MiB.
        assert storage["disk_total_bytes"] == statvfs.f_blocks * statvfs.f_frsize // MIB * MIB
        assert 0 < storage["disk_free_bytes"] <= storage["disk_total_bytes"]

    # The gateway's sampler reads the same document: per-node gauges, and the fullest
    # partition environment as the store's map gauges.
    def metrics() -> dict[str, dict[str, float]]:
        text = scrape(cluster_gateway.url, cluster_gateway.admin_key).text
        families = {f.name: f for f in text_string_to_metric_families(text)}
        out: dict[str, dict[str, float]] = {}
        for name in ("pushgate_cluster_node_storage_used_bytes", "pushgate_cluster_node_disk_total_bytes"):
            out[name] = (
                {s.labels["node"]: s.value for s in families[name].samples} if name in families else {}
            )
        ratio = families.get("pushgate_store_map_used_ratio")
        out["ratio"] = {"": ratio.samples[0].value} if ratio is not None else {}
        return out

    scraped = await _until(
        lambda: asyncio.to_thread(metrics),
        lambda m: (
            sorted(m["pushgate_cluster_node_storage_used_bytes"]) == ["n0", "n1", "n2"]
            and all(
                v >= before[n] + MESSAGES * BODY_CHARS
                for n, v in m["pushgate_cluster_node_storage_used_bytes"].items()
            )
            and m["ratio"].get("", 0) > 0
        ),
        "the gateway's metrics to show each node's storage",
    )
    fullest = max(n["storage"]["map_used_ratio"] for n in grown.values())
    assert scraped["ratio"][""] == pytest.approx(fullest, rel=0.5)
    totals = scraped["pushgate_cluster_node_disk_total_bytes"]
    assert totals == {n: float(grown[n]["storage"]["disk_total_bytes"]) for n in grown}

    with logged_in(cluster_gateway, cluster_gateway.admin_key) as console:
        page = console.get("/console/nodes").text
    assert "Map use (fullest)" in page and 'id="fullest-map"' in page
    assert page.count('class="stored"') == 3 and page.count('class="disk-free"') == 3

    # A map_use rule at 0% fires for the store on any use: the fullest environment has some.
    async with httpx.AsyncClient(base_url=cluster_gateway.url, headers=headers, timeout=scaled(30)) as client:
        r = await client.post("/v1/alerts/rules", json={"kind": "map_use", "threshold": 0})
        assert r.status_code == 201, r.text

        async def active() -> list[tuple[str, str]]:
            # A scrape takes a sample when the last is over a second old, as Prometheus's
            # would: the sampler's own pace slows to a tenth of its time on a busy machine.
            await asyncio.to_thread(scrape, cluster_gateway.url, cluster_gateway.admin_key)
            doc = (await client.get("/v1/alerts")).json()
            return [(a["kind"], a["subject"]) for a in doc["active"]]

        await _until(active, lambda a: ("map_use", "store") in a, "the map_use alert to fire")


async def _until(read: Callable[[], Any], ok: Callable[[Any], bool], what: str, timeout: float = 20) -> Any:
    """Read until ``ok(value)``; the value. Nodes publish their storage every 2 s or so."""
    deadline = time.monotonic() + scaled(timeout)
    while True:
        value = await read()
        if ok(value):
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {value}"
        await asyncio.sleep(0.1)


def test_storage_travels_in_the_node_record_and_older_records_still_read() -> None:
    fullest = StorageUsage(3 * MIB, 8 * MIB, 64 * MIB)
    storage = summarise([StorageUsage(MIB, 4 * MIB, 64 * MIB), fullest], 10 * MIB + 5, 100 * MIB + 7)
    assert storage.fullest == fullest and storage.map_used_ratio == fullest.used_ratio
    assert (storage.used_bytes, storage.map_size, storage.environments) == (4 * MIB, 12 * MIB, 2)
    assert (storage.disk_free_bytes, storage.disk_total_bytes) == (10 * MIB, 100 * MIB)  # whole MiB
    record = NodeRecord("127.0.0.1:1", "up", {}, storage)
    assert NodeRecord.unpack(record.pack()) == record
    # A node of an older version publishes no storage: its record reads, with none.
    assert NodeRecord.unpack(NodeRecord("127.0.0.1:1").pack()).storage is None
    assert summarise([], 0, 0).map_used_ratio == 0.0
