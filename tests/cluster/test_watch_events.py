"""The etcd watch applies events to a read (issue 49): states equal reads at their revisions.

``EtcdCoordinator.watch_prefix`` reads the prefix whole at a revision R and then applies
etcd's events from R+1 in order, a revision at a time, instead of reading the whole prefix
again on every event (at 10,000 queue records that re-read made every created queue cost
O(queues) on every node, manager and gateway). These tests hold it to the promise of a read
(docs/cluster.md section 3, "Watches are hints"), against a real etcd: after random puts,
deletes and multi-key transactions, every state handed out equals etcd's own read at that
state's revision and names the keys that changed; a start revision etcd has compacted
falls back to a whole read.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
from collections.abc import AsyncIterator
from pathlib import Path

import aetcd.utils
import pytest
from aetcd import rpc

from backend_store.cluster.coordination.coordinator import Entry, PrefixState
from backend_store.cluster.coordination.etcd_coordinator import EtcdCoordinator
from backend_store.cluster.coordination.watched_prefix import WatchedPrefix, changed_keys
from backend_store.types import Epoch
from tests.conftest import scaled
from tests.fixtures.etcd_server import etcd_cluster, unique_prefix


@pytest.fixture
async def coordinator(etcd_endpoints: list[str]) -> AsyncIterator[EtcdCoordinator]:
    async with EtcdCoordinator(etcd_endpoints) as c:
        yield c


async def read_at(coordinator: EtcdCoordinator, prefix: str, revision: int) -> dict[str, Entry]:
    """etcd's own read of the prefix at a past revision."""
    key = prefix.encode()
    request = rpc.RangeRequest(key=key, range_end=aetcd.utils.prefix_range_end(key), revision=revision)
    client = coordinator._client
    reply = await client.kvstub.Range(request, timeout=scaled(5))
    return {
        kv.key.decode(): Entry(
            kv.key.decode(), bytes(kv.value), kv.create_revision, kv.mod_revision, kv.lease
        )
        for kv in reply.kvs
    }


async def random_writes(coordinator: EtcdCoordinator, prefix: str, seed: int, count: int) -> None:
    """Puts, deletes (of present and absent keys) and transactions of several puts and
    deletes at one revision."""
    rng = random.Random(seed)
    session = await coordinator.open_session(5.0)
    fence = prefix.rstrip("/") + "-fence"  # beside the prefix: not its business
    claim = await coordinator.campaign(session, fence, b"writer")
    keys = [f"{prefix}k{i}" for i in range(12)]
    try:
        for n in range(count):
            kind = rng.random()
            if kind < 0.5:
                await coordinator.put(rng.choice(keys), f"v{n}".encode())
            elif kind < 0.7:
                await coordinator.delete(rng.choice(keys))
            else:
                chosen = rng.sample(keys, 5)
                puts = {k: f"t{n}".encode() for k in chosen[:3]}
                assert await coordinator.fenced_commit(
                    fence, Epoch(claim.epoch), puts, chosen[3:], holder=b"writer"
                )
    finally:
        await session.close()


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_every_state_equals_a_read_at_its_revision_and_names_the_changed_keys(
    coordinator: EtcdCoordinator, seed: int
) -> None:
    prefix = unique_prefix("events") + "/"
    await coordinator.put(prefix + "k0", b"before")
    # A re-read interval longer than the test: every state after the first is made of events.
    stop = asyncio.Event()
    states = coordinator.watch_prefix(prefix, reread_every_s=600, stop=stop)
    seen: list[PrefixState] = [await asyncio.wait_for(anext(states), scaled(5))]
    arrived = asyncio.Event()

    async def collect() -> None:
        async for state in states:
            seen.append(state)
            arrived.set()

    # Writes made before the stream opens come as one catch-up answer of many revisions;
    # those made while it runs, about a revision at a time.
    await random_writes(coordinator, prefix, seed, 20)
    collector = asyncio.create_task(collect())
    try:
        # One write at a time, each awaited on the watch: live events, however loaded the
        # machine (40 writes at once could all come as one answer: a CI run saw two states).
        for i in range(40):
            await random_writes(coordinator, prefix, seed + 100 + i, 1)
            written = await coordinator.read_prefix(prefix)
            async with asyncio.timeout(scaled(10)):
                while seen[-1].entries != written.entries:  # the prefix's revisions are not etcd's
                    arrived.clear()
                    await arrived.wait()
        final = await coordinator.read_prefix(prefix)
        assert seen[-1].entries == final.entries
    finally:
        stop.set()
        await asyncio.wait_for(collector, scaled(10))
    assert len(seen) > 2
    for before, state in itertools.pairwise(seen):
        # A state made of events, never half of a transaction: etcd's read at its revision.
        assert state.changed is not None and state.since == before.revision
        assert state.revision > before.revision
        assert state.entries == await read_at(coordinator, prefix, state.revision)
        # Every key that differs is named; a key named beyond those was made and deleted
        # again between the two states (etcd answered them in one catch-up).
        named, differ = set(state.changed), changed_keys(before, state)
        assert differ <= named
        assert not (named - differ) & (set(before.entries) | set(state.entries))


async def test_listeners_get_the_keys_a_transaction_changed(coordinator: EtcdCoordinator) -> None:
    prefix = unique_prefix("listeners") + "/"
    for i in range(50):
        await coordinator.put(f"{prefix}q{i}", b"queue")
    watch = WatchedPrefix(coordinator, prefix, reread_every_s=600.0)
    calls: list[tuple[PrefixState, set[str]]] = []
    second = asyncio.Event()

    def listener(state: PrefixState, keys: set[str]) -> None:
        calls.append((state, keys))
        if len(calls) >= 2:
            second.set()

    watch.add_listener(listener)
    session = await coordinator.open_session(5.0)
    try:
        await watch.start()
        fence = prefix.rstrip("/") + "-fence"
        claim = await coordinator.campaign(session, fence, b"manager")
        puts = {f"{prefix}q1": b"moved", f"{prefix}new": b"queue"}
        assert await coordinator.fenced_commit(fence, claim.epoch, puts, [f"{prefix}q2"], holder=b"manager")
        await asyncio.wait_for(second.wait(), scaled(10))
        state, keys = calls[1]
        # One call for the whole transaction, with its keys as the events named them.
        assert keys == {f"{prefix}q1", f"{prefix}new", f"{prefix}q2"}
        assert state.changed is not None
        assert state.values()["q1"] == b"moved" and "q2" not in state.values() and len(state.entries) == 50
    finally:
        await session.close()
        await watch.close()


async def test_a_compacted_start_revision_falls_back_to_a_whole_read(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The stream opens from the first read's revision + 1 once the consumer asks for the
    next state; compacted meanwhile, etcd refuses it, and the watch reads the prefix whole
    instead of following nothing until its periodic re-read."""
    with etcd_cluster(tmp_path / "etcd") as cluster:
        async with EtcdCoordinator(cluster.endpoints) as coordinator:
            caplog.set_level(logging.INFO, logger="pushgate.cluster")
            prefix = "/compacted/"
            await coordinator.put(prefix + "a", b"1")
            states = coordinator.watch_prefix(prefix, reread_every_s=600)
            try:
                first = await asyncio.wait_for(anext(states), scaled(5))
                assert first.values() == {"a": b"1"}
                await coordinator.put(prefix + "b", b"2")
                revision = await coordinator.put(prefix + "a", b"3")
                await coordinator._client.compact(revision)
                state = await asyncio.wait_for(anext(states), scaled(10))
                assert state.values() == {"a": b"3", "b": b"2"}
                assert state.changed is None  # a whole read, compared whole by its consumer
                assert f"revision {first.revision + 1} was compacted" in caplog.text
                # Followed by events again from there.
                await coordinator.delete(prefix + "b")
                after = await asyncio.wait_for(anext(states), scaled(10))
                assert after.values() == {"a": b"3"} and after.changed == frozenset({prefix + "b"})
            finally:
                await states.aclose()
