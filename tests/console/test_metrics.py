"""/metrics: who may read it, what it holds (checked against the catalogue and docs/metrics.md)."""

from __future__ import annotations

from pathlib import Path

import httpx
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from gateway.metrics_catalog import BY_NAME, CATALOG, markdown_table
from tests.conftest import scaled
from tests.gateway.conftest import Api, RunningGateway, api_for

from .conftest import QUEUE_SERIES, operations, scrape, wait_sampled, wait_until

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def families(text: str) -> dict[str, Metric]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_metrics_need_the_metrics_scope(ops_gateway: RunningGateway) -> None:
    assert scrape(ops_gateway.url).status_code == 401
    sender = ops_gateway.make_key("send:* receive:*")
    assert scrape(ops_gateway.url, sender).status_code == 403
    assert scrape(ops_gateway.url, ops_gateway.make_key("metrics")).status_code == 200
    assert scrape(ops_gateway.url, ops_gateway.admin_key).status_code == 200


def test_the_metrics_listener_needs_no_token(ops_gateway: RunningGateway) -> None:
    listener = operations(ops_gateway).listener
    assert listener is not None
    base = f"http://127.0.0.1:{listener.bound_port}"
    r = httpx.get(f"{base}/metrics", timeout=scaled(10))
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    assert "pushgate_http_requests_total" in r.text
    assert httpx.get(f"{base}/v1/queues", timeout=scaled(10)).status_code == 404


def test_every_exported_family_is_documented_and_no_created_series(
    ops_gateway: RunningGateway, admin: Api, qname: str
) -> None:
    admin.put_queue(qname)
    admin.send(qname)
    admin.client.get("/v1/nothing")
    text = scrape(ops_gateway.url, ops_gateway.admin_key).text
    parsed = families(text)
    undocumented = sorted(set(parsed) - set(BY_NAME))
    assert not undocumented, f"exported but not in gateway/metrics_catalog.py: {undocumented}"
    for name, family in parsed.items():
        doc = BY_NAME[name]
        assert family.type == doc.type, name
        for sample in family.samples:
            assert not sample.name.endswith("_created"), sample.name
            labels = set(sample.labels) - {"le"}
            assert labels == set(doc.labels), (name, labels)
    # Everything documented as always present is there (the rest depends on a cluster etc.).
    missing = [m.name for m in CATALOG if m.when == "always" and m.name not in parsed]
    assert not missing, f"documented but not exported: {missing}"
    assert "_created" not in text


def test_docs_table_is_the_catalogue() -> None:
    text = DOC.read_text()
    start = text.index("<!-- metrics-table:start -->") + len("<!-- metrics-table:start -->\n")
    end = text.index("<!-- metrics-table:end -->")
    assert text[start:end] == markdown_table(), "regenerate with: python -m gateway.metrics_catalog"


def test_queue_series_are_bounded_and_sums_are_kept(
    ops_gateway: RunningGateway, tenant_admin: Api, qname: str
) -> None:
    names = [f"{qname}-{i}" for i in range(QUEUE_SERIES + 3)]
    for i, name in enumerate(names):
        tenant_admin.put_queue(name)
        for _ in range(i + 1):
            tenant_admin.send(name)
    sampler = operations(ops_gateway).sampler
    mine = set(names)
    wait_until(
        lambda: (
            sum(q.sent_total for q in sampler.latest.queues if q.name in mine)
            == sum(range(1, len(names) + 1))
        ),
        what="the sampler to see every send",
    )
    parsed = families(scrape(ops_gateway.url, ops_gateway.admin_key).text)
    series = {(s.labels["tenant"], s.labels["queue"]) for s in parsed["pushgate_queue_sent"].samples}
    queues = int(parsed["pushgate_queues"].samples[0].value)
    folded = int(parsed["pushgate_queue_series_folded"].samples[0].value)
    assert queues >= len(names)
    assert ("_other", "_other") in series
    assert len(series) == QUEUE_SERIES + 1
    assert folded == queues - QUEUE_SERIES
    # Nothing is lost by folding: the series add up to every queue's total (sends only
    # happen in this test now, so the sampler's figures are the scrape's).
    exported = sum(s.value for s in parsed["pushgate_queue_sent"].samples)
    assert exported == sum(q.sent_total for q in sampler.latest.queues)


def test_store_and_request_figures(ops_gateway: RunningGateway, admin: Api, qname: str) -> None:
    admin.put_queue(qname)
    admin.send(qname)
    httpx.get(f"{ops_gateway.url}/v1/queues", timeout=scaled(10))  # a 401
    parsed = families(scrape(ops_gateway.url, ops_gateway.admin_key).text)
    batch = parsed["pushgate_store_commit_batch_size"]
    count = next(s for s in batch.samples if s.name.endswith("_count")).value
    assert count >= 2
    duration = parsed["pushgate_store_commit_duration_seconds"]
    assert next(s for s in duration.samples if s.name.endswith("_sum")).value > 0
    ratio = parsed["pushgate_store_map_used_ratio"].samples[0].value
    assert 0 < ratio < 1
    requests = parsed["pushgate_http_requests"].samples
    assert any(
        s.labels["route"] == "/v1/queues/{queue}/messages" and s.labels["code"] == "201" for s in requests
    )
    failures = parsed["pushgate_http_auth_failures"].samples
    assert any(s.labels["code"] == "401" and s.value >= 1 for s in failures)


def test_a_tenants_scrape_shows_only_its_own_queues(ops_gateway: RunningGateway, qname: str) -> None:
    mine, theirs = ops_gateway.make_tenant(), ops_gateway.make_tenant()
    for tenant in (mine, theirs):
        for api in api_for(ops_gateway, ops_gateway.make_key("admin", tenant)):
            api.put_queue(f"{qname}-{tenant}")
            # A rule gives each tenant a series the queue-series limit cannot fold away.
            api.client.post("/v1/alerts/rules", json={"kind": "queue_depth", "threshold": 1000})
    # More queues than the series limit, whatever other tests left in this gateway, so that
    # some are folded into _other (CI once ran this test where fewer queues existed).
    crowd = [f"{qname}-crowd-{i}" for i in range(QUEUE_SERIES)]
    for api in api_for(ops_gateway, ops_gateway.make_key("admin", theirs)):
        for name in crowd:
            api.put_queue(name)
    wait_sampled(ops_gateway, f"{qname}-{mine}", f"{qname}-{theirs}", *crowd)

    def tenants_in(token: str) -> set[str]:
        text = scrape(ops_gateway.url, token).text
        return {
            s.labels["tenant"]
            for f in text_string_to_metric_families(text)
            for s in f.samples
            if "tenant" in s.labels
        }

    assert tenants_in(ops_gateway.make_key("metrics", mine)) == {mine}
    assert (
        "pushgate_http_requests_total" in scrape(ops_gateway.url, ops_gateway.make_key("metrics", mine)).text
    )
    # The operator tenant's keys see everyone (here _other too: the series limit is small).
    everyone = tenants_in(ops_gateway.admin_key)
    assert {"_other", mine, theirs} <= everyone
