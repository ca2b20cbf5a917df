"""End to end: a real gateway process records known traffic, SIGTERM flushes it, and
``pushgate usage report`` (another real process, its own Spark) reports it exactly.

(Run within seconds of midnight UTC, the traffic could span two days and the per-day
rows would split; the period-level checks allow for the settling window.)

Traffic on queue ``orders`` of the bootstrap tenant: 3 messages sent over HTTP (a batch
of 2 and a single, bodies of known sizes), a duplicate send, 1 message sent over
WebSocket, 4 deliveries over WebSocket, 3 acked over WebSocket and 1 over HTTP; a send
to a missing queue (an error by code); a queue created and the limits changed (audit
records); a per-queue send rate of 4 a minute, so a fifth send to ``orders`` is throttled;
on queue ``retry`` (max_receives 1) a message received, nacked and dead-lettered.
"""

from __future__ import annotations

import asyncio
import csv
import datetime as dt
import json
import signal
from pathlib import Path

import httpx
import pytest
from pyspark.sql import SparkSession
from websockets.asyncio.client import connect
from websockets.typing import Subprotocol

from gateway.cli import main as cli_main
from gateway.usage.audit import read_audit
from tests.conftest import scaled
from tests.gateway.processes import serve
from tests.push.conftest import deliveries, request

BODIES = ["a" * 10, "b" * 20, "c" * 30]
WS_BODY = "d" * 40


async def _traffic(url: str, key: str) -> None:
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=scaled(30)) as http:
        assert (await http.put("/v1/queues/orders", json={})).status_code == 201
        limits = await http.put("/v1/limits", json={"per_queue": {"send": "4/minute"}})
        assert limits.status_code == 200, limits.text
        batch = [{"body": BODIES[0], "dedupe_id": "one"}, {"body": BODIES[1]}]
        assert (await http.post("/v1/queues/orders/messages", json={"messages": batch})).status_code == 200
        assert (await http.post("/v1/queues/orders/messages", json={"body": BODIES[2]})).status_code == 201
        duplicate = await http.post(
            "/v1/queues/orders/messages", json={"body": BODIES[0], "dedupe_id": "one"}
        )
        assert duplicate.status_code == 200 and duplicate.json()["duplicate"] is True
        missing = await http.post("/v1/queues/nowhere/messages", json={"body": "x"})
        assert missing.status_code == 404 and missing.json()["code"] == "queue_not_found"

        ws_url = url.replace("http", "ws", 1) + "/v1/ws"
        async with connect(
            ws_url, subprotocols=[Subprotocol("pushgate.v1")], additional_headers=headers
        ) as ws:
            sent = await request(ws, op="send", id="s", queue="orders", body=WS_BODY)
            assert sent["op"] == "ok", sent
            reply = await request(ws, op="subscribe", id="sub", queue="orders", prefetch=10)
            assert reply["op"] == "ok", reply
            got = await deliveries(ws, 4)
            assert sorted(m["body"] for m in got) == sorted([*BODIES, WS_BODY])
            acked = await request(ws, op="ack", id="a", receipts=[m["receipt"] for m in got[:3]])
            assert acked["op"] == "ok" and acked["acked"] == 3, acked
            # The last one is acked over HTTP (the receipt is good on either path).
            over_http = await http.post("/v1/queues/orders/ack", json={"receipts": [got[3]["receipt"]]})
            assert over_http.json()["acked"] == 1
        # The fifth send to orders in a minute (batch, single, duplicate, WebSocket, this).
        throttled = await http.post("/v1/queues/orders/messages", json={"body": "too many"})
        assert throttled.status_code == 429, throttled.text
        # A message received, nacked and moved to its dead-letter queue by the next receive
        # (max_receives 1): the store reports the move, usage counts it under the source.
        assert (await http.put("/v1/queues/retry-dead", json={})).status_code == 201
        retry = {"max_receives": 1, "dead_letter_queue": "retry-dead"}
        assert (await http.put("/v1/queues/retry", json=retry)).status_code == 201
        assert (await http.post("/v1/queues/retry/messages", json={"body": "r"})).status_code == 201
        got = (await http.post("/v1/queues/retry/receive", json={"wait_s": 0})).json()["messages"]
        nacked = await http.post("/v1/queues/retry/nack", json={"receipts": [got[0]["receipt"]]})
        assert nacked.json()["nacked"] == 1
        moved = await http.post("/v1/queues/retry/receive", json={"wait_s": 0})
        assert moved.json() == {"messages": []}


def test_known_traffic_is_reported_exactly(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data"
    # A long interval: everything is flushed by SIGTERM, the guarantee under test.
    gateway = serve(data, "--usage-flush-interval", "3600", "--gateway-name", "e2e")
    try:
        assert gateway.key is not None
        asyncio.run(_traffic(gateway.url, gateway.key))
        # Usually none: the interval is long (only an hour boundary flushes before SIGTERM).
        before = set((data / "usage").rglob("*.parquet"))
    finally:
        code = gateway.terminate()
    # uvicorn re-raises the signal after a clean stop.
    assert code in (0, -signal.SIGTERM), "".join(gateway.output)
    written_at_shutdown = set((data / "usage").rglob("*.parquet")) - before
    assert written_at_shutdown, "SIGTERM flushed the last window"
    assert all(f.name.startswith("e2e-") for f in written_at_shutdown)

    today = dt.datetime.now(dt.UTC).date()
    out = tmp_path / "report"
    # The real entry point, in this process so it shares the test run's Spark session
    # (a second JVM would cost more than the rest of the test).
    code = cli_main(
        [
            "usage",
            "report",
            "--data",
            str(data),
            "--from",
            str(today - dt.timedelta(days=1)),
            "--to",
            str(today + dt.timedelta(days=1)),
            "--out",
            str(out),
        ]
    )
    printed = capsys.readouterr()
    assert code == 0, printed.err[-3000:]
    assert "[usage report" in printed.err  # progress is shown
    assert f"{today}: 4 queue row(s) from " in printed.out

    with open(out / "day" / "summary.csv", newline="") as f:
        rows = {(r["tenant"], r["queue"]): r for r in csv.DictReader(f)}
    tenant = next(t for t, q in rows if q == "orders")
    orders = rows[(tenant, "orders")]
    sent_bytes = sum(len(b) for b in BODIES) + len(WS_BODY)
    assert {k: orders[k] for k in ("sent", "delivered", "acked", "nacked", "bytes", "delivered_bytes")} == {
        "sent": "4",
        "delivered": "4",
        "acked": "4",
        "nacked": "0",
        "bytes": str(sent_bytes),
        "delivered_bytes": str(sent_bytes),
    }
    assert (orders["deduplicated"], orders["errors"], orders["provisional"]) == ("1", "0", "true")
    assert orders["throttled"] == "1"
    assert orders["send_latency_p50_ms"] and orders["delivery_latency_p99_ms"]
    assert rows[(tenant, "nowhere")]["errors"] == "1"  # the send to a missing queue, by code
    assert rows[(tenant, "")]["connections"] == "1"  # connections are per tenant, not per queue
    retry = rows[(tenant, "retry")]
    assert {k: retry[k] for k in ("sent", "delivered", "nacked", "dead_lettered", "errors")} == {
        "sent": "1",
        "delivered": "1",
        "nacked": "1",
        "dead_lettered": "1",
        "errors": "0",
    }
    assert orders["dead_lettered"] == "0"

    periods = json.loads((out / "day" / "manifest.json").read_text())["periods"]
    # Today is open; yesterday settled 15 minutes after midnight.
    settled = dt.datetime.now(dt.UTC) >= dt.datetime.combine(today, dt.time(0, 15), dt.UTC)
    assert [p["provisional"] for p in periods] == [not settled, True]
    billing = spark.read.parquet(str(out / "day" / str(today) / "billing")).collect()
    lines = {(b["usage_type"], b["quantity"], b["unit"]) for b in billing}
    assert {
        ("messages-sent", 5, "messages"),  # 4 to orders, 1 to retry
        ("data-in", sent_bytes + 1, "bytes"),
        ("connections", 1, "connections"),
    } <= lines

    audit = read_audit(data / "audit")
    created = [r for r in audit.records if r.action == "queue.created"]
    assert [(r.target, r.source, r.actor.startswith("key:")) for r in created] == [
        ("orders", "http", True),
        ("retry-dead", "http", True),
        ("retry", "http", True),
    ]
    assert [r.details for r in audit.records if r.action == "limits.changed"] == [
        {"changes": {"per_queue": {"send": "4/minute"}}}
    ]
