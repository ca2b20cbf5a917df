"""Every path reports to the one observe point: HTTP sends, receives, acks, nacks and
failures by code; WebSocket sends, pushes, acks, nacks and connects; SSE pushes.

A real gateway in this process (uvicorn on an ephemeral port); the test reads its usage
aggregator on the gateway's own loop (``take``), so no file or Spark is involved here
(``tests/spark/test_gateway_usage.py`` covers files and the report).
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed
from websockets.typing import Subprotocol

from gateway.usage.audit import read_audit
from gateway.usage.record import UsageRecord
from tests.conftest import scaled
from tests.gateway.conftest import RunningGateway, start_gateway
from tests.push.conftest import deliveries, request

Totals = dict[tuple[str, str, str, str], tuple[int, int]]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    running = start_gateway(tmp_path_factory.mktemp("usage-wiring"))
    try:
        yield running
    finally:
        running.stop()


def take(gateway: RunningGateway) -> Totals:
    """(queue, operation, transport, outcome) -> (count, bytes) since the last take."""
    aggregator = gateway.services.usage.aggregator
    assert aggregator is not None

    async def on_loop() -> list[UsageRecord]:
        return aggregator.take("test", 0)

    totals: dict[tuple[str, str, str, str], list[int]] = defaultdict(lambda: [0, 0])
    for r in gateway.call(on_loop()):
        cell = totals[(r.queue, r.operation, r.transport, r.outcome)]
        cell[0] += r.count
        cell[1] += r.bytes
    return {k: (v[0], v[1]) for k, v in totals.items()}


def test_http_paths_and_failures_by_code(gateway: RunningGateway) -> None:
    headers = {"Authorization": f"Bearer {gateway.admin_key}"}
    with httpx.Client(base_url=gateway.url, headers=headers, timeout=scaled(30)) as http:
        assert http.put("/v1/queues/h", json={}).status_code == 201
        take(gateway)
        batch = {"messages": [{"body": "12345"}, {"body": "x", "delay_s": -1}, {"body": "abc"}]}
        assert http.post("/v1/queues/h/messages", json=batch).status_code == 200
        assert http.post("/v1/queues/h/messages", json={"body": "abc", "dedupe_id": "d"}).status_code == 201
        assert http.post("/v1/queues/h/messages", json={"body": "abc", "dedupe_id": "d"}).status_code == 200
        got = http.post("/v1/queues/h/receive", json={"max": 10, "wait_s": 0}).json()["messages"]
        assert len(got) == 3
        receipts = [m["receipt"] for m in got]
        assert http.post("/v1/queues/h/nack", json={"receipts": receipts[:1]}).json()["nacked"] == 1
        acked = http.post("/v1/queues/h/ack", json={"receipts": [*receipts[1:], "bogus"]}).json()
        assert acked["acked"] == 2
        assert http.post("/v1/queues/missing/messages", json={"body": "x"}).status_code == 404
        assert http.post("/v1/queues/h/receive", json={"max": 1000}).status_code == 400
    totals = take(gateway)
    bogus_code = acked["failed"][0]["code"]
    assert totals == {
        ("h", "send", "http", "ok"): (3, 11),
        ("h", "send", "http", "invalid_request"): (1, 0),
        ("h", "deduplicated", "http", "ok"): (1, 3),
        ("h", "receive", "http", "ok"): (3, 11),
        ("h", "nack", "http", "ok"): (1, 0),
        ("h", "ack", "http", "ok"): (2, 0),
        ("h", "ack", "http", bogus_code): (1, 0),
        ("missing", "send", "http", "queue_not_found"): (1, 0),
        ("h", "receive", "http", "invalid_request"): (1, 0),
    }


async def _websocket_and_sse(gateway: RunningGateway) -> None:
    headers = {"Authorization": f"Bearer {gateway.admin_key}"}
    ws_url = gateway.url.replace("http", "ws", 1) + "/v1/ws"
    async with httpx.AsyncClient(base_url=gateway.url, headers=headers, timeout=scaled(30)) as http:
        assert (await http.put("/v1/queues/w", json={})).status_code == 201
        async with connect(
            ws_url, subprotocols=[Subprotocol("pushgate.v1")], additional_headers=headers
        ) as ws:
            batch = [{"body": "aa"}, {"body": "bbbb"}]
            assert (await request(ws, op="send", id="s", queue="w", messages=batch))["op"] == "ok"
            assert (await request(ws, op="subscribe", id="sub", queue="w", prefetch=10))["op"] == "ok"
            got = await deliveries(ws, 2)
            first = next(m for m in got if m["body"] == "aa")
            second = next(m for m in got if m["body"] == "bbbb")
            assert (await request(ws, op="ack", id="a", receipts=[first["receipt"]]))["acked"] == 1
            assert (await request(ws, op="nack", id="n", receipts=[second["receipt"]]))["op"] == "ok"
            again = await deliveries(ws, 1)
            assert again[0]["body"] == "bbbb"
            assert (await request(ws, op="ack", id="a2", receipts=[again[0]["receipt"]]))["acked"] == 1
        # SSE: one stream, one message pushed, acked over HTTP.
        assert (await http.post("/v1/queues/w/messages", json={"body": "sse!"})).status_code == 201
        async with http.stream("GET", "/v1/queues/w/events") as stream:
            async for line in stream.aiter_lines():
                if line.startswith("data:") and "sse!" in line:
                    break


def test_websocket_and_sse_paths(gateway: RunningGateway) -> None:
    take(gateway)
    asyncio.run(_websocket_and_sse(gateway))
    totals = take(gateway)
    assert totals[("w", "send", "ws", "ok")] == (2, 6)
    assert totals[("w", "push", "ws", "ok")] == (3, 10)  # the nacked one twice
    assert totals[("w", "ack", "ws", "ok")] == (2, 0)
    assert totals[("w", "nack", "ws", "ok")] == (1, 0)
    assert totals[("w", "push", "sse", "ok")] == (1, 4)
    assert totals[("", "connect", "ws", "ok")] == (1, 0)
    assert totals[("", "connect", "sse", "ok")] == (1, 0)


def test_queue_admin_is_audited(gateway: RunningGateway) -> None:
    headers = {"Authorization": f"Bearer {gateway.admin_key}"}
    with httpx.Client(base_url=gateway.url, headers=headers, timeout=scaled(30)) as http:
        assert http.put("/v1/queues/audited", json={"visibility_timeout_s": 30}).status_code == 201
        assert (
            http.put("/v1/queues/audited", json={"visibility_timeout_s": 30}).status_code == 200
        )  # no change
        assert http.patch("/v1/queues/audited", json={"visibility_timeout_s": 60}).status_code == 200
        assert http.post("/v1/queues/audited/purge").status_code == 200
        assert http.delete("/v1/queues/audited").status_code == 204
    records = [
        r for r in read_audit(Path(gateway.settings.data_dir) / "audit").records if r.target == "audited"
    ]
    assert [(r.action, r.details) for r in records] == [
        ("queue.created", {"visibility_timeout_s": 30}),
        ("queue.updated", {"visibility_timeout_s": 60}),
        ("queue.purged", {"purged": 0}),
        ("queue.deleted", {}),
    ]
    assert {r.actor for r in records} == {f"key:{gateway.admin_key.split('_')[1]}"}
    assert {(r.source, r.tenant) for r in records} == {("http", "default")}


async def test_queues_created_at_once_are_each_audited(gateway: RunningGateway) -> None:
    """The gateway writes the audit records of concurrent actions together (one fsync a
    batch, gateway/usage/audit.py): each action answered has its own record."""
    headers = {"Authorization": f"Bearer {gateway.admin_key}"}
    names = [f"inbox-{i}" for i in range(32)]
    async with httpx.AsyncClient(base_url=gateway.url, headers=headers, timeout=scaled(30)) as http:
        answers = await asyncio.gather(*(http.put(f"/v1/queues/{name}", json={}) for name in names))
    assert [a.status_code for a in answers] == [201] * len(names)
    records = read_audit(Path(gateway.settings.data_dir) / "audit").records
    created = sorted(r.target for r in records if r.action == "queue.created" and r.target in names)
    assert created == sorted(names)


def test_a_throttled_request_and_a_limits_change(gateway: RunningGateway) -> None:
    tenant = gateway.make_tenant()
    headers = {"Authorization": f"Bearer {gateway.make_key('admin', tenant)}"}
    with httpx.Client(base_url=gateway.url, headers=headers, timeout=scaled(30)) as http:
        assert http.put("/v1/queues/slow", json={}).status_code == 201
        assert http.put("/v1/limits", json={"send": "1/minute"}).status_code == 200
        take(gateway)
        assert http.post("/v1/queues/slow/messages", json={"body": "one"}).status_code == 201
        refused = http.post("/v1/queues/slow/messages", json={"body": "two"})
        assert refused.status_code == 429 and refused.json()["code"] == "rate_limited"
    totals = take(gateway)
    assert totals[("slow", "send", "http", "ok")] == (1, 3)
    assert totals[("slow", "throttled", "http", "rate_limited")] == (1, 0)
    assert not any(k[1] == "send" and k[3] == "rate_limited" for k in totals)  # not also an error
    changed = [r for r in read_audit(Path(gateway.settings.data_dir) / "audit").records if r.tenant == tenant]
    assert [(r.action, r.target, r.details) for r in changed] == [
        ("queue.created", "slow", {}),
        ("limits.changed", tenant, {"changes": {"send": "1/minute"}}),
    ]


async def _connect_twice(url: str, key: str) -> int | None:
    """Open two WebSockets in turn; return the close code the second one got."""
    headers = {"Authorization": f"Bearer {key}"}
    ws_url = url.replace("http", "ws", 1) + "/v1/ws"
    async with connect(ws_url, subprotocols=[Subprotocol("pushgate.v1")], additional_headers=headers) as ws:
        assert (await request(ws, op="ping", id="p"))["op"] == "pong"
    async with connect(ws_url, subprotocols=[Subprotocol("pushgate.v1")], additional_headers=headers) as ws:
        try:
            await ws.recv()
        except ConnectionClosed as closed:
            return closed.rcvd.code if closed.rcvd is not None else None
    return None


def test_a_refused_websocket_connection_is_throttled_usage(gateway: RunningGateway) -> None:
    tenant = gateway.make_tenant()
    key = gateway.make_key("admin", tenant)
    with httpx.Client(base_url=gateway.url, headers={"Authorization": f"Bearer {key}"}) as http:
        assert http.put("/v1/limits", json={"connect": "1/minute"}).status_code == 200
    take(gateway)
    assert asyncio.run(_connect_twice(gateway.url, key)) == 4008  # refused: past the connect rate
    totals = take(gateway)
    assert totals[("", "throttled", "ws", "rate_limited")] == (1, 0)


def scrape(gateway: RunningGateway) -> str:
    r = httpx.get(
        f"{gateway.url}/metrics", headers={"Authorization": f"Bearer {gateway.admin_key}"}, timeout=scaled(10)
    )
    assert r.status_code == 200
    return r.text


def scraped_events(gateway: RunningGateway, queue: str) -> dict[str, float]:
    """``pushgate_queue_message_events_total`` of one queue of the default tenant."""
    return {
        s.labels["event"]: s.value
        for family in text_string_to_metric_families(scrape(gateway))
        if family.name == "pushgate_queue_message_events"
        for s in family.samples
        if s.labels["tenant"] == "default" and s.labels["queue"] == queue
    }


def scraped_errors(gateway: RunningGateway) -> dict[tuple[str, str, str], float]:
    """``pushgate_operation_errors_total`` by (operation, transport, code)."""
    return {
        (s.labels["operation"], s.labels["transport"], s.labels["code"]): s.value
        for family in text_string_to_metric_families(scrape(gateway))
        if family.name == "pushgate_operation_errors"
        for s in family.samples
    }


async def _auto_ack_stream(gateway: RunningGateway, queue: str, bodies: list[str]) -> None:
    headers = {"Authorization": f"Bearer {gateway.admin_key}"}
    ws_url = gateway.url.replace("http", "ws", 1) + "/v1/ws"
    async with connect(ws_url, subprotocols=[Subprotocol("pushgate.v1")], additional_headers=headers) as ws:
        reply = await request(ws, op="subscribe", id="sub", queue=queue, prefetch=10, ack="auto")
        assert reply["op"] == "ok"
        messages = [{"body": b} for b in bodies]
        assert (await request(ws, op="send", id="s", queue=queue, messages=messages))["op"] == "ok"
        assert sorted(m["body"] for m in await deliveries(ws, len(bodies))) == sorted(bodies)


def test_dead_letters_and_auto_acks_count_alike_in_usage_metrics_and_the_store(
    gateway: RunningGateway,
) -> None:
    """One observe point, two sinks: the usage records and the per-queue metrics agree with
    each other and with the store's durable totals, for what the store does on its own
    (dead-letter moves) and for auto-ack streams (delivered and acked, as SQS counts a
    receive and a delete)."""
    headers = {"Authorization": f"Bearer {gateway.admin_key}"}
    with httpx.Client(base_url=gateway.url, headers=headers, timeout=scaled(30)) as http:
        assert http.put("/v1/queues/dl-dead", json={}).status_code == 201
        src = {"max_receives": 1, "dead_letter_queue": "dl-dead"}
        assert http.put("/v1/queues/dl-src", json=src).status_code == 201
        assert http.put("/v1/queues/auto", json={}).status_code == 201
        take(gateway)
        errors_before = scraped_errors(gateway)
        batch = {"messages": [{"body": "one"}, {"body": "two"}]}
        assert http.post("/v1/queues/dl-src/messages", json=batch).status_code == 200
        # Errors by code, in both sinks: a send to a missing queue, an ack of a bad receipt.
        assert http.post("/v1/queues/dl-nowhere/messages", json={"body": "x"}).status_code == 404
        bad_ack = http.post("/v1/queues/dl-src/ack", json={"receipts": ["bogus"]}).json()
        bad_code = bad_ack["failed"][0]["code"]
        got = http.post("/v1/queues/dl-src/receive", json={"max": 10, "wait_s": 0}).json()["messages"]
        assert (
            http.post("/v1/queues/dl-src/nack", json={"receipts": [m["receipt"] for m in got]}).status_code
            == 200
        )
        # Received once already: the next receive moves both to the dead-letter queue.
        assert http.post("/v1/queues/dl-src/receive", json={"max": 10, "wait_s": 0}).json() == {
            "messages": []
        }
        asyncio.run(_auto_ack_stream(gateway, "auto", ["x", "yy", "zzz"]))
        # The gateway's own acks of the auto-ack stream land after the pushes: wait for them.
        deadline = time.monotonic() + scaled(10)
        while scraped_events(gateway, "auto").get("acked") != 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        stats = {name: http.get(f"/v1/queues/{name}").json()["stats"] for name in ("dl-src", "auto")}
    totals = take(gateway)
    assert totals[("dl-src", "send", "http", "ok")] == (2, 6)
    assert totals[("dl-src", "receive", "http", "ok")] == (2, 6)
    assert totals[("dl-src", "nack", "http", "ok")] == (2, 0)
    assert totals[("dl-src", "dead_lettered", "store", "ok")] == (2, 0)
    assert totals[("auto", "push", "ws", "ok")] == (3, 6)
    assert totals[("auto", "ack", "ws", "ok")] == (3, 0)
    assert totals[("dl-nowhere", "send", "http", "queue_not_found")] == (1, 0)
    assert totals[("dl-src", "ack", "http", bad_code)] == (1, 0)
    errors_after = scraped_errors(gateway)
    grew = {k: v - errors_before.get(k, 0) for k, v in errors_after.items() if v != errors_before.get(k, 0)}
    assert grew == {("send", "http", "queue_not_found"): 1, ("ack", "http", bad_code): 1}
    assert scraped_events(gateway, "dl-src") == {
        "sent": 2,
        "deduplicated": 0,
        "delivered": 2,
        "acked": 0,
        "nacked": 2,
        "dead_lettered": 2,
        "expired": 0,
    }
    assert scraped_events(gateway, "auto") == {
        "sent": 3,
        "deduplicated": 0,
        "delivered": 3,
        "acked": 3,
        "nacked": 0,
        "dead_lettered": 0,
        "expired": 0,
    }
    # The store's durable totals say the same.
    assert stats["dl-src"]["dead_lettered_total"] == 2
    assert stats["auto"]["acked_total"] == 3 and stats["auto"]["visible"] + stats["auto"]["in_flight"] == 0
