"""``pushgate dev-cluster --log-level``: the nodes' and managers' logs in ``DIR/logs`` at the
level asked, warnings only by default (what a failover's timeline needs: each term's start
and first pass are logged at info)."""

from __future__ import annotations

import time
from pathlib import Path

from tests.conftest import scaled
from tests.fixtures.dev_cluster import start_dev_cluster

_REGISTERED = "INFO pushgate.cluster: node node-1: registered at"


def _node_log(data: Path, wait_for: str, within_s: float) -> str:
    """node-1's log once it holds ``wait_for``, or as it is after ``within_s``."""
    path = data / "logs" / "node-1.log"
    deadline = time.monotonic() + within_s
    while True:
        text = path.read_text(errors="replace")
        if wait_for in text or time.monotonic() > deadline:
            return text
        time.sleep(0.05)


def test_the_log_level_reaches_the_nodes(tmp_path: Path) -> None:
    for level, logged in (("info", True), ("warning", False)):
        data = tmp_path / level
        cluster = start_dev_cluster(data, nodes=1, extra=["--log-level", level])
        try:
            # The node registered before the gateway was ready: at info its line is there
            # (or on its way), at warning it never comes.
            node_log = _node_log(data, _REGISTERED, scaled(10) if logged else 0.0)
            assert (_REGISTERED in node_log) is logged, node_log[-2000:]
        finally:
            cluster.stop()
