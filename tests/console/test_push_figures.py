"""What the push engine tells the console and /metrics: consumers by transport, unacked counts."""

from __future__ import annotations

import orjson
from prometheus_client.parser import text_string_to_metric_families
from websockets.sync.client import connect

from tests.conftest import scaled
from tests.gateway.conftest import Api, RunningGateway

from .conftest import scrape, wait_until
from .test_console_http import logged_in


def test_consumers_by_transport(ops_gateway: RunningGateway, admin: Api, qname: str) -> None:
    admin.put_queue(qname, visibility_timeout_s=60)
    url = ops_gateway.url.replace("http", "ws", 1) + "/v1/ws"
    headers = {"Authorization": f"Bearer {ops_gateway.admin_key}"}
    with connect(
        url, subprotocols=["pushgate.v1"], additional_headers=headers, open_timeout=scaled(10)
    ) as ws:  # type: ignore[list-item]
        ws.send(orjson.dumps({"op": "subscribe", "queue": qname, "prefetch": 5, "id": 1}).decode())
        assert orjson.loads(ws.recv(timeout=scaled(10)))["op"] == "ok"
        admin.send(qname, "a")
        admin.send(qname, "b")
        got = 0
        while got < 2:
            frame = orjson.loads(ws.recv(timeout=scaled(10)))
            got += frame["op"] == "message"
        with logged_in(ops_gateway, ops_gateway.admin_key) as client:
            page = client.get(f"/console/queues/{qname}").text
        row = page[page.index("<td>websocket</td>") :].split("</tr>", 1)[0]
        assert row == "<td>websocket</td><td>2</td><td>5</td>"

        def websocket_connections() -> float:
            families = {
                f.name: f
                for f in text_string_to_metric_families(scrape(ops_gateway.url, ops_gateway.admin_key).text)
            }
            return sum(
                s.value
                for s in families["pushgate_push_connections"].samples
                if s.labels["transport"] == "websocket"
            )

        assert websocket_connections() >= 1
    wait_until(lambda: websocket_connections() == 0, what="the closed WebSocket to leave the gauge")
