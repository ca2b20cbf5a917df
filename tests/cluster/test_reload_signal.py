"""SIGHUP never stops a node or a manager: ``systemctl reload`` sends it to every role
(deploy/systemd/), and its default action ends a process that does not catch it. A node with
TLS reloads its certificates on it (tests/cluster/test_tls_reload.py); without TLS, and in a
manager, there is nothing to reload and the process goes on serving."""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.fixtures.etcd_server import unique_prefix

from .processes import ClusterHarness, ClusterProcess


@pytest.fixture
async def harness(etcd_endpoints: list[str], tmp_path: Path) -> AsyncIterator[ClusterHarness]:
    h = ClusterHarness(etcd_endpoints, tmp_path / "cluster", unique_prefix("sighup") + "/")
    h.root.mkdir()
    try:
        yield await h.start(nodes=1, managers=1)
    finally:
        await h.close()


async def test_sighup_leaves_a_node_and_a_manager_running(harness: ClusterHarness) -> None:
    await harness.wait_registered(["n0"])
    (manager,) = harness.managers
    await harness.wait_for("the manager to start", lambda: _says(manager, "started"))
    processes: list[ClusterProcess] = [harness.nodes["n0"], *harness.managers]
    for proc in processes:
        proc.signal(signal.SIGHUP)
    for proc in processes:
        await harness.wait_for(
            f"{proc.name} to log the SIGHUP", lambda p=proc: _says(p, "SIGHUP: nothing to reload"), timeout=10
        )
        assert proc.running, f"{proc.name} ended on SIGHUP\n{proc.log_tail()}"
    # Still a member: the node's record is in etcd, under its live lease.
    await harness.wait_registered(["n0"])


async def _says(proc: ClusterProcess, text: str) -> bool:
    """The line is in its log, or it ended (and the assertion after the wait says so)."""
    return text in proc.log_path.read_text() or not proc.running
