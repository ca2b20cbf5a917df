"""What the push engine tells the console and /metrics: consumers by transport, unacked counts."""

from __future__ import annotations

import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect
from websockets.typing import Subprotocol

from tests.conftest import scaled
from tests.gateway.conftest import Api, RunningGateway

from .conftest import scrape, wait_until
from .test_console_http import logged_in


def test_consumers_by_transport(ops_gateway: RunningGateway, admin: Api, qname: str) -> None:
    admin.put_queue(qname, visibility_timeout_s=60)
    url = ops_gateway.url.replace("http", "ws", 1) + "/v1/ws"
    headers = {"Authorization": f"Bearer {ops_gateway.admin_key}"}
    with connect(
        url, subprotocols=[Subprotocol("pushgate.v1")], additional_headers=headers, open_timeout=scaled(10)
    ) as ws:
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


def test_closes_are_counted_by_transport_and_code(ops_gateway: RunningGateway) -> None:
    def closes(code: str) -> float:
        text = scrape(ops_gateway.url, ops_gateway.admin_key).text
        family = next(f for f in text_string_to_metric_families(text) if f.name == "pushgate_push_closes")
        return sum(s.value for s in family.samples if s.labels == {"transport": "websocket", "code": code})

    before = closes("4400")
    url = ops_gateway.url.replace("http", "ws", 1) + "/v1/ws"
    headers = {"Authorization": f"Bearer {ops_gateway.admin_key}"}
    with connect(
        url, subprotocols=[Subprotocol("pushgate.v1")], additional_headers=headers, open_timeout=scaled(10)
    ) as ws:
        ws.send("this is not a frame")
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                ws.recv(timeout=scaled(10))
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 4400
    wait_until(lambda: closes("4400") == before + 1, what="the 4400 close to be counted")
