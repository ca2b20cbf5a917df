"""The blocking client against a real gateway (plain functions; the gateway runs in its thread)."""

from __future__ import annotations

import pytest

from pushgate_client import Client, ConnectionEnded, PushgateError

from .conftest import RunningGateway


def test_http_and_ws_subscription(gateway: RunningGateway, qname: str) -> None:
    with Client(gateway.url, gateway.admin_key) as client:
        client.create_queue(qname)
        client.send_batch(qname, ["a", "b", "c"])
        assert client.send(qname, "d").seq > 0
        bodies = []
        with client.subscribe(qname, prefetch=2, batch=2) as sub:
            for message in sub:
                bodies.append(message.body)
                sub.ack(message)
                if len(bodies) == 4:
                    break
        assert bodies == ["a", "b", "c", "d"]
        assert client.receive(qname) == []


def test_sse_subscription_and_errors(gateway: RunningGateway, qname: str) -> None:
    with Client(gateway.url, gateway.admin_key) as client:
        client.create_queue(qname)
        client.send_batch(qname, ["x", "y"])
        with client.subscribe(qname, transport="sse", ack="auto") as sub:
            bodies = [next(sub).body, next(sub).body]
        assert bodies == ["x", "y"]
        with pytest.raises(PushgateError) as info:
            next(client.subscribe("no-such-queue", transport="sse"))
        assert info.value.status == 404
    with Client(gateway.url, "pg_bad.bad") as client, pytest.raises(ConnectionEnded) as ended:
        next(client.subscribe(qname))
    assert ended.value.close_code == 4001
