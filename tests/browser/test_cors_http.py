"""The origin rule and CORS headers, exactly, over plain HTTP (the browser tests show the effect).

Every route a browser uses (send, receive, ack, nack, visibility, SSE, tokens, queues) must
refuse a foreign ``Origin`` before it acts; allowed ones get the exact CORS headers.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed
from websockets.typing import Origin, Subprotocol

from gateway.cors import ALLOWED_HEADERS, ALLOWED_METHODS, EXPOSED_HEADERS, PREFLIGHT_MAX_AGE_S
from gateway.origins import same_origin
from tests.conftest import scaled
from tests.gateway.conftest import problem_code

from .conftest import PageServer, WebGateway

FOREIGN = "https://evil.example"
_names = itertools.count()


@pytest.fixture
def qname() -> str:
    return f"cors{next(_names)}"


@pytest.fixture
def http(web: WebGateway) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=web.url, timeout=scaled(30)) as client:
        yield client


def auth(key: str, origin: str | None = None, **extra: str) -> dict[str, str]:
    headers = {"Authorization": f"Bearer {key}", **extra}
    if origin is not None:
        headers["Origin"] = origin
    return headers


def make_queue(http: httpx.Client, key: str, name: str) -> str:
    assert http.put(f"/v1/queues/{name}", json={}, headers=auth(key)).status_code == 201
    return name


def counts(http: httpx.Client, key: str, queue: str) -> tuple[int, int]:
    stats = http.get(f"/v1/queues/{queue}", headers=auth(key)).json()["stats"]
    return stats["visible"], stats["in_flight"]


def test_requests_without_origin_get_no_cors_headers(web: WebGateway, http: httpx.Client, qname: str) -> None:
    make_queue(http, web.key, qname)
    response = http.post(f"/v1/queues/{qname}/messages", json={"body": "x"}, headers=auth(web.key))
    assert response.status_code == 201
    assert not [h for h in response.headers if h.lower().startswith("access-control-")]
    assert "vary" not in response.headers


def test_allowed_origin_gets_exact_cors_headers(
    web: WebGateway, http: httpx.Client, page_server: PageServer, qname: str
) -> None:
    make_queue(http, web.key, qname)
    origin = page_server.allowed
    response = http.post(f"/v1/queues/{qname}/messages", json={"body": "x"}, headers=auth(web.key, origin))
    assert response.status_code == 201, response.text
    assert response.headers["access-control-allow-origin"] == origin
    assert response.headers["vary"] == "Origin"
    assert response.headers["access-control-expose-headers"] == EXPOSED_HEADERS
    assert "access-control-allow-credentials" not in response.headers
    # An origin spelled with the default port or in capitals is the same origin.
    spelled = origin.upper().replace("HTTP://", "http://")
    again = http.post(f"/v1/queues/{qname}/messages", json={"body": "y"}, headers=auth(web.key, spelled))
    assert again.status_code == 201
    assert again.headers["access-control-allow-origin"] == spelled


def test_foreign_origin_refused_on_every_route(web: WebGateway, http: httpx.Client, qname: str) -> None:
    make_queue(http, web.key, qname)
    assert (
        http.post(f"/v1/queues/{qname}/messages", json={"body": "x"}, headers=auth(web.key)).status_code
        == 201
    )
    received = http.post(f"/v1/queues/{qname}/receive", json={"max": 1}, headers=auth(web.key)).json()
    receipt = received["messages"][0]["receipt"]
    requests: list[tuple[str, str, Any]] = [
        ("POST", f"/v1/queues/{qname}/messages", {"body": "evil"}),
        ("POST", f"/v1/queues/{qname}/receive", {"max": 10}),
        ("POST", f"/v1/queues/{qname}/ack", {"receipts": [receipt]}),
        ("POST", f"/v1/queues/{qname}/nack", {"receipts": [receipt]}),
        ("POST", f"/v1/queues/{qname}/visibility", {"receipt": receipt, "timeout_s": 1}),
        ("DELETE", f"/v1/queues/{qname}/messages/{receipt}", None),
        ("GET", f"/v1/queues/{qname}/events", None),
        ("POST", "/v1/tokens", {"ttl_s": 60}),
        ("GET", "/v1/queues", None),
        ("PUT", f"/v1/queues/{qname}-evil", {}),
        ("DELETE", f"/v1/queues/{qname}", None),
    ]
    for method, path, body in requests:
        response = http.request(method, path, json=body, headers=auth(web.key, FOREIGN))
        assert problem_code(response, 403) == "forbidden", (method, path)
        assert "access-control-allow-origin" not in response.headers, (method, path)
        assert FOREIGN in response.json()["detail"]
    # Nothing happened: one message, still in flight under the first receipt.
    assert counts(http, web.key, qname) == (0, 1)
    assert http.get(f"/v1/queues/{qname}-evil", headers=auth(web.key)).status_code == 404
    acked = http.post(f"/v1/queues/{qname}/ack", json={"receipts": [receipt]}, headers=auth(web.key))
    assert acked.json()["acked"] == 1


def test_tenant_without_origins_refuses_every_browser(
    web: WebGateway, http: httpx.Client, qname: str
) -> None:
    # The case: the bootstrap key (tenant "default", no origins) with a foreign Origin.
    admin = web.gateway.admin_key
    make_queue(http, admin, qname)
    sent = http.post(f"/v1/queues/{qname}/messages", json={"body": "x"}, headers=auth(admin, FOREIGN))
    assert problem_code(sent, 403) == "forbidden"
    with http.stream(
        "GET", f"/v1/queues/{qname}/events?access_token={admin}", headers={"Origin": FOREIGN}
    ) as sse:
        assert sse.status_code == 403
    assert counts(http, admin, qname) == (0, 0)


def test_the_gateways_own_origin_is_allowed(web: WebGateway, http: httpx.Client, qname: str) -> None:
    # Pages the gateway serves (/docs) send Origin on their POSTs; the default tenant lists none.
    admin = web.gateway.admin_key
    make_queue(http, admin, qname)
    own = web.url  # http://127.0.0.1:<port>, the Host the request goes to
    response = http.post(f"/v1/queues/{qname}/messages", json={"body": "x"}, headers=auth(admin, own))
    assert response.status_code == 201
    assert "access-control-allow-origin" not in response.headers  # same-origin needs none


def test_preflight_needs_no_credentials(web: WebGateway, http: httpx.Client, page_server: PageServer) -> None:
    ask = {
        "Origin": page_server.allowed,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type, idempotency-key",
    }
    response = http.options("/v1/queues/anything/ack", headers=ask)
    assert response.status_code == 204
    assert response.headers["access-control-allow-origin"] == page_server.allowed
    assert response.headers["access-control-allow-methods"] == ALLOWED_METHODS
    assert response.headers["access-control-allow-headers"] == ALLOWED_HEADERS
    for needed in ("Authorization", "Content-Type", "Idempotency-Key", "Last-Event-ID"):
        assert needed in ALLOWED_HEADERS
    assert response.headers["access-control-max-age"] == str(PREFLIGHT_MAX_AGE_S)
    assert response.headers["vary"] == "Origin"
    assert "access-control-allow-credentials" not in response.headers
    refused = http.options("/v1/queues/anything/ack", headers={**ask, "Origin": FOREIGN})
    assert problem_code(refused, 403) == "forbidden"
    assert "access-control-allow-origin" not in refused.headers
    # An OPTIONS that is no preflight is still the route's business (405 with Allow).
    assert http.options("/v1/queues/anything/ack").status_code == 405


def test_unauthenticated_answers_are_readable_by_any_origin(web: WebGateway, http: httpx.Client) -> None:
    # A page must be able to read that its token expired; a 401 reveals nothing else.
    response = http.post("/v1/queues/q/messages", json={"body": "x"}, headers={"Origin": FOREIGN})
    assert problem_code(response, 401) == "unauthorized"
    assert response.headers["access-control-allow-origin"] == "*"
    bad = http.post("/v1/queues/q/messages", json={"body": "x"}, headers=auth("pg_bad", FOREIGN))
    assert problem_code(bad, 401) == "unauthorized"
    assert bad.headers["access-control-allow-origin"] == "*"
    assert http.get("/healthz", headers={"Origin": FOREIGN}).headers["access-control-allow-origin"] == "*"


def test_websocket_uses_the_same_rule(web: WebGateway, page_server: PageServer) -> None:
    ws_url = web.url.replace("http://", "ws://") + "/v1/ws"

    async def close_code(origin: str, key: str) -> int | None:
        async with connect(ws_url, subprotocols=[Subprotocol("pushgate.v1")], origin=Origin(origin)) as ws:
            await ws.send(f'{{"op": "auth", "token": "{key}", "id": 1}}')
            try:
                reply = await asyncio.wait_for(ws.recv(), scaled(10))
            except ConnectionClosed as exc:
                return exc.rcvd.code if exc.rcvd else None
            assert '"ok"' in str(reply)
            return None

    async def run() -> None:
        assert await close_code(FOREIGN, web.key) == 4003
        assert await close_code(page_server.allowed, web.key) is None
        # The gateway's own origin, for a tenant that lists none.
        assert await close_code(web.url, web.gateway.admin_key) is None
        assert await close_code(page_server.allowed, web.gateway.admin_key) == 4003

    asyncio.run(run())


@pytest.mark.parametrize(
    ("origin", "host", "same"),
    [
        ("http://127.0.0.1:8080", "127.0.0.1:8080", True),
        ("http://LOCALHOST:8080", "localhost:8080", True),
        ("https://gw.example", "gw.example", True),  # TLS ended at a proxy
        ("https://gw.example", "gw.example:443", True),
        ("http://gw.example:8080", "gw.example", False),
        ("http://localhost:8080", "127.0.0.1:8080", False),
        ("http://127.0.0.1:8081", "127.0.0.1:8080", False),
        ("null", "127.0.0.1:8080", False),
        ("http://127.0.0.1:8080", None, False),
        ("http://[::1]:8080", "[::1]:8080", True),
    ],
)
def test_same_origin(origin: str, host: str | None, same: bool) -> None:
    assert same_origin(origin, host) is same
