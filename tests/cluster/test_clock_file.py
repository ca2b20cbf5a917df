"""The test-only clock seam (backend_store/cluster/clock_file.py): the file itself, and the dev
cluster's node processes reading their time from it while a test holds it, real time otherwise."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

from backend_store import StoreOptions, TenantId
from backend_store.cluster.clock_file import ClockFile, ClockFileWriter
from backend_store.cluster.cluster_backend import open_cluster_backend
from tests.backend.cluster_isolation import isolated_cluster_test
from tests.backend.harness import msg, q
from tests.conftest import CLOCK_START, ManualClock
from tests.fixtures.dev_cluster import DevClusterProcess


def test_a_reader_sees_each_value_written_and_real_time_at_zero(tmp_path: Path) -> None:
    writer = ClockFileWriter(tmp_path / "clock")
    reader = ClockFile(tmp_path / "clock")
    try:
        before = time.time()
        assert reader.held() == 0.0
        assert before <= reader() <= time.time()
        writer.publish(CLOCK_START + 0.25)
        assert reader() == reader.held() == CLOCK_START + 0.25
        writer.publish(0.0)
        assert reader() >= before
    finally:
        reader.close()
        writer.close()


async def test_moves_yields_each_change(tmp_path: Path) -> None:
    writer = ClockFileWriter(tmp_path / "clock")
    reader = ClockFile(tmp_path / "clock")
    try:
        moves = reader.moves(since=0.0, poll_s=0.001)
        writer.publish(CLOCK_START)
        async with asyncio.timeout(5):
            assert await anext(moves) == CLOCK_START
            writer.publish(CLOCK_START + 60)
            assert await anext(moves) == CLOCK_START + 60
        await moves.aclose()
    finally:
        reader.close()
        writer.close()


def test_a_manual_clock_publishes_every_move_while_inside() -> None:
    clock = ManualClock()
    seen: list[float] = []
    with clock.publish_to(seen.append):
        clock.advance(5)
        clock.now = CLOCK_START
    clock.advance(1)
    assert seen == [CLOCK_START, CLOCK_START + 5, CLOCK_START]


async def test_nodes_follow_a_held_clock_and_keep_real_time_when_released(
    dev_cluster: DevClusterProcess,
) -> None:
    assert dev_cluster.clock is not None
    clock = ManualClock()
    tenant = TenantId(f"clock-{uuid.uuid4().hex[:8]}")
    url = f"{dev_cluster.store_url}?replication_factor=3&etcd_timeout_s=5"
    async with isolated_cluster_test(f"{dev_cluster.store_url}?etcd_timeout_s=5"):
        store = open_cluster_backend(url, StoreOptions(clock=clock))
        await store.start()
        try:
            with clock.publish_to(dev_cluster.clock.publish):
                await store.create_queue(tenant, q("jobs"), {"visibility_timeout_s": 30})
                await store.send(tenant, q("jobs"), [msg("a")])
                # The leader's receive stamps its time, the test's: 30 s past CLOCK_START.
                [got] = await store.receive(tenant, q("jobs"), 1)
                assert got.visible_at == CLOCK_START + 30
                assert await store.receive(tenant, q("jobs"), 1) == []
                clock.advance(31)  # seen by the very next call
                [again] = await store.receive(tenant, q("jobs"), 1)
                assert (again.id, again.receive_count, again.visible_at) == (got.id, 2, CLOCK_START + 61)
            dev_cluster.clock.publish(0.0)
            # Released: real time again (the gateway and push suites share this cluster).
            # The message sent in 2023 is past its retention now.
            before = time.time()
            await store.send(tenant, q("jobs"), [msg("b")])
            [late] = await store.receive(tenant, q("jobs"), 10, visibility_timeout_s=10)
            assert late.body == b"b"
            assert before + 10 - 0.01 <= late.visible_at <= time.time() + 10 + 0.01
        finally:
            dev_cluster.clock.publish(0.0)
            await store.close()
