"""The console over plain HTTP: session cookie, tenancy, JWT login, streams, the nodes page."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.routing import Mount

from backend_store import StoreOptions, open_backend
from backend_store.types import QueueName, TenantId
from tests.conftest import scaled
from tests.gateway.conftest import Api, RunningGateway, api_for, start_gateway
from web_console.alerts import AlertEngine, RuleStore
from web_console.app import build_console
from web_console.deps import ConsoleDeps
from web_console.monitor import DepthHistory, MonitorSources, QueueSampler
from web_console.session import COOKIE

from .conftest import wait_sampled


def browser(gateway: RunningGateway) -> httpx.Client:
    return httpx.Client(base_url=gateway.url, timeout=scaled(10), follow_redirects=False)


@contextlib.contextmanager
def logged_in(gateway: RunningGateway, token: str) -> Iterator[httpx.Client]:
    with browser(gateway) as client:
        r = client.post("/console/login", data={"token": token})
        assert r.status_code == 303 and r.headers["location"] == "/console/", r.text
        yield client


def test_session_cookie_flags_and_content(ops_gateway: RunningGateway) -> None:
    key = ops_gateway.admin_key
    with browser(ops_gateway) as client:
        assert client.get("/console").headers["location"].endswith("/console/")
        r = client.post("/console/login", data={"token": key})
        cookie = r.headers["set-cookie"]
        assert cookie.startswith(f"{COOKIE}=")
        for flag in ("HttpOnly", "Path=/console", "SameSite=strict"):
            assert flag in cookie
        assert "Secure" not in cookie  # plain HTTP here; with --tls-cert it is Secure
        assert key not in cookie  # the session never carries the key
        # A tampered cookie is no session.
        value = client.cookies[COOKIE]
        client.cookies.set(COOKIE, value[:-2] + ("AA" if not value.endswith("AA") else "BB"), path="/console")
        assert client.get("/console/").status_code == 303


def test_login_needs_an_admin_key_or_jwt(ops_gateway: RunningGateway) -> None:
    tenant = ops_gateway.make_tenant()
    with browser(ops_gateway) as client:
        for scopes in ("send:* receive:*", "manage:*"):
            r = client.post("/console/login", data={"token": ops_gateway.make_key(scopes, tenant)})
            assert r.status_code == 403 and "admin scope" in r.text
        assert client.post("/console/login", data={"token": ""}).status_code == 401
        # A cross-site form post to the login is refused too.
        r = client.post("/console/login", data={"token": "x"}, headers={"origin": "https://evil.example"})
        assert r.status_code == 403
    admin = ops_gateway.make_key("admin", tenant)
    jwt = httpx.post(
        f"{ops_gateway.url}/v1/tokens", json={"ttl_s": 600}, headers={"Authorization": f"Bearer {admin}"}
    ).json()
    with browser(ops_gateway) as client:
        r = client.post("/console/login", data={"token": jwt["token"]})
        # The session ends with the JWT: its cookie lives no longer than the token.
        max_age = int(r.headers["set-cookie"].split("Max-Age=")[1].split(";")[0])
        assert 0 < max_age <= 600
        page = client.get("/console/")
        assert page.status_code == 200 and f"tenant <b>{tenant}</b>" in page.text


def test_a_tenant_sees_only_its_own_queues(ops_gateway: RunningGateway, qname: str) -> None:
    mine, theirs = ops_gateway.make_tenant(), ops_gateway.make_tenant()
    for tenant, name in ((mine, f"{qname}-mine"), (theirs, f"{qname}-theirs")):
        for api in api_for(ops_gateway, ops_gateway.make_key("admin", tenant)):
            api.put_queue(name)
    wait_sampled(ops_gateway, f"{qname}-mine", f"{qname}-theirs")
    with logged_in(ops_gateway, ops_gateway.make_key("admin", mine)) as client:
        page = client.get("/console/").text
        assert f"{qname}-mine" in page and f"{qname}-theirs" not in page
        assert client.get(f"/console/queues/{qname}-theirs").status_code == 404
        assert client.get(f"/console/queues/{qname}-mine").status_code == 200
        # Purge and redrive act in the session's tenant: the other tenant's queue is not there.
        csrf = _csrf(client.get(f"/console/queues/{qname}-mine").text)
        r = client.post(
            f"/console/queues/{qname}-theirs/purge", data={"csrf": csrf, "confirm": f"{qname}-theirs"}
        )
        assert r.status_code == 303 and "Purge%20failed" in r.headers["location"]
        # The nodes page is the operator's.
        assert "operator tenant" in client.get("/console/nodes").text
    with logged_in(ops_gateway, ops_gateway.admin_key) as client:
        assert "no cluster" in client.get("/console/nodes").text


def test_live_stream_sends_samples(ops_gateway: RunningGateway, admin: Api, qname: str) -> None:
    admin.put_queue(qname)
    with (
        logged_in(ops_gateway, ops_gateway.admin_key) as client,
        client.stream("GET", f"/console/queues/{qname}/events") as stream,
    ):
        assert stream.headers["content-type"].startswith("text/event-stream")
        lines = stream.iter_lines()
        assert next(lines) == "retry: 2000"
        events = [line for line in _take(lines, 8) if line.startswith("event:")]
        assert events and events[0] == "event: queue"
    with browser(ops_gateway) as stranger:
        assert stranger.get(f"/console/queues/{qname}/events").status_code == 401


def _take(lines: Iterator[str], n: int) -> list[str]:
    out = []
    for line in lines:
        out.append(line)
        if len(out) >= n:
            break
    return out


def _csrf(page: str) -> str:
    marker = 'name="csrf" value="'
    start = page.index(marker) + len(marker)
    return page[start : page.index('"', start)]


CLUSTER_DOC: Mapping[str, Any] = {
    "nodes": [
        {"id": "n1", "address": "10.0.0.1:7000", "state": "up", "lag": 0},
        {"id": "n2", "address": "10.0.0.2:7000", "state": "down", "lag": 42},
    ],
    "partitions": [
        {
            "queue": "orders",
            "index": 0,
            "leader": "n1",
            "followers": ["n2"],
            "epoch": 7,
            "lsn": 1234,
            "replicas": [{"node": "n1", "lsn": 1234}, {"node": "n2", "lsn": 1192}],
        }
    ],
}


@pytest.fixture
async def cluster_console(tmp_path: Any) -> Any:
    """The console app on its own, with a cluster source shaped as API.md's GET /v1/cluster."""
    store = open_backend(f"lmdb://{tmp_path / 'store'}", StoreOptions(sweep_interval_s=0))
    await store.start()

    async def tenants() -> list[str]:
        return ["default"]

    async def cluster() -> Mapping[str, Any]:
        return CLUSTER_DOC

    class Operator:
        tenant = "default"
        subject = "k1"
        scopes = frozenset({"admin"})
        expires_at = None
        key_id = "k1"
        kid = None
        via = "api_key"

    async def authenticate(token: str) -> Operator | None:
        return Operator() if token == "good" else None

    await store.create_queue(TenantId("default"), QueueName("orders"), {})
    history = DepthHistory()
    sampler = QueueSampler(MonitorSources(store, tenants, cluster=cluster), history=history)
    await sampler.sample()
    deps = ConsoleDeps(
        store=store,
        authenticate=authenticate,
        sampler=sampler,
        alerts=AlertEngine(RuleStore(store), history),
        secret=b"s" * 32,
        secure_cookies=True,
        operator_tenant="default",
    )
    try:
        yield build_console(deps)
    finally:
        await store.close()


async def test_nodes_page_shows_cluster_nodes(cluster_console: Any) -> None:
    # The app on its own, in process (httpx's ASGI transport), mounted where the gateway mounts it.
    app = Starlette(routes=[Mount("/console", app=cluster_console)])
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="https://testserver") as client:
        r = await client.post("/console/login", data={"token": "good"})
        assert r.status_code == 303
        assert "Secure" in r.headers["set-cookie"]  # TLS: the cookie is Secure
        assert (await client.post("/console/login", data={"token": "bad"})).status_code == 401
        page = (await client.get("/console/nodes")).text
        partitions = (await client.get("/console/partitions")).text
        node = (await client.get("/console/nodes/n2")).text
    assert "10.0.0.1:7000" in page and "10.0.0.2:7000" in page
    row1 = page[page.index(">n1<") : page.index(">n2<")]
    assert ">1, leads 1<" in row1 and 'class="state ok" data-field="state">up<' in row1
    row2 = page[page.index(">n2<") :]
    assert (
        '"placed">1<' in row2 and '"lag">42<' in row2 and 'class="state bad" data-field="state">down' in row2
    )
    # The partition map: leader, follower, epoch and the leader's log position.
    row = partitions[partitions.index('id="partition-0"') :]
    assert '<a href="/console/nodes/n1">n1</a>' in row and 'data-node="n2"' in row
    assert "<td>7</td><td>1234</td>" in row
    # A node's page: each partition placed on it with its role, its log position and lag there.
    placed = node[node.index('<tr data-partition="0">') :]
    placed = placed[: placed.index("</tr>")]
    assert "<td>follower</td>" in placed and "<td>1192</td>" in placed and ">42</td>" in placed, placed


def test_live_streams_end_when_shutdown_begins(tmp_path: Any) -> None:
    # Otherwise an open console tab would hold a graceful shutdown up for its whole timeout.
    gateway = start_gateway(tmp_path / "gw", monitor_interval_s=0.2)
    try:
        with (
            logged_in(gateway, gateway.admin_key) as client,
            client.stream("GET", "/console/events", timeout=scaled(10)) as stream,
        ):
            lines = stream.iter_lines()
            assert next(lines) == "retry: 2000"
            assert next(lines) == ""
            assert next(lines) == "event: overview"
            gateway.call(gateway.services.drain())
            rest = list(lines)  # ends (instead of a read timeout) once the stream is closed
            assert all(not line.startswith("event:") or line == "event: overview" for line in rest)
    finally:
        gateway.stop()
