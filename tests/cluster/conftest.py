"""Fixtures of the cluster tests that look inside node stores: two nodes and a manager in
the test process (real etcd, real TCP), and a real gateway on ``cluster://`` in front of them
(its own thread and loop)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from backend_store.cluster.etcd_coordinator import EtcdCoordinator
from backend_store.cluster.layout import Layout
from backend_store.cluster.manager import Manager
from backend_store.cluster.node import Node
from tests.fixtures.dev_cluster import StoreTarget
from tests.fixtures.etcd_server import unique_prefix
from tests.gateway.conftest import RunningGateway
from tests.push.conftest import start_push_gateway


@pytest.fixture
async def inprocess_nodes(
    etcd_endpoints: list[str], tmp_path: Path
) -> AsyncIterator[tuple[Layout, list[Node]]]:
    layout = Layout(unique_prefix("standing") + "/")
    coordinators = [await EtcdCoordinator(etcd_endpoints).connect() for _ in range(3)]
    # No sweeper: the test counts the stores' write operations.
    running = [
        Node(f"n{i}", tmp_path / f"n{i}", coordinators[i], layout=layout, sweep_every_s=0) for i in range(2)
    ]
    manager = Manager(coordinators[2], layout=layout)
    for node in running:
        await node.start()
    await manager.start()
    try:
        yield layout, running
    finally:
        await manager.stop()
        for node in running:
            await node.stop()
        for coordinator in coordinators:
            await coordinator.close()


@pytest.fixture
async def inprocess_gateway(
    inprocess_nodes: tuple[Layout, list[Node]], etcd_endpoints: list[str], tmp_path: Path
) -> AsyncIterator[RunningGateway]:
    layout, _ = inprocess_nodes
    url = f"cluster://{','.join(etcd_endpoints)}{layout.prefix}"
    # A safety poll far past the test: only sends may wake the dispatcher. Started and
    # stopped off this loop, which runs the nodes the gateway talks to.
    running = await asyncio.to_thread(
        start_push_gateway, tmp_path / "gateway", target=StoreTarget(url), safety_poll_s=600.0
    )
    try:
        yield running
    finally:
        await asyncio.to_thread(running.stop)
