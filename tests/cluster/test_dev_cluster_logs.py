"""``pushgate dev-cluster --log-level``: the nodes' and managers' logs in ``DIR/logs`` at the
level asked, warnings only by default (what a failover's timeline needs: each term's start
and first pass are logged at info). And ``--lease-ttl``: the nodes hold leases of the TTL
asked, 1 s (dev-cluster's default) included, which etcd at its default election timeout would
not grant (its shortest is 2 s)."""

from __future__ import annotations

import re
import time
from pathlib import Path

from gateway.dev_cluster import etcd_election_timeout_ms
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


def test_the_log_level_and_lease_ttl_reach_the_nodes(tmp_path: Path) -> None:
    # At info, dev-cluster's own default lease (1 s); at warning, 2 s.
    for level, ttl, logged in (("info", None, True), ("warning", "2", False)):
        data = tmp_path / level
        cluster = start_dev_cluster(data, nodes=1, extra=["--log-level", level], lease_ttl=ttl)
        try:
            # The node registered before the gateway was ready: at info its line is there
            # (or on its way), at warning it never comes.
            node_log = _node_log(data, _REGISTERED, scaled(10) if logged else 0.0)
            assert (_REGISTERED in node_log) is logged, node_log[-2000:]
            if logged:
                # The lease etcd granted, as the node counts it: the 1 s dev-cluster asks by default.
                assert re.search(_REGISTERED + r" \S+ \(lease [0-9a-f]+, 1 s\)", node_log), node_log[-2000:]
            # A lease longer than asked is a warning, at either level.
            assert "etcd granted" not in node_log, node_log[-2000:]
        finally:
            cluster.stop()


def test_etcd_is_started_at_an_election_timeout_that_grants_the_lease() -> None:
    # etcd's shortest lease is ceil(3 * ticks // 2 * 100 ms) at its 100 ms heartbeat: at 600 ms
    # (6 ticks) 0.9 s, granted as 1 s; at its default 1,000 ms, 1.5 s, granted as 2 s. Never
    # above etcd's own default; leases are whole seconds (0.4 asks for 1).
    assert [etcd_election_timeout_ms(ttl) for ttl in (0.4, 1, 2, 5)] == [600, 600, 1000, 1000]
