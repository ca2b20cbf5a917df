"""Every node's disk full at once (real node processes, real etcd, a real gateway).

The replicas of a partition hold the same data, so on nodes with disks of one size they fill
together: the worst day of a replicated queue whose consumers fell behind. What a user
expects (docs/cluster.md, section 7): sends are refused with ``503 unavailable`` ("disk
full") and nothing acknowledged is lost; consumers go on receiving and acking; the room
their acks free takes sends again, with no operator and no restart.

Found by trying it (session 47). Before the reserve of room that sends may not use
(backend_store/lmdb_store/room.py), the send that found the disk full failed at its commit,
after the leader had shipped its entry: the term ended, and on each of the three nodes the
small files that serving the partition again writes first failed too. Every node set its
copy aside as a stray, retried every 30 s, and the queue had no leader until an operator
freed space: "no leader for partition 0" to every receive and ack, for good.

Each node runs in its own mount namespace (``unshare -rm``) with its data directory on a
small tmpfs, so its writes fail as on a full disk.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import httpx
import pytest

from tests.conftest import scaled
from tests.fixtures.etcd_server import unique_prefix
from tests.fixtures.small_disk import namespaces_allowed, on_small_disk

from .conftest import running_cluster_gateway
from .processes import ClusterHarness
from .workload import replicated_everywhere

DISK_BYTES = 12 * 1024 * 1024
QUEUE = "backlog"
PER_SEND = 10
PER_RECEIVE = 10


@contextlib.asynccontextmanager
async def _cluster_on_small_disks(
    etcd_endpoints: list[str], root: Path, node_args: Sequence[str] = ()
) -> AsyncIterator[ClusterHarness]:
    """Three nodes (and a manager), each node with its data on a tmpfs of its own."""
    if not namespaces_allowed():
        pytest.fail("this test needs mount namespaces (unshare -rm), as CI has")
    h = ClusterHarness(etcd_endpoints, root, unique_prefix("full") + "/")
    h.root.mkdir()
    try:
        await h.start(nodes=3, managers=1, running=0, node_args=node_args)
        for name, node in h.nodes.items():
            data = h.root / name
            data.mkdir()
            node.wrapper = on_small_disk(data, DISK_BYTES)
            node.start()
        await h.wait_registered(list(h.nodes))
        yield h
    finally:
        await h.close()


@pytest.fixture
async def harness(etcd_endpoints: list[str], tmp_path: Path) -> AsyncIterator[ClusterHarness]:
    async with _cluster_on_small_disks(etcd_endpoints, tmp_path / "cluster") as h:
        yield h


async def _fill(http: httpx.AsyncClient, body: str) -> tuple[list[str], httpx.Response]:
    """Send batches until one is refused: the ids stored, and the refusal."""
    stored: list[str] = []
    for _ in range(4 * DISK_BYTES // (len(body) * PER_SEND)):  # far more than fits
        r = await http.post(f"/v1/queues/{QUEUE}/messages", json={"messages": [{"body": body}] * PER_SEND})
        if r.status_code != 200:
            return stored, r
        stored += [result["id"] for result in r.json()["results"]]
    raise AssertionError("the disk never filled")


async def _drain(http: httpx.AsyncClient, expected: set[str]) -> list[str]:
    """Receive and ack in batches, as a consumer does, retrying what is refused, until every
    expected message was acked; return every refusal met on the way."""
    acked: set[str] = set()
    refusals: list[str] = []
    deadline = time.monotonic() + scaled(60)
    while not expected <= acked:
        assert time.monotonic() < deadline, f"{len(expected - acked)} never acked; refusals: {refusals[-5:]}"
        r = await http.post(f"/v1/queues/{QUEUE}/receive", json={"max": PER_RECEIVE, "wait_s": 0})
        if r.status_code != 200:
            refusals.append(f"receive: {r.status_code} {r.text}")
            await asyncio.sleep(0.2)
            continue
        got = r.json()["messages"]
        a = await http.post(f"/v1/queues/{QUEUE}/ack", json={"receipts": [m["receipt"] for m in got]})
        if a.status_code != 200:
            refusals.append(f"ack: {a.status_code} {a.text}")
            continue  # delivered again once their visibility timeout ends
        acked.update(m["id"] for m in got)
    return refusals


async def test_full_disks_refuse_sends_and_acks_make_room_again(
    harness: ClusterHarness, tmp_path: Path
) -> None:
    h = harness
    await h.create_queue(
        "default", QUEUE, {"replication_factor": 3, "partitions": 1, "visibility_timeout_s": 2}
    )
    pid = await h.partition_of("default", QUEUE)
    leader = await h.serving_leader(pid)
    body = base64.b64encode(os.urandom(3 * 1024)).decode()  # 4 KiB as JSON
    with running_cluster_gateway(h, tmp_path / "gateway") as gateway:
        headers = {"Authorization": f"Bearer {gateway.admin_key}"}
        async with httpx.AsyncClient(base_url=gateway.url, headers=headers, timeout=scaled(30)) as http:
            stored, refusal = await _fill(http, body)
            assert refusal.status_code == 503, refusal.text
            assert refusal.json()["code"] == "unavailable" and refusal.json()["detail"] == "disk full"
            assert "retry-after" in refusal.headers
            assert len(stored) > 500
            # Refused before anything was written: the leader's term goes on.
            assert await h.leader(pid) == leader

            # Consumers drain the backlog: every stored message is delivered and acked.
            refusals = await _drain(http, set(stored))
            assert refusals == [], refusals[:5]

            # The room the acks freed takes sends again, on every replica.
            again, refusal = await _fill(http, body)
            assert refusal.status_code == 503 and refusal.json()["detail"] == "disk full", refusal.text
            assert len(again) > len(stored) * 3 // 4
            await replicated_everywhere(h, pid, list(h.nodes))
            refusals = await _drain(http, set(again))
            assert refusals == [], refusals[:5]
            assert await h.leader(pid) == leader


async def test_a_node_takes_its_reserve_from_the_command_line(
    etcd_endpoints: list[str], tmp_path: Path
) -> None:
    # A reserve larger than the disk: no send fits, receives still answer.
    async with _cluster_on_small_disks(
        etcd_endpoints, tmp_path / "cluster", ["--disk-reserve-mib", "64"]
    ) as h:
        await h.create_queue("default", QUEUE, {"replication_factor": 3, "partitions": 1})
        await h.serving_leader(await h.partition_of("default", QUEUE))
        with running_cluster_gateway(h, tmp_path / "gateway") as gateway:
            headers = {"Authorization": f"Bearer {gateway.admin_key}"}
            async with httpx.AsyncClient(base_url=gateway.url, headers=headers, timeout=scaled(30)) as http:
                r = await http.post(f"/v1/queues/{QUEUE}/messages", json={"body": "small"})
                assert r.status_code == 503 and r.json()["detail"] == "disk full", r.text
                r = await http.post(f"/v1/queues/{QUEUE}/receive", json={"wait_s": 0})
                assert r.status_code == 200 and r.json()["messages"] == [], r.text
