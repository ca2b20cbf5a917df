"""The shipped push settings end to end: this folder's gateway is built from ``Settings()``
with no ``push=`` (tests/push uses small test settings instead), so what users run by
default — prefetch, batching, buffers, timeouts — is what delivers here."""

from __future__ import annotations

import httpx
import orjson
from websockets.asyncio.client import connect
from websockets.typing import Subprotocol

from push.settings import PushSettings
from tests.conftest import scaled
from tests.push.conftest import SseReader, deliveries, request, ws_url

from .conftest import RunningGateway


async def test_shipped_push_defaults_deliver_over_websocket_sse_and_long_poll(
    gateway: RunningGateway, qname: str
) -> None:
    assert gateway.services.engine.settings == PushSettings()
    headers = {"Authorization": f"Bearer {gateway.admin_key}"}
    async with httpx.AsyncClient(base_url=gateway.url, headers=headers, timeout=scaled(30)) as http:
        assert (await http.put(f"/v1/queues/{qname}", json={"visibility_timeout_s": 600})).status_code == 201

        async def send(*bodies: str) -> None:
            batch = {"messages": [{"body": b} for b in bodies]}
            assert (await http.post(f"/v1/queues/{qname}/messages", json=batch)).status_code == 200

        # WebSocket: the default prefetch (10) caps what one subscriber holds unacked.
        await send(*(f"w{i}" for i in range(12)))
        async with connect(
            ws_url(gateway),
            subprotocols=[Subprotocol("pushgate.v1")],
            additional_headers=headers,
        ) as ws:
            assert (await request(ws, op="subscribe", queue=qname, id=1))["op"] == "ok"
            first = await deliveries(ws, PushSettings().default_prefetch)
            reply = await request(ws, op="ack", receipts=[m["receipt"] for m in first], id=2)
            assert reply == {"op": "ok", "id": 2, "acked": 10, "failed": []}
            rest = await deliveries(ws, 2)
            assert sorted(m["body"] for m in first + rest) == sorted(f"w{i}" for i in range(12))
            assert (await request(ws, op="ack", receipts=[m["receipt"] for m in rest], id=3))["op"] == "ok"

        # SSE, acked over HTTP.
        await send("s0")
        async with http.stream(
            "GET", f"/v1/queues/{qname}/events", headers={"Accept": "text/event-stream"}
        ) as response:
            assert response.status_code == 200
            reader = SseReader(response)
            try:
                event = await reader.next(timeout=10)
                assert event["event"] == "message"
                message = orjson.loads(event["data"])
                assert message["body"] == "s0"
                acked = await http.post(f"/v1/queues/{qname}/ack", json={"receipts": [message["receipt"]]})
                assert acked.json()["acked"] == 1
            finally:
                await reader.close()

        # Long-poll: parked first, woken by the send.
        poll = http.post(f"/v1/queues/{qname}/receive", json={"wait_s": 10})
        await send("l0")
        (got,) = (await poll).json()["messages"]
        assert got["body"] == "l0"
        assert (await http.post(f"/v1/queues/{qname}/ack", json={"receipts": [got["receipt"]]})).json()[
            "acked"
        ] == 1
        stats = (await http.get(f"/v1/queues/{qname}")).json()["stats"]
        assert (stats["visible"], stats["in_flight"], stats["acked_total"]) == (0, 0, 14)
