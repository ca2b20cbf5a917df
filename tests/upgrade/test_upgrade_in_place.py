"""The upgrade in place (issue 49; docs/cluster.md section 12): a cluster whose data an earlier
release made, with one partition per queue, started by today's code on the same directories.

The earlier release's data is made when the tests run: the code of commit
:data:`PREVIOUS_RELEASE` is taken from this repository's history (``git archive``), and
:mod:`tests.upgrade.previous_release` runs it as a whole cluster that creates queues, sends
and stops, packing etcd's data directory, three nodes' and a gateway's, and a manifest of
every message it acknowledged. Today's nodes, manager (with shared partitions) and gateway
start on them. Made at run time, not kept as an archive: an archive's messages carry the day
it was made, and the queues' default retention (4 days) expired them all four days after
(the test failed from 2026-11-30 on, whatever the tree).
"""

from __future__ import annotations

import asyncio
import io
import json
import subprocess
import tarfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from backend_store.cluster.coordination.etcd_coordinator import EtcdCoordinator
from backend_store.cluster.coordination.layout import Layout, PartitionRecord, parse_ids, unpack
from backend_store.cluster.coordination.pools import placement
from tests.conftest import scaled

from . import previous_release
from .cluster_dirs import REPO, ClusterDirs

# The last release with one partition per queue.
PREVIOUS_RELEASE = "a948aa2"
POOL_PARTITIONS = 4

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def previous_release_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An archive of the cluster data :data:`PREVIOUS_RELEASE` made, made now."""
    work = tmp_path_factory.mktemp("previous-release")
    code = work / "code"
    code.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", PREVIOUS_RELEASE],
        capture_output=True,
        check=False,
    )
    if archive.returncode != 0:
        pytest.fail(
            f"the upgrade test needs commit {PREVIOUS_RELEASE} in this repository's history "
            f"(a full clone): {archive.stderr.decode(errors='replace').strip()}"
        )
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(code, filter="data")
    out = work / "previous.tar.gz"
    previous_release.make(code, out, PREVIOUS_RELEASE)
    return out


@pytest.fixture
def upgraded(tmp_path: Path, previous_release_data: Path) -> Iterator[tuple[ClusterDirs, dict[str, Any]]]:
    with tarfile.open(previous_release_data) as tar:
        tar.extractall(tmp_path, filter="data")
    root = tmp_path / "cluster"
    manifest = json.loads((root / "manifest.json").read_text())
    cluster = ClusterDirs(
        root, tmp_path / "logs", manager_args=("--partitions", str(POOL_PARTITIONS)), timeout_s=scaled(60)
    )
    try:
        cluster.start()
        yield cluster, manifest
    except BaseException:
        print(cluster.log_tails())
        raise
    finally:
        cluster.stop()


def _until(what: str, check: Callable[[], Any], timeout_s: float = 60) -> Any:
    deadline = time.monotonic() + scaled(timeout_s)
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.2)
    raise AssertionError(f"{what}: still {last!r} after {scaled(timeout_s):.0f}s")


def _etcd(endpoint: str, prefix: str) -> dict[str, bytes]:
    async def read() -> dict[str, bytes]:
        coordinator = await EtcdCoordinator([endpoint]).connect()
        try:
            return (await coordinator.read_prefix(prefix)).values()
        finally:
            await coordinator.close()

    return asyncio.run(read())


def _bodies(http: httpx.Client, queue: str) -> list[str]:
    answer = http.get(f"/v1/queues/{queue}/peek", params={"max": 100})
    return sorted(m["body"] for m in answer.json()["messages"]) if answer.status_code == 200 else []


def test_every_queue_of_the_previous_release_is_served_and_new_queues_share_partitions(
    upgraded: tuple[ClusterDirs, dict[str, Any]],
) -> None:
    cluster, manifest = upgraded
    layout = Layout()
    before = {
        pid: PartitionRecord.unpack(v)
        for pid, v in parse_ids(_etcd(cluster.etcd_endpoint, layout.partitions)).items()
    }
    assert before and all(r.pool is None for r in before.values())  # the old release: one per queue
    headers = {"Authorization": f"Bearer {manifest['admin_key']}"}
    with httpx.Client(base_url=cluster.url, headers=headers, timeout=scaled(30)) as http:
        # Everything the old cluster acknowledged is there, in the queue it was sent to.
        for name, queue in manifest["queues"].items():
            expected = sorted(queue["bodies"])

            def holds(name: str = name, expected: list[str] = expected) -> bool:
                return _bodies(http, name) == expected

            _until(f"{name} to hold the old release's messages", holds)

        # Old queues take sends and deliver them.
        for name in manifest["queues"]:
            assert http.post(f"/v1/queues/{name}/messages", json={"body": f"{name} after"}).status_code == 201
        got = http.post("/v1/queues/inbox-1/receive", json={"max": 10}).json()["messages"]
        assert {m["body"] for m in got} == {*manifest["queues"]["inbox-1"]["bodies"], "inbox-1 after"}
        acked = http.post("/v1/queues/inbox-1/ack", json={"receipts": [m["receipt"] for m in got]}).json()
        assert acked["acked"] == len(got)

        # Dead letters of an old queue still move into its dead-letter queue.
        assert http.post("/v1/queues/orders/messages", json={"body": "poison after"}).status_code == 201
        for _ in range(50):
            for m in http.post("/v1/queues/orders/receive", json={"max": 10}).json()["messages"]:
                if m["body"] == "poison after":
                    http.post("/v1/queues/orders/nack", json={"receipts": [m["receipt"]]})
                else:
                    http.post("/v1/queues/orders/nack", json={"receipts": [m["receipt"]], "delay_s": 60})
            if "poison after" in _bodies(http, "orders-dlq"):
                break
        assert "poison after" in _bodies(http, "orders-dlq")

        # New queues are placed on a pool: no partition of their own.
        new = [f"inbox-new-{i}" for i in range(12)]
        for name in new:
            assert http.put(f"/v1/queues/{name}", json={}).status_code == 201
            assert http.post(f"/v1/queues/{name}/messages", json={"body": name}).status_code == 201
        for name in new:
            assert [
                m["body"]
                for m in http.post(f"/v1/queues/{name}/receive", json={"max": 10}).json()["messages"]
            ] == [name]
        records = _etcd(cluster.etcd_endpoint, layout.queues)
        for name in new:
            assert placement(unpack(records[f"default/{name}"])) is not None, name
        for name in manifest["queues"]:
            assert placement(unpack(records[f"default/{name}"])) is None, name  # old queues stay put
        after = {
            pid: PartitionRecord.unpack(v)
            for pid, v in parse_ids(_etcd(cluster.etcd_endpoint, layout.partitions)).items()
        }
        pools = {pid: r for pid, r in after.items() if r.pool is not None}
        assert {r.pool for r in pools.values()} == {"rf3-sync"}
        assert len(pools) == POOL_PARTITIONS
        assert {pid: r.queue for pid, r in after.items() if r.pool is None} == {
            pid: r.queue for pid, r in before.items()
        }

        # An old queue deleted and created again lands on the pool, empty.
        assert http.delete("/v1/queues/inbox-2").status_code == 204
        assert http.put("/v1/queues/inbox-2", json={}).status_code == 201
        assert _bodies(http, "inbox-2") == []
        records = _etcd(cluster.etcd_endpoint, layout.queues)
        assert placement(unpack(records["default/inbox-2"])) is not None
