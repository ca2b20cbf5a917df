"""Operations endpoints: liveness, readiness, Prometheus metrics."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import httpx

from tests.fixtures.dev_cluster import StoreTarget

from .conftest import Api, RunningGateway, problem_code, start_gateway


def test_healthz_and_readyz_need_no_token(gateway: RunningGateway) -> None:
    assert httpx.get(f"{gateway.url}/healthz").json() == {"status": "ok"}
    r = httpx.get(f"{gateway.url}/readyz")
    assert r.status_code == 200
    assert r.json() == {"status": "ready", "shared_state": {"url": "memory://", "status": "up"}}


def test_metrics_count_requests_by_route_template(gateway: RunningGateway, admin: Api, qname: str) -> None:
    admin.put_queue(qname)
    admin.send(qname)
    admin.client.get("/v1/nothing/here")
    r = admin.client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    text = r.text
    assert (
        'pushgate_http_requests_total{code="201",method="POST",route="/v1/queues/{queue}/messages"}' in text
    )
    assert 'route="unmatched"' in text
    assert "pushgate_http_request_duration_seconds_bucket" in text
    assert 'pushgate_messages_total{event="sent",transport="http"}' in text
    assert f'route="/v1/queues/{qname}' not in text, "queue names must not become route labels"


def test_queue_cache_is_invalidated_by_changes(gateway: RunningGateway, admin: Api, qname: str) -> None:
    admin.put_queue(qname, receive_wait_s=20)
    # PATCH through this gateway: the next receive uses the new default wait at once.
    admin.client.patch(f"/v1/queues/{qname}", json={"receive_wait_s": 0})
    r = admin.client.post(f"/v1/queues/{qname}/receive", json={}, timeout=5)
    assert r.json() == {"messages": []}
    admin.client.delete(f"/v1/queues/{qname}")
    assert admin.client.post(f"/v1/queues/{qname}/receive", json={}).status_code == 404


def test_readyz_is_503_when_the_store_cannot_take_writes(tmp_path: Path, store_target: StoreTarget) -> None:
    # docs/http.md: ready "after a no-op write commits; 503 unavailable otherwise". The store
    # is closed under the running gateway (as after a fatal store error): liveness stays.
    gateway = start_gateway(tmp_path, target=store_target)
    try:
        assert httpx.get(f"{gateway.url}/readyz").status_code == 200
        gateway.call(gateway.services.backend.close())
        r = httpx.get(f"{gateway.url}/readyz")
        assert problem_code(r, 503) == "unavailable"
        assert httpx.get(f"{gateway.url}/healthz").json() == {"status": "ok"}
    finally:
        gateway.stop()


def test_cluster_document_is_for_cluster_mode_only(
    admin: Api, anon: Api, store_target: StoreTarget, qname: str
) -> None:
    # docs/api.md: GET /v1/cluster needs admin; the embedded store has no cluster (404).
    assert problem_code(anon.client.get("/v1/cluster"), 401) == "unauthorized"
    if store_target.url is None:
        assert problem_code(admin.client.get("/v1/cluster"), 404) == "not_found"
        return
    assert admin.put_queue(qname).status_code in (200, 201)
    # On cluster://, the operator's document (tests/cluster checks it field by field).
    r = admin.client.get("/v1/cluster")
    assert r.status_code == 200, r.text
    assert {n["state"] for n in r.json()["nodes"]} == {"up"}
    # `pushgate dev-cluster` (this pass's cluster, started as a user starts it) gives each pool
    # of queues one partition, whatever its nodes (docs/cluster.md, "Partitions per pool").
    pools = Counter(p["queue"] for p in r.json()["partitions"] if p["tenant"] == "")
    assert pools, r.json()["partitions"]
    assert set(pools.values()) == {1}, pools
