"""One commit, one signal on ``cluster://`` (issue 25), as on the embedded store
(tests/push/test_one_signal.py): a standing receive that took everything a partition's commit
made visible is that commit's only signal; the gateway's change listeners (its wake-up hub)
hear nothing of it. After a full delivery they are woken, just before it.

Two nodes and a manager in this process (real etcd, real TCP); the gateway's
``ClusterBackend`` in the test, with a listener and a demand of its own. A node sends no
``Notify`` to the connection whose demand it served; before, the backend made one up before
every delivery and the dispatcher discounted it. Each case ends with a send that no demand
serves, whose ``Notify`` fences what the earlier commit signalled."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from backend_store import StoreOptions
from backend_store.cluster.client.cluster_backend import ClusterBackend, open_cluster_backend
from backend_store.cluster.coordination.layout import Layout
from backend_store.cluster.node.node import Node
from backend_store.types import NewMessage, QueueName, ReceivedMessage, TenantId
from tests.conftest import scaled, wait_for

from .placed import queue_partitions

T = TenantId("acme")
Q = QueueName("signals")


class Signals:
    """What this gateway was told of the queue: wake-ups (listener calls) and deliveries, in order."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, int]] = []
        self.changed = asyncio.Event()

    def listener(self, tenant: TenantId, queue: QueueName) -> None:
        if (tenant, queue) == (T, Q):
            self.seen.append(("wake", 0))
            self.changed.set()

    def deliver(self, messages: list[ReceivedMessage]) -> None:
        self.seen.append(("delivery", len(messages)))
        self.changed.set()

    async def until(self, count: int) -> list[tuple[str, int]]:
        async with asyncio.timeout(scaled(20)):
            while len(self.seen) < count:
                self.changed.clear()
                await self.changed.wait()
        return list(self.seen)


@pytest.fixture
async def backend(
    inprocess_nodes: tuple[Layout, list[Node]], etcd_endpoints: list[str]
) -> AsyncIterator[ClusterBackend]:
    layout, _ = inprocess_nodes
    store = open_cluster_backend(f"cluster://{','.join(etcd_endpoints)}{layout.prefix}", StoreOptions())
    await store.start()
    try:
        await store.create_queue(T, Q, {"partitions": 1, "replication_factor": 1})
        await store.receive(T, Q, 1, 30.0)  # connects to the leader (a demand never dials)
        yield store
    finally:
        await store.close()


async def demand_on_the_leader(
    backend: ClusterBackend, nodes: list[Node], signals: Signals, size: int
) -> None:
    backend.set_demand(T, Q, size, 30.0, signals.deliver)
    [part] = queue_partitions(backend, T, Q)

    async def registered() -> bool:
        return any(node.demands.waiting(part.id, T, Q) for node in nodes)

    await wait_for(registered, 20, "the demand on the partition's leader")


async def send(backend: ClusterBackend, *bodies: str) -> None:
    await backend.send(T, Q, [NewMessage(b.encode()) for b in bodies])


async def test_a_demand_that_took_everything_is_the_commits_only_signal(
    inprocess_nodes: tuple[Layout, list[Node]], backend: ClusterBackend
) -> None:
    _, nodes = inprocess_nodes
    signals = Signals()
    backend.add_listener(signals.listener)
    await demand_on_the_leader(backend, nodes, signals, 10)
    await send(backend, "one", "two")
    assert await signals.until(1) == [("delivery", 2)]
    await send(backend, "fence")  # no demand now: the node's Notify
    assert await signals.until(2) == [("delivery", 2), ("wake", 0)]


async def test_a_full_delivery_wakes_the_listeners_just_before_it(
    inprocess_nodes: tuple[Layout, list[Node]], backend: ClusterBackend
) -> None:
    _, nodes = inprocess_nodes
    signals = Signals()
    backend.add_listener(signals.listener)
    await demand_on_the_leader(backend, nodes, signals, 1)
    await send(backend, "one", "two")  # one of two taken: the other is visible
    assert await signals.until(2) == [("wake", 0), ("delivery", 1)]
    await send(backend, "fence")
    assert await signals.until(3) == [("wake", 0), ("delivery", 1), ("wake", 0)]
