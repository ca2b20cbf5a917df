"""WebSocket acks are batched per partition (push/batching.py ``AckBatcher``, keyed by the
receipt's shard): a partition leader frozen with SIGSTOP holds up the acks of its own receipts
only (issue 25, "Acks per partition"). Real etcd, three real ``pushgate node`` processes and a
manager, a real gateway on ``cluster://`` and a real WebSocket consumer.

The queue's partitions have one replica each, so the frozen partition has no successor and
its ack waits for the node; the gateway's node timeout is set far past the test, so no
answer comes for it until the node is thawed. Acks of another partition's receipts, sent
after it on the same connection, must all be answered meanwhile (one call in flight per
tenant made them wait behind the frozen one until its node timeout; the sans-I/O half is
tests/push/test_ack_shards.py).
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from backend_store.cluster.client.routing import split_receipt
from gateway.settings import Settings
from tests.conftest import scaled
from tests.gateway.conftest import RunningGateway
from tests.push.conftest import Http, deliveries, recv_frame, request, send_frame, ws_connect

from .processes import ClusterHarness

TENANT, QUEUE = "default", "acks"


@pytest.fixture
def patient_gateway(harness: ClusterHarness, tmp_path: Path) -> Iterator[RunningGateway]:
    """A gateway whose requests wait for a frozen node far longer than the test runs."""
    timeout = scaled(300)
    url = (
        f"cluster://{','.join(harness.endpoints)}{harness.prefix}"
        f"?node_timeout_s={timeout}&request_deadline_s={timeout + 60}"
    )
    settings = Settings(
        data_dir=tmp_path / "gateway", store_url=url, log_level="warning", graceful_timeout_s=5
    )
    running = RunningGateway(settings).start()
    try:
        yield running
    finally:
        running.stop()


async def test_a_frozen_leader_stalls_no_ack_of_another_partition(
    harness: ClusterHarness, patient_gateway: RunningGateway
) -> None:
    gateway = patient_gateway
    headers = {"Authorization": f"Bearer {gateway.admin_key}"}
    async with httpx.AsyncClient(base_url=gateway.url, headers=headers, timeout=scaled(30)) as client:
        http = Http(client)
        await http.queue(QUEUE, partitions=3, replication_factor=1)
        leaders: dict[int, str] = {}
        for index in range(3):
            partition = await harness.partition_of(TENANT, QUEUE, index)
            node, _, _ = await harness.serving_leader(partition)
            leaders[partition] = node
        assert len(set(leaders.values())) >= 2, f"every partition on one node: {leaders}"
        for i in range(12):  # round robin over the partitions, a request at a time
            await http.send(QUEUE, f"m{i}")

    frozen_node: str | None = None
    async with ws_connect(gateway, gateway.admin_key) as ws:
        reply = await request(ws, op="subscribe", queue=QUEUE, id="sub", prefetch=12)
        assert reply["op"] == "ok", reply
        by_partition: dict[int, list[str]] = {}
        for message in await deliveries(ws, 12, timeout=30):
            split = split_receipt(message["receipt"])
            assert split is not None
            by_partition.setdefault(split[0], []).append(message["receipt"])
        assert set(by_partition) == set(leaders), by_partition
        frozen_partition = next(iter(by_partition))
        frozen_node = leaders[frozen_partition]
        others = [r for p, receipts in by_partition.items() if leaders[p] != frozen_node for r in receipts]
        try:
            harness.nodes[frozen_node].signal(signal.SIGSTOP)
            await send_frame(ws, op="ack", receipts=by_partition[frozen_partition][:1], id="frozen")
            for i, receipt in enumerate(others):  # a frame each, after the held one
                await send_frame(ws, op="ack", receipts=[receipt], id=f"other-{i}")
            answered: dict[str, dict[str, object]] = {}
            while len(answered) < len(others):
                # Reached only if the other partitions' acks wait behind the frozen one.
                frame = await recv_frame(ws, timeout=30)
                if frame.get("id") == "frozen":
                    raise AssertionError(f"the frozen partition answered while its node was stopped: {frame}")
                if str(frame.get("id", "")).startswith("other-"):
                    answered[str(frame["id"])] = frame
            for frame in answered.values():
                assert frame["op"] == "ok" and frame["acked"] == 1 and frame["failed"] == [], frame
            harness.nodes[frozen_node].signal(signal.SIGCONT)
            frozen_node = None
            # The held ack is answered once its node is back (settled, or refused as
            # unknown if the node's lease ran out meanwhile: a term ended under it).
            while (await recv_frame(ws, timeout=60)).get("id") != "frozen":
                pass
        finally:
            if frozen_node is not None:
                harness.nodes[frozen_node].signal(signal.SIGCONT)
