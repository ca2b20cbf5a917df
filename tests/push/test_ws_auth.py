"""WebSocket authentication and the connection-level close codes, against a real gateway."""

from __future__ import annotations

import asyncio
import logging
import time

import httpx
import jwt
import pytest
from websockets.frames import Frame, Opcode

from gateway import client_noise
from tests.gateway.conftest import RunningGateway

from .conftest import (
    TEST_SETTINGS,
    Http,
    closed_with,
    deliveries,
    recv_frame,
    request,
    send_frame,
    ws_connect,
)

# Each test on the WebSocket fast path and on the public doors (tests/push/conftest.py).
pytestmark = pytest.mark.websocket_doors


async def test_header_auth_and_subprotocol(gateway: RunningGateway, http: Http, qname: str) -> None:
    await http.queue(qname)
    async with ws_connect(gateway, gateway.admin_key) as ws:
        assert ws.subprotocol == "pushgate.v1"
        assert await request(ws, op="ping", id=1) == {"op": "pong", "id": 1}
        assert (await request(ws, op="subscribe", queue=qname, id="s"))["op"] == "ok"


async def test_query_token_auth(gateway: RunningGateway, http: Http, qname: str) -> None:
    await http.queue(qname)
    async with ws_connect(gateway, query=f"access_token={gateway.admin_key}") as ws:
        assert (await request(ws, op="subscribe", queue=qname, id=1))["op"] == "ok"


async def test_first_frame_auth(gateway: RunningGateway, http: Http, qname: str) -> None:
    await http.queue(qname)
    async with ws_connect(gateway) as ws:
        await send_frame(ws, op="ping")
        assert await recv_frame(ws) == {"op": "pong"}
        reply = await request(ws, op="auth", token=gateway.admin_key, id="a")
        assert reply["op"] == "ok"
        assert (await request(ws, op="subscribe", queue=qname, id=2))["op"] == "ok"
        # Past the auth timeout the authenticated connection stays open.
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(TEST_SETTINGS.auth_timeout_s + 0.3):
                await ws.recv()
        assert await request(ws, op="ping", id=3) == {"op": "pong", "id": 3}


async def test_no_auth_within_timeout_closes_4001(gateway: RunningGateway) -> None:
    async with ws_connect(gateway) as ws:
        assert await closed_with(ws) == 4001


async def test_request_before_auth_closes_4001(gateway: RunningGateway) -> None:
    async with ws_connect(gateway) as ws:
        await send_frame(ws, op="subscribe", queue="q")
        assert await closed_with(ws) == 4001


@pytest.mark.parametrize("how", ["header", "query", "frame"])
async def test_bad_token_closes_4001(gateway: RunningGateway, how: str) -> None:
    bad = "pg_nonsense.token"
    if how == "header":
        ws_cm = ws_connect(gateway, bad)
    elif how == "query":
        ws_cm = ws_connect(gateway, query=f"access_token={bad}")
    else:
        ws_cm = ws_connect(gateway)
    async with ws_cm as ws:
        if how == "frame":
            await send_frame(ws, op="auth", token=bad)
        assert await closed_with(ws) == 4001


async def test_token_expiry_while_connected_closes_4001(gateway: RunningGateway, http: Http) -> None:
    # JWT exp has whole seconds: a 4 s token lives 3-4 s, room for a round trip under load.
    token = await http.token(ttl_s=4)
    async with ws_connect(gateway, token) as ws:
        assert await request(ws, op="ping", id=1) == {"op": "pong", "id": 1}
        assert await closed_with(ws, timeout=10) == 4001
        assert ws.close_reason == "token expired"


async def test_token_refresh_keeps_the_connection(gateway: RunningGateway, http: Http) -> None:
    # The refresh must land before the short token expires: 3-4 s leave room for a loaded
    # machine; the wait below runs until just past that expiry, not a fixed time.
    short = await http.token(ttl_s=4)
    short_exp = jwt.decode(short, options={"verify_signature": False})["exp"]
    async with ws_connect(gateway, short) as ws:
        longer = await http.token(ttl_s=600)
        reply = await request(ws, op="auth", token=longer, id="r")
        assert reply["op"] == "ok" and reply["expires_at"] > 0
        # Past the first token's expiry (and a few watchdog rounds) the connection is still open.
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(max(0.0, short_exp - time.time()) + 0.5):
                await ws.recv()
        assert await request(ws, op="ping", id=2) == {"op": "pong", "id": 2}
        # A failed refresh is one bad request: the connection stays.
        reply = await request(ws, op="auth", token="pg_bad.bad", id="r2")
        assert (reply["op"], reply["code"]) == ("error", "unauthorized")
        assert await request(ws, op="ping", id=3) == {"op": "pong", "id": 3}


async def test_scope_failures_close_4003(gateway: RunningGateway, http: Http, qname: str) -> None:
    await http.queue(qname)
    token = gateway.make_key(f"send:{qname}")
    async with ws_connect(gateway, token) as ws:
        assert (await request(ws, op="send", queue=qname, body="x", id=1))["op"] == "ok"
        await send_frame(ws, op="subscribe", queue=qname)
        assert await closed_with(ws) == 4003
    token = gateway.make_key(f"receive:{qname}")
    async with ws_connect(gateway, token) as ws:
        assert (await request(ws, op="subscribe", queue=qname, id=1))["op"] == "ok"
        await send_frame(ws, op="send", queue=qname, body="x")
        assert await closed_with(ws) == 4003


async def test_origin_checked_against_tenant(gateway: RunningGateway, http: Http) -> None:
    tenant = gateway.make_tenant()
    gateway.call(gateway.services.authenticator.tenants.set_origins(tenant, ["https://app.example"]))
    gateway.services.authenticator.invalidate()
    token = gateway.make_key("receive:*", tenant=tenant)
    async with ws_connect(gateway, token, origin="https://evil.example") as ws:
        assert await closed_with(ws) == 4003
    async with ws_connect(gateway, token, origin="https://app.example") as ws:
        assert await request(ws, op="ping", id=1) == {"op": "pong", "id": 1}


async def test_malformed_frame_closes_4400(gateway: RunningGateway) -> None:
    async with ws_connect(gateway, gateway.admin_key) as ws:
        await ws.send("{not json")
        assert await closed_with(ws) == 4400
    async with ws_connect(gateway, gateway.admin_key) as ws:
        await ws.send(b"\x00binary")
        assert await closed_with(ws) == 4400


async def test_too_large_frame_closes_1009(gateway: RunningGateway) -> None:
    async with ws_connect(gateway, gateway.admin_key) as ws:
        await send_frame(ws, op="send", queue="q", body="x" * 70_000)
        assert await closed_with(ws) == 1009


async def test_invalid_request_keeps_connection(gateway: RunningGateway, http: Http) -> None:
    async with ws_connect(gateway, gateway.admin_key) as ws:
        reply = await request(ws, op="subscribe", queue="q", prefetch=0, id=9)
        assert (reply["op"], reply["code"], reply["id"]) == ("error", "invalid_request", 9)
        reply = await request(ws, op="subscribe", queue="no-such-queue", id=10)
        assert (reply["op"], reply["code"]) == ("error", "queue_not_found")
        assert await request(ws, op="ping", id=11) == {"op": "pong", "id": 11}


async def test_plain_http_on_ws_route_is_refused(gateway: RunningGateway) -> None:
    async with httpx.AsyncClient(base_url=gateway.url) as client:
        response = await client.get("/v1/ws")
    # No HTTP route serves /v1/ws: the general rule, 404 not_found, as a problem document.
    assert response.status_code == 404, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert response.json()["code"] == "not_found"


async def test_refresh_that_loses_a_subscribed_scope_closes_4003(
    gateway: RunningGateway, http: Http, qname: str
) -> None:
    await http.queue(qname)
    async with ws_connect(gateway, gateway.admin_key) as ws:
        assert (await request(ws, op="subscribe", queue=qname, id=1))["op"] == "ok"
        narrower = await http.token(scope="receive:some-other-queue")
        await send_frame(ws, op="auth", token=narrower, id=2)
        assert await closed_with(ws) == 4003


async def test_invalid_utf8_before_auth_closes_1007_and_logs_one_line(gateway: RunningGateway) -> None:
    records: list[logging.LogRecord] = []

    class Collect(logging.Filter):
        # A filter after the gateway's: it sees what passed, and survives another uvicorn
        # in this process configuring the logger (dictConfig strips handlers, not filters).
        def filter(self, record: logging.LogRecord) -> bool:
            records.append(record)
            return True

    noise = client_noise.installed()
    assert noise is not None, "the running gateway quiets client faults"
    noise.reset()  # another test in this process may have had its report this interval
    collect = Collect()
    logger = logging.getLogger("uvicorn.error")
    logger.addFilter(collect)
    try:
        for _ in range(20):
            async with ws_connect(gateway) as ws:
                ws.protocol.send_frame(Frame(Opcode.TEXT, b"\xff\xfe not utf-8"))
                ws.send_data()
                assert await closed_with(ws) == 1007
    finally:
        logger.removeFilter(collect)
    noisy = [r for r in records if "UTF-8" in r.getMessage()]
    assert len(noisy) == 1
    assert noisy[0].levelno == logging.WARNING and noisy[0].exc_info is None


async def test_token_expiry_releases_the_messages_it_held(
    gateway: RunningGateway, http: Http, qname: str
) -> None:
    # docs/push.md, At-least-once: a connection whose token expires "releases everything
    # it held at once", so another consumer gets it long before its visibility ends.
    await http.queue(qname, visibility_timeout_s=600)
    await http.send(qname, "held")
    token = await http.token(ttl_s=4)  # lives 3-4 s (whole seconds): room for the subscribe
    async with ws_connect(gateway, token) as ws:
        assert (await request(ws, op="subscribe", queue=qname, id=1))["op"] == "ok"
        (held,) = await deliveries(ws, 1)
        assert await closed_with(ws, timeout=10) == 4001
    response = await http.client.post(f"/v1/queues/{qname}/receive", json={"wait_s": 5})
    (again,) = response.json()["messages"]
    assert (again["id"], again["receive_count"]) == (held["id"], 2)
