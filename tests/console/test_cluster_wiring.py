"""A store that reports a cluster (the ClusterStatus capability) lights up the nodes page,
the cluster metrics and node alert rules, through the real app factory."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from backend_store import StoreOptions
from backend_store.lmdb_store.engine import LmdbBackend
from gateway.settings import Settings
from tests.gateway.conftest import Api, RunningGateway, api_for

from .conftest import scrape, wait_until
from .test_console_http import CLUSTER_DOC, logged_in


class ReportingStore(LmdbBackend):
    """The embedded store plus a cluster report, standing in for the distributed backend's."""

    async def cluster_status(self) -> Mapping[str, Any]:
        return CLUSTER_DOC


@pytest.fixture(scope="module")
def cluster_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    data = tmp_path_factory.mktemp("cluster-gw")
    settings = Settings(data_dir=data, log_level="warning", graceful_timeout_s=5, monitor_interval_s=0.2)
    running = RunningGateway(settings, ReportingStore(data / "store", StoreOptions())).start()
    try:
        yield running
    finally:
        running.stop()


def test_nodes_metrics_and_node_alerts(cluster_gateway: RunningGateway) -> None:
    with logged_in(cluster_gateway, cluster_gateway.admin_key) as client:
        page = client.get("/console/nodes").text
    assert "10.0.0.2:7000" in page and "no cluster" not in page
    families = {
        f.name: f
        for f in text_string_to_metric_families(scrape(cluster_gateway.url, cluster_gateway.admin_key).text)
    }
    up = {s.labels["node"]: s.value for s in families["pushgate_cluster_node_up"].samples}
    assert up == {"n1": 1.0, "n2": 0.0}
    lag = {s.labels["node"]: s.value for s in families["pushgate_cluster_node_replication_lag"].samples}
    assert lag == {"n1": 0.0, "n2": 42.0}
    assert [s.value for s in families["pushgate_cluster_leader_epoch"].samples] == [7.0]
    for api in api_for(cluster_gateway, cluster_gateway.admin_key):
        assert api.client.post("/v1/alerts/rules", json={"kind": "node_down"}).status_code == 201
        r = api.client.post("/v1/alerts/rules", json={"kind": "replication_lag", "threshold": 10})
        assert r.status_code == 201
        wait_until(lambda a=api: len(_active(a)) == 2, what="node alerts to fire")
        assert sorted((a["kind"], a["subject"]) for a in _active(api)) == [
            ("node_down", "node/n2"),
            ("replication_lag", "node/n2"),
        ]


def _active(api: Api) -> list[dict[str, Any]]:
    active: list[dict[str, Any]] = api.client.get("/v1/alerts").json()["active"]
    return active
