"""A follower killed while its leader takes writes, restarted, catches up: real etcd, real
``pushgate node`` processes, a steady load of sync sends throughout.

Issue 24's restarted follower that never caught up (the random-fault test's seed 2 with the
producers on a gateway's ``ClusterBackend``, docs/testing.md): a follower past the leader's
shipping window (2,048 entries) whose node record expired while it was down was forgotten by
the leader; back, it published its old position for ever while the leader, under a steady
load, shipped it nothing. This pins the recipe on three nodes and one partition.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from backend_store.cluster.replication.log_shipping import ReplicationLeader
from backend_store.errors import StaleEpoch, Unavailable
from backend_store.types import NewMessage, QueueName, TenantId
from tests.conftest import scaled
from tests.fixtures.etcd_server import unique_prefix

from .processes import ClusterHarness
from .workload import RF3_SYNC, Q, T, has_replicas

# The production leader's window (ReplicationLeader's default): the follower's position must
# be past it when it is killed.
WINDOW = 2048
PRODUCERS = 3
# Sends come far more often than the leader's 0.5 s heartbeat, as under any real load: every
# commit wakes the sender, so an idle heartbeat never goes out to the restarted follower.
PAUSE_S = 0.005


@pytest.fixture
async def harness(etcd_endpoints: list[str], tmp_path: Path) -> AsyncIterator[ClusterHarness]:
    h = ClusterHarness(etcd_endpoints, tmp_path, unique_prefix("catchup") + "/")
    try:
        yield h
    finally:
        await h.close()


class SteadyLoad:
    """Producers of sync sends, each retried (same dedupe id) until acknowledged, until stopped."""

    def __init__(self, h: ClusterHarness, pid: int) -> None:
        self.h, self.pid = h, pid
        self.acknowledged = 0
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._produce(f"p{i}-")) for i in range(PRODUCERS)]

    async def _produce(self, prefix: str) -> None:
        count = 0
        while not self._stop.is_set():
            body = f"{prefix}{count}"
            count += 1
            message = NewMessage(body.encode(), dedupe_id=body)
            deadline = time.monotonic() + scaled(30)
            while True:
                try:
                    await self.h.call(
                        self.pid, "send", tenant=TenantId(T), queue=QueueName(Q), messages=[message]
                    )
                    break
                except (Unavailable, StaleEpoch):
                    assert time.monotonic() < deadline, f"send of {body} never acknowledged"
                    await asyncio.sleep(0.05)
            self.acknowledged += 1
            await asyncio.sleep(PAUSE_S)

    def raise_failures(self) -> None:
        for task in self._tasks:
            if task.done() and not task.cancelled() and task.exception() is not None:
                task.result()

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)


async def _positions(h: ClusterHarness, pid: int) -> dict[str, int]:
    records = await h.node_records()
    return {name: rec.replicas[pid].lsn for name, rec in records.items() if pid in rec.replicas}


@pytest.mark.slow
async def test_a_follower_restarted_past_the_window_under_load_catches_up(harness: ClusterHarness) -> None:
    assert inspect.signature(ReplicationLeader).parameters["window_entries"].default == WINDOW
    h = await harness.start(nodes=3, managers=1)
    await h.create_queue(T, Q, RF3_SYNC)
    pid = await h.partition_of(T, Q)
    await h.wait_for("three replicas", lambda: has_replicas(h, pid, 3))
    leader, _, _ = await h.serving_leader(pid)
    follower = next(n for n in sorted(h.nodes) if n != leader)
    load = SteadyLoad(h, pid)
    load.start()
    try:

        async def past_the_window() -> bool:
            load.raise_failures()
            return (await _positions(h, pid)).get(follower, 0) > WINDOW + 50

        await h.wait_for(f"{follower} past LSN {WINDOW}", past_the_window, timeout=120)
        h.nodes[follower].kill()

        async def forgotten() -> bool:
            # Its record expired with its lease: the leader drops its link and what it knew.
            load.raise_failures()
            return follower not in await h.node_records()

        await h.wait_for(f"{follower}'s node record to expire", forgotten)
        h.nodes[follower].start()
        await h.wait_registered([follower])
        began = time.monotonic()
        mark = (await _positions(h, pid))[leader]

        async def caught_up() -> bool:
            load.raise_failures()
            return (await _positions(h, pid)).get(follower, 0) >= mark

        # Hundreds of entries behind at most: a second's work. Before the fix it stayed at the
        # position it restarted with for as long as the load went on.
        await h.wait_for(f"{follower} to reach the leader's LSN {mark}", caught_up, timeout=15)
        assert load.acknowledged > 0
        print(f"{follower} caught up to LSN {mark} in {time.monotonic() - began:.2f}s")
    finally:
        await load.stop()
