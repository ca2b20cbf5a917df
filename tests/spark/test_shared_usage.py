"""Usage from every gateway, on a real Spark cluster.

Two real gateways (``pushgate serve`` processes, each with its own data directory) write
usage files into one shared directory (``--usage-dir``) under traffic, flushing every
quarter second so both write while the other does. Then ``pushgate usage report`` reads
that directory, once more through a trailing slash (the same directory again) and a second
directory holding copies of two of the files:

- on a Spark standalone master and worker this test starts from pyspark's own
  ``bin/spark-class`` (the report a child process with its own driver, reading one input
  through ``file:``, one through ``viewfs://``, a file system of the Hadoop configuration
  given with ``--conf``, and writing its output there too);
- on ``local[2]`` (the test run's shared session, in this process).

Both reports must equal, row for row, and equal what the gateways counted themselves:
their Prometheus counters (``pushgate_queue_message_events_total`` per queue and event,
``pushgate_operation_errors_total``), which the observe point feeds from the same outcomes
as the usage files.
"""

from __future__ import annotations

import asyncio
import csv
import datetime as dt
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from pyspark.sql import SparkSession
from websockets.asyncio.client import connect
from websockets.typing import Subprotocol

from gateway.cli import main as cli_main
from gateway.local_ports import free_ports
from spark.standalone import StandaloneCluster
from tests.conftest import scaled
from tests.gateway.processes import REPO, ServeProcess, serve
from tests.push.conftest import deliveries, request

ROUNDS = 5
EVENTS = ("sent", "deduplicated", "delivered", "acked", "nacked")


def _files_of(shared: Path, name: str) -> list[Path]:
    return sorted(shared.rglob(f"{name}-*.parquet"))


async def _next_file(shared: Path, name: str, seen: int) -> None:
    """Wait (polling, with a deadline) until gateway ``name`` wrote another usage file."""
    deadline = time.monotonic() + scaled(30)
    while len(_files_of(shared, name)) <= seen:
        assert time.monotonic() < deadline, f"{name} wrote no usage file"
        await asyncio.sleep(0.05)


async def _traffic(gateway: ServeProcess, name: str, shared: Path) -> None:
    """Rounds of sends (HTTP and WebSocket), duplicates, pushes and acks over WebSocket,
    pulls acked or nacked over HTTP, and a send to a missing queue; each round ends once
    the gateway has written a usage file, so files are written all through the traffic."""
    headers = {"Authorization": f"Bearer {gateway.key}"}
    async with httpx.AsyncClient(base_url=gateway.url, headers=headers, timeout=scaled(30)) as http:
        for queue in ("orders", "jobs"):
            assert (await http.put(f"/v1/queues/{queue}", json={})).status_code == 201
        ws_url = gateway.url.replace("http", "ws", 1) + "/v1/ws"
        async with connect(
            ws_url, subprotocols=[Subprotocol("pushgate.v1")], additional_headers=headers
        ) as ws:
            reply = await request(ws, op="subscribe", id="sub", queue="orders", prefetch=50)
            assert reply["op"] == "ok", reply
            for r in range(ROUNDS):
                seen = len(_files_of(shared, name))
                batch = [{"body": f"{name}-{r}-{i}" * (i + 1)} for i in range(4)]
                sent = await http.post("/v1/queues/orders/messages", json={"messages": batch})
                assert sent.status_code == 200, sent.text
                over_ws = await request(ws, op="send", id=f"s{r}", queue="orders", body="w" * r)
                assert over_ws["op"] == "ok", over_ws
                for status in (201, 200):  # stored, then answered as a duplicate
                    job = await http.post("/v1/queues/jobs/messages", json={"body": "j", "dedupe_id": str(r)})
                    assert job.status_code == status, job.text
                got = await deliveries(ws, 5)
                acked = await request(ws, op="ack", id=f"a{r}", receipts=[m["receipt"] for m in got])
                assert acked["op"] == "ok" and acked["acked"] == 5, acked
                pulled = (await http.post("/v1/queues/jobs/receive", json={"wait_s": 0})).json()["messages"]
                assert len(pulled) == 1
                verb = "ack" if r % 2 else "nack"  # nacked: delivered again next round
                settled = await http.post(
                    f"/v1/queues/jobs/{verb}", json={"receipts": [pulled[0]["receipt"]]}
                )
                assert settled.status_code == 200, settled.text
                missing = await http.post("/v1/queues/nowhere/messages", json={"body": "x"})
                assert missing.status_code == 404
                await _next_file(shared, name, seen)


def _counted(gateway: ServeProcess) -> tuple[Counter[tuple[str, str, str]], int]:
    """What a gateway counted: per (tenant, queue, event), and failed operations."""
    text = httpx.get(
        f"{gateway.url}/metrics", headers={"Authorization": f"Bearer {gateway.key}"}, timeout=scaled(30)
    ).text
    events: Counter[tuple[str, str, str]] = Counter()
    errors = 0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            if sample.name == "pushgate_queue_message_events_total":
                events[(labels["tenant"], labels["queue"], labels["event"])] += int(sample.value)
            elif sample.name == "pushgate_operation_errors_total" and labels["operation"] != "throttled":
                errors += int(sample.value)
    return events, errors


def _rows(summary: Path) -> list[dict[str, str]]:
    with open(summary, newline="") as f:
        return list(csv.DictReader(f))


def _reported(rows: list[dict[str, str]]) -> tuple[Counter[tuple[str, str, str]], int, int]:
    """The report's (tenant, queue, event) counts summed over its periods, errors, connections."""
    events: Counter[tuple[str, str, str]] = Counter()
    for row in rows:
        for event in EVENTS:
            if int(row[event]):
                events[(row["tenant"], row["queue"], event)] += int(row[event])
    return events, sum(int(r["errors"]) for r in rows), sum(int(r["connections"]) for r in rows)


def _copy(file: Path, shared: Path, copies: Path, name: str | None = None) -> Path:
    """``file`` (under ``shared``) copied to the same partition under ``copies``."""
    target = copies / file.parent.relative_to(shared) / (name or file.name)
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(file, target)
    return target


def test_two_gateways_one_shared_directory_reported_on_a_standalone_cluster_and_locally(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shared, copies = tmp_path / "shared-usage", tmp_path / "copies"
    master_port, web_port = free_ports(2)
    cluster = StandaloneCluster(tmp_path / "spark-cluster", master_port, web_port)
    # The cluster's JVMs start while the gateways work.
    with ThreadPoolExecutor(1) as pool:
        started: Future[str] = pool.submit(cluster.start, scaled(240))
        try:
            _gateways_then_reports(spark, tmp_path, shared, copies, started, capsys)
        finally:
            started.cancel()
            if not started.cancelled():
                started.exception()  # wait for the start to end either way before stopping
            cluster.stop()


def _gateways_then_reports(
    spark: SparkSession,
    tmp_path: Path,
    shared: Path,
    copies: Path,
    started: Future[str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    flags = ("--usage-dir", str(shared), "--usage-flush-interval", "0.25")
    gateways = {
        name: serve(tmp_path / name, *flags, "--gateway-name", name) for name in ("gateway_a", "gateway_b")
    }
    try:

        async def both() -> None:
            await asyncio.gather(*(_traffic(g, name, shared) for name, g in gateways.items()))

        asyncio.run(both())
        counted = [_counted(g) for g in gateways.values()]
    finally:
        codes = [g.terminate() for g in gateways.values()]
    assert all(code in (0, -signal.SIGTERM) for code in codes), [g.output for g in gateways.values()]
    expected_events = sum((events for events, _ in counted), Counter[tuple[str, str, str]]())
    expected_errors = sum(errors for _, errors in counted)
    assert expected_errors == 2 * ROUNDS and expected_events  # the traffic happened as planned
    # Every file named by its gateway (the data directories hold none).
    written = {name: _files_of(shared, name) for name in gateways}
    assert all(len(files) >= ROUNDS for files in written.values()), written
    assert not list((tmp_path / "gateway_a").rglob("*.parquet")) and not list(
        (tmp_path / "gateway_b").rglob("*.parquet")
    )
    # Copies: one under another name, one under its own name in another directory.
    renamed = _copy(written["gateway_a"][0], shared, copies, "copied-by-a-sync-tool.parquet")
    same_name = _copy(written["gateway_b"][-1], shared, copies)

    today = dt.datetime.now(dt.UTC).date()
    span = ["--from", str(today - dt.timedelta(days=1)), "--to", str(today + dt.timedelta(days=1))]
    # The cluster's report (a child process, its own driver) runs while the local one does.
    cluster_out = tmp_path / "report-cluster"
    cluster_out.mkdir()
    mount = "spark.hadoop.fs.viewfs.mounttable.usagetest.link"
    master = started.result(timeout=scaled(240))
    inputs = ["--usage", f"file://{shared}", "--usage", "viewfs://usagetest/copies", "--usage", f"{shared}/"]
    mounts = ["--conf", f"{mount}./copies=file://{copies}", "--conf", f"{mount}./out=file://{cluster_out}"]
    command = [sys.executable, "-m", "gateway.cli", "usage", "report", "--master", master]
    log = tmp_path / "cluster-report.log"  # a file, not a pipe nobody reads meanwhile
    with open(log, "w") as stderr_file:
        child = subprocess.Popen(
            [*command, *inputs, *mounts, *span, "--out", "viewfs://usagetest/out"],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=stderr_file,
            text=True,
            start_new_session=True,
        )
    try:
        local_out = tmp_path / "report-local"
        inputs = ["--usage", str(shared), "--usage", str(copies), "--usage", f"{shared}/"]
        code = cli_main(["usage", "report", *inputs, *span, "--out", str(local_out)])
        printed = capsys.readouterr()
        assert code == 0, printed.err[-3000:]
        assert "gateway gateway_a-" in printed.out and "gateway gateway_b-" in printed.out
        # Settings for a small input on local[2]: a shuffle partition per core, not Spark's 200.
        assert re.search(r"\] 2 shuffle partition\(s\)$", printed.err, re.MULTILINE), printed.err[-3000:]
        stdout, _ = child.communicate(timeout=scaled(600))
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
    assert child.returncode == 0, log.read_text()[-5000:]
    # The same on the standalone master (they used to be set for local masters only).
    assert re.search(r"\] 2 shuffle partition\(s\)$", log.read_text(), re.MULTILINE), log.read_text()[-5000:]
    assert "viewfs://usagetest/out/day/billing-total/" in stdout

    local_rows, cluster_rows = (
        _rows(local_out / "day" / "summary.csv"),
        _rows(cluster_out / "day" / "summary.csv"),
    )
    # The same figures on both masters (provisional depends on when each ran).
    for rows in (local_rows, cluster_rows):
        for row in rows:
            row.pop("provisional")
    assert cluster_rows == local_rows
    events, errors, connections = _reported(local_rows)
    assert events == expected_events
    assert (errors, connections) == (expected_errors, 2)

    for out in (local_out, cluster_out):
        manifests = [json.loads(p.read_text()) for p in sorted((out / "day").glob("*/manifest.json"))]
        gateway_ids = {g for m in manifests for g in m["gateways"]}
        assert sorted(g.rsplit("-", 1)[0] for g in gateway_ids) == ["gateway_a", "gateway_b"]
        copied = sorted(Path(p).name for m in manifests for p in m["copied_files"])
        assert copied == sorted([renamed.name, same_name.name])
        assert sum(m["records_counted"] for m in manifests) == sum(
            m["input_records"] for m in manifests
        ) - sum(m["duplicate_records"] for m in manifests)
        totals = {
            (r["tenant"], r["usage_type"]): int(r["quantity"])
            for path in (out / "day" / "billing-total").glob("*.csv")
            for r in _rows(path)
        }
        sent = sum(n for (_, _, event), n in expected_events.items() if event == "sent")
        assert {t for t, _ in totals} == {t for t, _, _ in expected_events}
        assert sum(n for (_, usage_type), n in totals.items() if usage_type == "messages-sent") == sent
