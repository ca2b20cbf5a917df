"""The console's new pages over plain HTTP on the embedded store: a console page for a URL
that does not exist, rates beside the depth chart, the audited purge, and what the
cluster pages and drain actions say where there is no cluster or no operator."""

from __future__ import annotations

from pathlib import Path

import orjson

from tests.gateway.conftest import Api, RunningGateway

from .conftest import wait_sampled
from .test_console_http import _csrf, _take, browser, logged_in


def test_a_console_url_that_does_not_exist_is_a_console_page(ops_gateway: RunningGateway) -> None:
    with logged_in(ops_gateway, ops_gateway.admin_key) as client:
        r = client.get("/console/no/such/page")
        assert r.status_code == 404 and r.headers["content-type"].startswith("text/html")
        assert "The console has no page at <code>/console/no/such/page</code>" in r.text
        assert '<nav aria-label="Console">' in r.text and 'href="/console/alerts"' in r.text
        assert 'href="/console/partitions"' in r.text  # the operator's navigation
        assert client.get("/console/nodes/nope").status_code == 404
    with browser(ops_gateway) as stranger:
        r = stranger.get("/console/nothing-here")
        assert r.status_code == 404 and 'href="/console/login"' in r.text


def test_queue_page_shows_rates_beside_depth(ops_gateway: RunningGateway, admin: Api, qname: str) -> None:
    admin.put_queue(qname)
    admin.send(qname, "one")
    wait_sampled(ops_gateway, qname)
    with logged_in(ops_gateway, ops_gateway.admin_key) as client:
        page = client.get(f"/console/queues/{qname}").text
        charts = page[page.index('<div class="charts">') :]
        assert charts.index('id="chart"') < charts.index('id="rates-chart"')
        for field in ("send_rate", "delivered_rate", "ack_rate", "dead_letter_rate"):
            assert f'data-field="{field}"' in page
        assert 'id="queue-partitions"' not in page  # embedded: no partitions
        with client.stream("GET", f"/console/queues/{qname}/events") as stream:
            data = next(line for line in _take(stream.iter_lines(), 12) if line.startswith("data: {"))
    doc = orjson.loads(data[len("data: ") :])
    assert set(doc["queue"]) >= {"delivered_rate", "dead_letter_rate"}
    assert "rates-chart" in doc["fragments"]


def test_a_purge_in_the_console_is_audited(ops_gateway: RunningGateway, admin: Api, qname: str) -> None:
    admin.put_queue(qname)
    admin.send(qname, "x")
    wait_sampled(ops_gateway, qname)
    with logged_in(ops_gateway, ops_gateway.admin_key) as client:
        csrf = _csrf(client.get(f"/console/queues/{qname}").text)
        r = client.post(f"/console/queues/{qname}/purge", data={"csrf": csrf, "confirm": qname})
        assert r.status_code == 303 and "Purged%201" in r.headers["location"]
    records = [
        orjson.loads(line)
        for path in sorted(Path(ops_gateway.settings.data_dir, "audit").glob("date=*/audit.jsonl"))
        for line in path.read_bytes().splitlines()
    ]
    [record] = [r for r in records if r["action"] == "queue.purged" and r["target"] == qname]
    assert (record["source"], record["tenant"], record["details"]) == ("console", "default", {"purged": 1})


def test_cluster_pages_without_a_cluster_or_as_a_tenant(ops_gateway: RunningGateway) -> None:
    with logged_in(ops_gateway, ops_gateway.admin_key) as client:
        assert "there are no partitions" in client.get("/console/partitions").text
        page = client.get("/console/nodes").text
        assert "no cluster" in page and 'id="store-growth"' in page
    tenant_key = ops_gateway.make_key("admin", ops_gateway.make_tenant())
    with logged_in(ops_gateway, tenant_key) as client:
        assert "operator tenant's admins only" in client.get("/console/partitions").text
        csrf = _csrf(client.get("/console/").text)
        r = client.post("/console/nodes/n1/drain", data={"csrf": csrf, "confirm": "n1"})
        assert r.status_code == 403 and "operator tenant" in r.text
        with client.stream("GET", "/console/nodes/events") as stream:
            assert [line for line in stream.iter_lines() if line.startswith("event:")] == ["event: gone"]
