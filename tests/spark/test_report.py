"""The report job on real usage files: outputs, bad files, duplicates, late files,
idempotent re-runs, provisional periods, one tenant. One shared Spark session."""

from __future__ import annotations

import csv
import datetime as dt
import json
import shutil
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from spark.report import ReportError, ReportOptions, run_report
from tests.spark.records import DAY, at, write_window

NOW = DAY + dt.timedelta(days=3)  # every period of DAY has settled


def _send(tenant: str, queue: str, count: int, nbytes: int, latency_s: float) -> dict[str, Any]:
    return dict(
        tenant=tenant,
        queue=queue,
        operation="send",
        transport="http",
        count=count,
        nbytes=nbytes,
        latency_s=latency_s,
    )


def _options(data: Path, out: Path, *args: Any, **kwargs: Any) -> ReportOptions:
    """Options reading the usage directory of gateway data directory ``data``."""
    return ReportOptions((str(data / "usage"),), str(out), *args, **kwargs)


def _summary(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _pick(rows: list[dict[str, str]], *columns: str) -> list[tuple[str, ...]]:
    return [tuple(r[c] for c in columns) for r in rows]


@pytest.fixture
def data(tmp_path: Path) -> Path:
    """Two hours of two tenants, a copied file, a truncated file and a foreign file."""
    d = tmp_path / "data"
    first = write_window(
        d,
        at(1),
        0,
        [
            _send("acme", "orders", 10, 1000, 0.0008),
            dict(
                tenant="acme",
                queue="orders",
                operation="push",
                transport="ws",
                count=8,
                nbytes=800,
                latency_s=0.004,
            ),
            dict(tenant="acme", queue="orders", operation="ack", transport="ws", count=8),
            dict(
                tenant="beta", queue="jobs", operation="throttled", transport="http", outcome="rate_limited"
            ),
            dict(tenant="beta", queue="jobs", operation="connect", transport="ws", count=2),
        ],
    )
    second = write_window(
        d, at(2), 1, [_send("acme", "orders", 5, 500, 0.0008), _send("beta", "jobs", 1, 10, 0.02)]
    )
    # A file of the right schema but no file id (not written by a gateway) repeating the
    # second file's records: only record ids can tell, and they do.
    pq.write_table(pq.read_table(second).replace_schema_metadata(None), second.with_name("foreign.parquet"))
    # The same records under another name (a file copied back by a sync tool): counted once.
    shutil.copy(first, first.with_name("copy-of-gw-0000000000.parquet"))
    (first.parent / "truncated.parquet").write_bytes(first.read_bytes()[:100])
    (first.parent / "notes.parquet").write_text("not parquet at all")
    (first.parent / ".gw-0000000009.parquet.tmp").write_bytes(b"an unfinished write: never read")
    return d


def test_day_report_outputs_bad_files_and_duplicates(spark: SparkSession, data: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    options = _options(data, out, DAY, DAY + dt.timedelta(days=1), "day", now=NOW)
    result = run_report(spark, options, progress=lambda _: None)
    assert [p.period for p in result.periods] == ["2026-11-20"]
    assert sorted(b.name for b in result.bad_files) == ["notes.parquet", "truncated.parquet"]

    period = out / "day" / "2026-11-20"
    rows = _summary(period / "summary.csv")
    columns = ("tenant", "queue", "period_start", "provisional", "sent", "delivered", "acked", "bytes")
    assert _pick(rows, *columns) == [
        ("acme", "orders", "2026-11-20T00:00:00Z", "false", "15", "8", "8", "1500"),
        ("beta", "jobs", "2026-11-20T00:00:00Z", "false", "1", "0", "0", "10"),
    ]
    assert _pick(rows, "throttled", "connections", "errors") == [("0", "0", "0"), ("1", "2", "0")]
    # acme: two send requests in (0.5, 1] ms, p50 is rank 1 of 2, halfway into the bucket;
    # one push observation in (2.5, 5]: p99 is 99% into it. beta: one send in (10, 25].
    assert _pick(rows, "send_latency_p50_ms", "delivery_latency_p99_ms") == [("0.75", "4.975"), ("17.5", "")]

    manifest = json.loads((period / "manifest.json").read_text())
    assert manifest["provisional"] is False
    assert {Path(m["path"]).name for m in manifest["malformed_files"]} == {
        "notes.parquet",
        "truncated.parquet",
    }
    assert [Path(p).name for p in manifest["copied_files"]] == ["copy-of-gw-0000000000.parquet"]
    assert len(manifest["input_files"]) == 3 and manifest["duplicate_records"] == 7
    assert manifest["queue_rows"] == 2

    billing = spark.read.parquet(str(period / "billing")).select("tenant", "usage_type", "quantity", "unit")
    assert sorted(tuple(r) for r in billing.collect()) == [
        ("acme", "data-in", 1500, "bytes"),
        ("acme", "data-out", 800, "bytes"),
        ("acme", "messages-delivered", 8, "messages"),
        ("acme", "messages-sent", 15, "messages"),
        ("beta", "connections", 2, "connections"),
        ("beta", "data-in", 10, "bytes"),
        ("beta", "messages-sent", 1, "messages"),
    ]
    tenants = spark.read.parquet(str(period / "tenants")).where("tenant = 'acme'").first()
    assert tenants is not None and tenants["sent"] == 15 and tenants["send_latency_p50_ms"] == 0.75
    assert _summary(out / "day" / "summary.csv") == rows
    assert not [p for p in (out / "day").iterdir() if p.name.startswith(".staging")]


def test_rerun_replaces_the_period_and_picks_up_a_late_file(
    spark: SparkSession, data: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    start, end = DAY, DAY + dt.timedelta(hours=4)
    run_report(spark, _options(data, out, start, end, "hour", now=at(3.5)), progress=lambda _: None)
    first = _summary(out / "hour" / "summary.csv")
    assert [
        (r["tenant"], r["queue"], r["period_start"][11:13], r["sent"], r["provisional"]) for r in first
    ] == [
        ("acme", "orders", "01", "10", "false"),
        ("acme", "orders", "02", "5", "false"),
        ("beta", "jobs", "01", "0", "false"),
        ("beta", "jobs", "02", "1", "false"),
    ]
    hours = json.loads((out / "hour" / "manifest.json").read_text())["periods"]
    # Hour 3 ends at 04:00, after "now": still open, so provisional (and empty so far).
    assert [(p["period"], p["provisional"]) for p in hours] == [
        ("2026-11-20T00", False),
        ("2026-11-20T01", False),
        ("2026-11-20T02", False),
        ("2026-11-20T03", True),
    ]
    # A gateway's file for hour 2 arrives late; the re-run replaces the periods whole.
    write_window(data, at(2.5), 0, [_send("acme", "orders", 7, 70, 0.001)], gateway="gw-late")
    run_report(spark, _options(data, out, start, end, "hour", now=at(3.5)), progress=lambda _: None)
    again = _summary(out / "hour" / "summary.csv")
    assert [(r["queue"], r["period_start"][11:13], r["sent"]) for r in again] == [
        ("orders", "01", "10"),
        ("orders", "02", "12"),
        ("jobs", "01", "0"),
        ("jobs", "02", "1"),
    ]
    assert sorted(p.name for p in (out / "hour").iterdir() if not p.name.startswith(".")) == [
        "2026-11-20T00",
        "2026-11-20T01",
        "2026-11-20T02",
        "2026-11-20T03",
        "billing-total",
        "manifest.json",
        "summary.csv",
    ]
    # One tenant goes to its own tree, never replacing the all-tenant periods.
    run_report(
        spark, _options(data, out, at(2), at(3), "hour", tenant="beta", now=NOW), progress=lambda _: None
    )
    assert _pick(_summary(out / "tenant=beta" / "hour" / "summary.csv"), "tenant", "sent") == [("beta", "1")]
    assert _summary(out / "hour" / "summary.csv") == again


@pytest.mark.parametrize(
    ("start", "end", "granularity", "message"),
    [
        (at(1), at(25), "day", "must start a day"),
        (DAY, DAY, "day", "after"),
        (DAY, at(1.5), "hour", "must start a hour"),
        (DAY.replace(tzinfo=None), at(1), "hour", "UTC"),
    ],
)
def test_a_range_that_does_not_fit_the_granularity_is_refused(
    start: dt.datetime, end: dt.datetime, granularity: str, message: str, tmp_path: Path
) -> None:
    with pytest.raises(ReportError, match=message):
        _options(tmp_path, tmp_path, start, end, granularity).check()


def test_overlapping_directories_and_copies_count_once_and_the_gateways_are_named(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Two gateways write one shared directory; the report is given it three times (a
    trailing slash, a file: URI) and a directory of copies: each record counts once."""
    shared = tmp_path / "gateways"
    a = write_window(shared, at(1), 0, [_send("acme", "orders", 3, 30, 0.001)], gateway="gw_a-1111aaaa")
    write_window(shared, at(1), 1, [_send("acme", "orders", 4, 40, 0.001)], gateway="gw_a-1111aaaa")
    b = write_window(shared, at(2), 0, [_send("beta", "jobs", 5, 50, 0.001)], gateway="gw_b-2222bbbb")
    copies = tmp_path / "copies" / "usage"
    for original, name in ((a, "renamed.parquet"), (b, b.name)):
        target = copies / original.parent.relative_to(shared / "usage") / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(original, target)
    usage = str(shared / "usage")
    dirs = (usage, f"{usage}/", f"file://{usage}", str(copies))
    out = tmp_path / "out"
    result = run_report(
        spark,
        ReportOptions(dirs, str(out), DAY, DAY + dt.timedelta(days=1), "day", now=NOW),
        progress=lambda _: None,
    )
    assert _pick(_summary(out / "day" / "summary.csv"), "tenant", "queue", "sent", "bytes") == [
        ("acme", "orders", "7", "70"),
        ("beta", "jobs", "5", "50"),
    ]
    assert result.gateways == {
        "gw_a-1111aaaa": {"files": 2, "records": 2},
        "gw_b-2222bbbb": {"files": 1, "records": 1},
    }
    manifest = json.loads((out / "day" / "2026-11-20" / "manifest.json").read_text())
    assert manifest["gateways"] == result.gateways
    assert sorted(Path(p).name for p in manifest["copied_files"]) == sorted(["renamed.parquet", b.name])
    assert (manifest["input_records"], manifest["records_counted"], manifest["duplicate_records"]) == (
        5,
        3,
        2,
    )
    tree = json.loads((out / "day" / "manifest.json").read_text())
    assert tree["periods"][0]["gateways"] == ["gw_a-1111aaaa", "gw_b-2222bbbb"]

    # The run's billing total, per tenant and usage type over its whole range.
    assert result.billing_total == str(out / "day" / "billing-total" / "2026-11-20_2026-11-21.csv")
    assert _summary(Path(result.billing_total)) == [
        {
            "tenant": tenant,
            "usage_type": usage_type,
            "quantity": quantity,
            "unit": unit,
            "range_start": "2026-11-20T00:00:00Z",
            "range_end": "2026-11-21T00:00:00Z",
            "periods": "1",
            "provisional": "false",
        }
        for tenant, usage_type, quantity, unit in (
            ("acme", "data-in", "70", "bytes"),
            ("acme", "messages-sent", "7", "messages"),
            ("beta", "data-in", "50", "bytes"),
            ("beta", "messages-sent", "5", "messages"),
        )
    ]


def test_a_missing_usage_directory_is_refused_by_name(spark: SparkSession, tmp_path: Path) -> None:
    options = ReportOptions((str(tmp_path / "nowhere"),), str(tmp_path / "out"), DAY, at(24), "day")
    with pytest.raises(ReportError, match=r"no usage directory at .*nowhere"):
        run_report(spark, options, progress=lambda _: None)
