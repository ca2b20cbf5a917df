"""``pushgate dev-cluster --log-level``: the nodes' and managers' logs in ``DIR/logs`` at the
level asked, warnings only by default (what a failover's timeline needs: each term's start
and first pass are logged at info)."""

from __future__ import annotations

from pathlib import Path

from tests.fixtures.dev_cluster import start_dev_cluster

_REGISTERED = "INFO pushgate.cluster: node node-1: registered at"


def test_the_log_level_reaches_the_nodes(tmp_path: Path) -> None:
    for level, logged in (("info", True), ("warning", False)):
        data = tmp_path / level
        cluster = start_dev_cluster(data, nodes=1, extra=["--log-level", level])
        try:
            # A node logs its registration before the gateway can be ready.
            node_log = (data / "logs" / "node-1.log").read_text(errors="replace")
            assert (_REGISTERED in node_log) is logged, node_log[-2000:]
        finally:
            cluster.stop()
