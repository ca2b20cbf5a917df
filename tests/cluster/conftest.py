"""Fixtures of the cluster tests: three real node processes and a manager with a real gateway
on ``cluster://`` in front of them (``harness``, ``cluster_gateway``); and, for tests that look
inside node stores, two nodes and a manager in the test process (real etcd, real TCP) with a
real gateway in front of them (its own thread and loop)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from backend_store.cluster.coordination.etcd_coordinator import EtcdCoordinator
from backend_store.cluster.coordination.layout import Layout
from backend_store.cluster.manager.manager import Manager
from backend_store.cluster.node.local_ports import local_node
from backend_store.cluster.node.node import Node
from backend_store.cluster.node.node_config import NodeConfig
from gateway.settings import Settings
from tests.fixtures.dev_cluster import StoreTarget
from tests.fixtures.etcd_server import unique_prefix
from tests.gateway.conftest import RunningGateway
from tests.push.conftest import start_push_gateway

from .processes import ClusterHarness


@pytest.fixture
async def harness(
    etcd_endpoints: list[str], tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[ClusterHarness]:
    """Three ``pushgate node`` processes and a manager, under a prefix of their own."""
    name = request.module.__name__.rsplit(".", 1)[-1].removeprefix("test_")
    h = ClusterHarness(etcd_endpoints, tmp_path / "cluster", unique_prefix(name) + "/")
    (tmp_path / "cluster").mkdir()
    try:
        yield await h.start(nodes=3, managers=1)
    finally:
        await h.close()


@contextlib.contextmanager
def running_cluster_gateway(
    harness: ClusterHarness, data_dir: Path, **settings: Any
) -> Iterator[RunningGateway]:
    """A gateway on ``cluster://`` in front of ``harness`` (its own thread and loop)."""
    url = f"cluster://{','.join(harness.endpoints)}{harness.prefix}"
    running = RunningGateway(
        Settings(data_dir=data_dir, store_url=url, log_level="warning", graceful_timeout_s=5, **settings)
    ).start()
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def cluster_gateway(harness: ClusterHarness, tmp_path: Path) -> Iterator[RunningGateway]:
    with running_cluster_gateway(harness, tmp_path / "gateway") as running:
        yield running


@pytest.fixture
async def inprocess_nodes(
    etcd_endpoints: list[str], tmp_path: Path
) -> AsyncIterator[tuple[Layout, list[Node]]]:
    layout = Layout(unique_prefix("standing") + "/")
    coordinators = [await EtcdCoordinator(etcd_endpoints).connect() for _ in range(3)]
    # No sweeper: the test counts the stores' write operations.
    running = [
        local_node(NodeConfig(f"n{i}", tmp_path / f"n{i}", layout=layout), coordinators[i], sweep_every_s=0)
        for i in range(2)
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
