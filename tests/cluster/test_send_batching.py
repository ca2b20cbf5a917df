"""Sends batched per partition (send_batcher.py) on three real ``pushgate node`` processes and
a manager (real etcd, real TCP), through a ``ClusterBackend`` in the test process: concurrent
callers land as fewer node requests, each gets exactly its own results, one caller's bad
entries fail only that caller, and a leader SIGKILLed mid-stream loses nothing acknowledged."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import cast

import pytest

from backend_store import StoreOptions
from backend_store.cluster.client.cluster_backend import ClusterBackend, open_cluster_backend
from backend_store.errors import InvalidRequest, PushgateError, Unavailable
from backend_store.types import NewMessage, QueueName, SendResult, TenantId
from tests.conftest import scaled

from .placed import queue_partitions
from .processes import ClusterHarness

TENANT = TenantId("acme")


@pytest.fixture
async def backend(harness: ClusterHarness) -> AsyncIterator[ClusterBackend]:
    url = f"cluster://{','.join(harness.endpoints)}{harness.prefix}?replication_factor=3"
    running = open_cluster_backend(url, StoreOptions())
    await running.start()
    try:
        assert await running.view.wait_for(lambda m: len(m.nodes) == 3, scaled(20)), "nodes did not register"
        yield running
    finally:
        await running.close()


async def _drain(backend: ClusterBackend, queue: QueueName) -> dict[str, bytes]:
    """Every message of the queue, by id (received and acked)."""
    got: dict[str, bytes] = {}
    while True:
        batch = await backend.receive(TENANT, queue, 1000)
        if not batch:
            return got
        got.update((m.id, m.body) for m in batch)
        await backend.ack(TENANT, [m.receipt for m in batch], queue)


async def test_concurrent_callers_share_requests_and_each_gets_its_own_results(
    backend: ClusterBackend,
) -> None:
    queue = QueueName("batched")
    await backend.create_queue(TENANT, queue, {"replication_mode": "sync", "max_message_bytes": 1000})
    await backend.send(TENANT, queue, [NewMessage(b"warm-up")])
    await _drain(backend, queue)
    counters = backend.send_batcher.counters

    def entries(caller: int) -> list[NewMessage]:
        bodies = [f"c{caller}-{j}".encode() for j in range(3)]
        if caller % 7 == 3:  # an oversized entry in the middle: refused alone, per entry
            bodies.insert(1, b"x" * 2000)
        return [NewMessage(b) for b in bodies]

    calls, requests = counters.calls, counters.requests
    results = await asyncio.gather(*(backend.send(TENANT, queue, entries(c)) for c in range(60)))
    # One request went at once; the 59 callers that came while it was in flight share one.
    assert counters.calls - calls == 60
    assert counters.requests - requests <= 3, counters
    stored = await _drain(backend, queue)
    for caller, own in enumerate(results):
        sent = entries(caller)
        assert len(own) == len(sent)
        seqs = []
        for message, result in zip(sent, own, strict=True):
            if len(message.body) > 1000:
                assert isinstance(result, PushgateError) and result.code == "message_too_large"
                continue
            assert isinstance(result, SendResult), result
            assert stored[result.id] == message.body  # its own message, in its place
            seqs.append(result.seq)
        # A caller's entries went contiguous: consecutive sequence numbers.
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    assert len(stored) == 60 * 3

    # An entry the node cannot decode fails the whole request: only its caller sees that.
    bad = [NewMessage(b"bad", delay_s=cast(float, "soon"))]
    split = counters.split
    mixed = await asyncio.gather(
        *(backend.send(TENANT, queue, bad if c == 5 else entries(c)) for c in range(10)),
        return_exceptions=True,
    )
    assert counters.split == split + 1
    assert isinstance(mixed[5], InvalidRequest), mixed[5]
    for caller, outcome in enumerate(mixed):
        if caller != 5:
            assert isinstance(outcome, list), outcome
            assert sum(isinstance(r, SendResult) for r in outcome) == 3
    assert len(await _drain(backend, queue)) == 9 * 3


async def test_a_leader_killed_mid_batch_loses_nothing_acknowledged(
    harness: ClusterHarness, backend: ClusterBackend
) -> None:
    """Many callers with dedupe ids (the safe lane: retried across the failover) while the
    partition's leader is SIGKILLed; every acknowledged message is there afterwards."""
    queue = QueueName("failover")
    await backend.create_queue(TENANT, queue, {"replication_mode": "sync"})
    [part] = queue_partitions(backend, TENANT, queue)
    acked: list[str] = []
    stop = asyncio.Event()

    async def producer(name: str) -> None:
        n = 0
        while not stop.is_set():
            body = f"{name}-{n}"
            try:
                [result] = await backend.send(TENANT, queue, [NewMessage(body.encode(), dedupe_id=body)])
            except Unavailable:
                await asyncio.sleep(0.05)
                continue  # the same dedupe id again, as a client retries a 503
            assert isinstance(result, SendResult), result
            acked.append(body)
            n += 1

    async def until(count: int, what: str) -> None:
        deadline = time.monotonic() + scaled(30)
        while len(acked) < count:
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            await asyncio.sleep(0.02)

    merged = backend.send_batcher.counters.merged
    tasks = [asyncio.create_task(producer(f"p{i}")) for i in range(24)]
    try:
        await until(200, "sends before the kill")
        assert backend.send_batcher.counters.merged > merged  # they were batched
        leader = backend.view.map.resolve(part)
        assert leader is not None and leader.leader is not None
        harness.nodes[leader.leader.node].kill()
        before = len(acked)
        await until(before + 200, "sends after the kill")
    finally:
        stop.set()
        await asyncio.gather(*tasks)
    received = {body.decode() for body in (await _drain(backend, queue)).values()}
    assert set(acked) - received == set()
    assert len(received) == len(set(acked))  # deduplicated: each body stored once


async def test_callers_of_many_queues_on_a_pool_share_requests_and_each_message_lands_in_its_queue(
    backend: ClusterBackend,
) -> None:
    # One send to each of many inboxes (issue 49): the pool partition's queues share a lane,
    # so the callers arriving while one request is in flight go as one ``send_queues``.
    queues = [QueueName(f"inbox-{i:02d}") for i in range(45)]
    for queue in queues:
        await backend.create_queue(TENANT, queue, {"replication_mode": "sync"})
    await asyncio.gather(*(backend.send(TENANT, q, [NewMessage(b"warm-up")]) for q in queues))
    for queue in queues:
        await _drain(backend, queue)
    counters = backend.send_batcher.counters
    calls, requests, merged = counters.calls, counters.requests, counters.queues
    results = await asyncio.gather(
        *(
            backend.send(TENANT, q, [NewMessage(f"{q}-1".encode()), NewMessage(f"{q}-2".encode())])
            for q in queues
        )
    )
    assert counters.calls - calls == len(queues)
    assert counters.queues - merged >= 1, counters
    # Three pool partitions: a request at once on each, then the rest in a few.
    assert counters.requests - requests <= 12, counters
    for queue, own in zip(queues, results, strict=True):
        stored = await _drain(backend, queue)
        ids = [r.id for r in own if isinstance(r, SendResult)]
        assert len(ids) == 2, own
        assert [stored[i] for i in ids] == [f"{queue}-1".encode(), f"{queue}-2".encode()]
        assert len(stored) == 2  # nobody else's message
