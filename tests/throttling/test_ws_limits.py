"""Rate limits on push connections: WebSocket error frames, 4008 for a client that keeps on,
connection opens, SSE streams; on both shared-state backends."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import orjson
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed
from websockets.typing import Subprotocol

from push.settings import PushSettings
from tests.conftest import scaled
from tests.gateway.conftest import RunningGateway, start_gateway

KEEPS_ON = PushSettings().rate_limited_frames


@pytest.fixture(scope="module", params=["memory", "redis"])
def gateway(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningGateway]:
    redis_url = request.getfixturevalue("redis_url") if request.param == "redis" else None
    running = start_gateway(tmp_path_factory.mktemp("gateway"), redis_url=redis_url)
    try:
        yield running
    finally:
        running.stop()


class Tenant:
    def __init__(self, gateway: RunningGateway) -> None:
        self.gateway = gateway
        self.name = gateway.make_tenant()
        self.key = gateway.make_key("admin", self.name)
        self.http = httpx.Client(base_url=gateway.url, headers={"Authorization": f"Bearer {self.key}"})

    def limits(self, doc: dict[str, Any]) -> None:
        self.http.put("/v1/limits", json=doc).raise_for_status()

    def queue(self) -> str:
        name = "w" + uuid.uuid4().hex[:10]
        self.http.put(f"/v1/queues/{name}", json={}).raise_for_status()
        return name

    async def ws(self) -> ClientConnection:
        return await connect(
            self.gateway.url.replace("http", "ws", 1) + "/v1/ws",
            subprotocols=[Subprotocol("pushgate.v1")],
            additional_headers={"Authorization": f"Bearer {self.key}"},
        )


@pytest.fixture
def tenant(gateway: RunningGateway) -> Iterator[Tenant]:
    t = Tenant(gateway)
    try:
        yield t
    finally:
        t.http.close()


@pytest.fixture
async def ws(tenant: Tenant) -> AsyncIterator[ClientConnection]:
    conn = await tenant.ws()
    try:
        yield conn
    finally:
        await conn.close()


async def call(ws: ClientConnection, frame: dict[str, Any]) -> dict[str, Any]:
    """Send a frame with an id and return the reply carrying it."""
    await ws.send(orjson.dumps(frame).decode())
    async with asyncio.timeout(scaled(5)):
        while True:
            reply: dict[str, Any] = orjson.loads(await ws.recv())
            if reply.get("id") == frame["id"]:
                return reply


async def closed_with(ws: ClientConnection) -> tuple[int | None, str]:
    with pytest.raises(ConnectionClosed):
        async with asyncio.timeout(scaled(5)):
            while True:
                await ws.recv()
    assert ws.close_code is not None
    return ws.close_code, ws.close_reason or ""


def send(n: int, queue: str) -> dict[str, Any]:
    return {"op": "send", "id": n, "queue": queue, "body": f"m{n}"}


async def test_refused_sends_get_error_frames_and_a_client_that_keeps_on_gets_4008(
    tenant: Tenant, ws: ClientConnection
) -> None:
    queue = tenant.queue()
    tenant.limits({"per_key": {"send": "2/hour"}})
    assert [(await call(ws, send(n, queue)))["op"] for n in (1, 2)] == ["ok", "ok"]
    for n in range(3, 3 + KEEPS_ON - 1):
        reply = await call(ws, send(n, queue))
        assert reply["op"] == "error" and reply["code"] == "rate_limited"
        assert isinstance(reply["retry_after_s"], int | float) and reply["retry_after_s"] >= 1
    await ws.send(orjson.dumps(send(99, queue)).decode())
    code, reason = await closed_with(ws)
    assert code == 4008 and "rate limit" in reason


async def test_an_allowed_request_forgives_earlier_refusals(tenant: Tenant, ws: ClientConnection) -> None:
    first, second = tenant.queue(), tenant.queue()
    tenant.limits({"per_queue": {"send": "1/hour"}})
    assert (await call(ws, send(1, first)))["op"] == "ok"
    for n in range(2, 2 + KEEPS_ON - 1):
        assert (await call(ws, send(n, first)))["code"] == "rate_limited"
    assert (await call(ws, send(50, second)))["op"] == "ok"  # another queue's counter: allowed
    for n in range(60, 60 + KEEPS_ON - 1):
        assert (await call(ws, send(n, first)))["code"] == "rate_limited"
    assert (await call(ws, {"op": "ping", "id": "still-open"}))["op"] == "pong"


async def test_subscribes_count_as_receives(tenant: Tenant, ws: ClientConnection) -> None:
    queue = tenant.queue()
    tenant.limits({"per_queue": {"receive": "1/hour"}})
    assert (await call(ws, {"op": "subscribe", "id": 1, "queue": queue}))["op"] == "ok"
    assert (await call(ws, {"op": "unsubscribe", "id": 2, "queue": queue}))["op"] == "ok"
    again = await call(ws, {"op": "subscribe", "id": 3, "queue": queue})
    assert again["op"] == "error" and again["code"] == "rate_limited" and again["retry_after_s"] >= 1


async def test_connection_opens_past_the_rate_are_closed_with_4008(tenant: Tenant) -> None:
    tenant.limits({"connect": "1/hour"})
    first = await tenant.ws()
    try:
        assert (await call(first, {"op": "ping", "id": 1}))["op"] == "pong"
        second = await tenant.ws()
        code, reason = await closed_with(second)
        assert code == 4008 and "retry after" in reason
    finally:
        await first.close()


def test_sse_streams_past_the_rate_get_429_with_the_fields(tenant: Tenant) -> None:
    queue = tenant.queue()
    tenant.limits({"per_queue": {"receive": "1/hour"}})
    with tenant.http.stream(
        "GET", f"/v1/queues/{queue}/events", headers={"Accept": "text/event-stream"}
    ) as r:
        assert r.status_code == 200
    r = tenant.http.get(f"/v1/queues/{queue}/events", headers={"Accept": "text/event-stream"})
    assert r.status_code == 429 and r.json()["code"] == "rate_limited"
    assert r.headers["RateLimit-Policy"] == '"queue-receive";q=1;w=3600'
    assert r.headers["RateLimit"].startswith('"queue-receive";r=0;t=')
    assert int(r.headers["Retry-After"]) >= 1
