"""A node and a manager started with a low soft open-file limit raise it to the hard one, as
``pushgate serve`` does (backend_store/open_files.py; the gateway's test, with 400 WebSockets,
is tests/gateway/test_open_files.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.fixtures.etcd_server import unique_prefix
from tests.fixtures.process_files import soft_open_file_limit

from .processes import ClusterHarness, ClusterProcess

LOW = ["prlimit", "--nofile=256:4096"]  # execs the command: the PID stays the server's


@pytest.fixture
async def harness(etcd_endpoints: list[str], tmp_path: Path) -> AsyncIterator[ClusterHarness]:
    h = ClusterHarness(etcd_endpoints, tmp_path / "cluster", unique_prefix("nofile") + "/")
    h.root.mkdir()
    try:
        yield await h.start(nodes=1, managers=0, running=0)
    finally:
        await h.close()


def _soft_limit(proc: ClusterProcess) -> int:
    assert proc.process is not None
    return soft_open_file_limit(proc.process.pid)


async def test_a_node_and_a_manager_raise_their_open_file_limit(harness: ClusterHarness) -> None:
    node = harness.nodes["n0"]
    node.wrapper = LOW
    node.start()
    manager_argv = ["manager", "--etcd", ",".join(harness.endpoints), "--id", "m0"]
    manager_argv += ["--prefix", harness.prefix, "--log-level", "info"]
    manager = ClusterProcess("m0", manager_argv, harness.root / "m0.log", wrapper=LOW)
    harness.managers.append(manager)  # stopped with the harness
    manager.start()
    await harness.wait_registered(["n0"])  # the node is up, its limit set before it serves
    assert _soft_limit(node) == 4096
    await harness.wait_for("the manager to log its limit", lambda: _logged(manager))
    assert _soft_limit(manager) == 4096
    assert "open-file limit raised from 256 to 4096" in node.log_path.read_text()


async def _logged(proc: ClusterProcess) -> bool:
    return "open-file limit raised from 256 to 4096" in proc.log_path.read_text()
