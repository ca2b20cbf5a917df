"""The usage report job: usage files in, per-period report directories out.

Output, under ``--out`` (``OUT``), one directory per period, each replaced whole::

    OUT/<granularity>/<period>/queues/*.parquet    per tenant x queue (all measures,
                                                   histograms and percentiles)
                              /tenants/*.parquet   per tenant
                              /billing/*.parquet   per tenant x usage type
                              /summary.csv         the queue rows, sorted
                              /manifest.json       inputs, bad files, provisional, counts
    OUT/<granularity>/summary.csv                  every period's rows, sorted
    OUT/<granularity>/manifest.json                every period, in order

With ``--tenant T`` the tree is ``OUT/tenant=T/<granularity>/...`` so that a one-tenant
run never replaces an all-tenant period. ``<period>`` is ``2026-11-22`` or ``2026-11-22T13``.
"""

from __future__ import annotations

import csv
import datetime as dt
import fcntl
import io
import json
import shutil
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from . import transforms as T
from .io import BadFile, UsageFile, drop_copies, find_usage_files, read_usage, replace_dir, write_atomic

Progress = Callable[[str], None]
# How long after a period ends its data may still arrive: a gateway holds at most one
# flush interval (10 s by default) plus retries of a failed write; 15 minutes is ample.
DEFAULT_SETTLE = dt.timedelta(minutes=15)
DATASETS = ("queues", "tenants", "billing")


class ReportError(Exception):
    """A report that cannot run as asked (bad range); ``code`` is stable."""

    code = "invalid_report_request"


@dataclass(frozen=True, slots=True)
class ReportOptions:
    data_dir: Path
    out_dir: Path
    start: dt.datetime  # UTC, inclusive
    end: dt.datetime  # UTC, exclusive
    granularity: str = "day"
    tenant: str | None = None
    settle: dt.timedelta = DEFAULT_SETTLE
    now: dt.datetime | None = None  # tests fix it; None: the wall clock

    def check(self) -> ReportOptions:
        if self.granularity not in T.GRANULARITIES:
            raise ReportError(f"granularity must be one of {', '.join(T.GRANULARITIES)}")
        for name, when in (("--from", self.start), ("--to", self.end)):
            if when.tzinfo is None or when.utcoffset() != dt.timedelta(0):
                raise ReportError(f"{name} must be in UTC")
            if when != period_floor(when, self.granularity):
                raise ReportError(f"{name} must start a {self.granularity} ({when.isoformat()} does not)")
        if self.end <= self.start:
            raise ReportError("--to must be after --from")
        return self

    @property
    def tree(self) -> Path:
        base = self.out_dir if self.tenant is None else self.out_dir / f"tenant={self.tenant}"
        return base / self.granularity


@dataclass
class PeriodResult:
    period: str
    provisional: bool
    queue_rows: int
    input_files: int
    bad_files: int


@dataclass
class ReportResult:
    tree: Path
    periods: list[PeriodResult] = field(default_factory=list)
    files_read: int = 0
    bad_files: list[BadFile] = field(default_factory=list)
    seconds: float = 0.0


def period_floor(when: dt.datetime, granularity: str) -> dt.datetime:
    when = when.replace(minute=0, second=0, microsecond=0)
    return when.replace(hour=0) if granularity == "day" else when


def period_key(start: dt.datetime, granularity: str) -> str:
    return f"{start:%Y-%m-%d}" if granularity == "day" else f"{start:%Y-%m-%dT%H}"


def periods_between(start: dt.datetime, end: dt.datetime, granularity: str) -> list[dt.datetime]:
    step, out, current = T.GRANULARITIES[granularity], [], start
    while current < end:
        out.append(current)
        current += step
    return out


class StderrProgress:
    """Progress lines on stderr with the seconds since the run began (Spark adds its own
    stage progress bars when stderr is a terminal)."""

    def __init__(self) -> None:
        self.began = time.monotonic()

    def __call__(self, message: str) -> None:
        print(f"[usage report {time.monotonic() - self.began:6.1f}s] {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True, slots=True)
class ReportFrames:
    queues: DataFrame
    tenants: DataFrame
    billing: DataFrame
    cached: DataFrame  # the queue aggregation every output reads; unpersist when done


def build_report(
    records: DataFrame, options: ReportOptions, now: dt.datetime, dedupe_records: bool = True
) -> ReportFrames:
    """The report's DataFrames (queues, tenants, billing) from raw usage records.

    ``dedupe_records`` false skips the record-level dedupe (a shuffle of every record)
    when the caller already left out copied files and every file has a file id.

    The per-queue aggregation is cached: the three outputs and the summary all read it,
    and it is small (tenants x queues x periods rows) however many records went in.
    """
    unique = T.dedupe(records) if dedupe_records else records
    kept = T.in_range(unique, options.start, options.end, options.tenant)
    operations = T.operation_usage(T.with_period(kept, options.granularity))
    aggregated = T.queue_usage(operations).cache()
    queues = T.with_latency_percentiles(
        T.with_period_end(aggregated, options.granularity, now, options.settle)
    )
    tenants = T.with_latency_percentiles(
        T.with_period_end(T.tenant_usage(aggregated), options.granularity, now, options.settle)
    )
    return ReportFrames(queues, tenants, T.billing_lines(tenants), aggregated)


def run_report(spark: SparkSession, options: ReportOptions, progress: Progress | None = None) -> ReportResult:
    """Run the report for [start, end) and replace each of its periods' directories."""
    options.check()
    began = time.monotonic()
    progress = progress or StderrProgress()
    now = options.now or dt.datetime.now(dt.UTC)
    tree = options.tree
    tree.mkdir(parents=True, exist_ok=True)
    result = ReportResult(tree)
    with open(tree / ".lock", "w") as lock:
        # Two runs on one tree would race on the same period directories.
        fcntl.flock(lock, fcntl.LOCK_EX)
        progress(
            f"checking usage files in {options.data_dir} for [{options.start:%Y-%m-%dT%H:%MZ}, {options.end:%Y-%m-%dT%H:%MZ})"
        )
        files, bad = find_usage_files(options.data_dir, options.start, options.end)
        result.files_read, result.bad_files = len(files), bad
        progress(
            f"{len(files)} file(s), {sum(f.rows for f in files)} record(s); {len(bad)} bad file(s) skipped"
        )
        for b in bad:
            progress(f"skipped {b.path}: {b.reason}")
        read, copies = drop_copies(files)
        if copies:
            progress(f"{len(copies)} copied file(s) left out (their records are in another file)")
        # Files without a file id (not written by a gateway) may repeat any record.
        dedupe_records = any(f.file_id is None for f in read)
        frames = build_report(read_usage(spark, read), options, now, dedupe_records)
        queues, tenants, billing = frames.queues, frames.tenants, frames.billing
        staging = tree / f".staging-{uuid.uuid4().hex[:12]}"
        try:
            for name, frame in (("queues", queues), ("tenants", tenants), ("billing", billing)):
                progress(f"aggregating and writing {name}")
                # No repartition: the aggregation is cached in a few partitions already, and
                # a shuffle per output cost more than the few extra small files.
                frame.write.partitionBy("period").parquet(str(staging / name))
            progress("collecting the summary")
            rows = queues.select(
                "period",
                "records",
                # As text, cut in the session's zone (UTC): collect() would hand back naive
                # datetimes in the Python process's local zone.
                *(
                    F.date_format(c, "yyyy-MM-dd'T'HH:mm:ss'Z'").alias(c)
                    if c in ("period_start", "period_end")
                    else F.col(c)
                    for c in T.SUMMARY_COLUMNS
                ),
            ).collect()
            periods = periods_between(options.start, options.end, options.granularity)
            for i, start in enumerate(periods):
                key = period_key(start, options.granularity)
                period_rows = [r.asDict() for r in rows if r["period"] == key]
                outcome = _assemble_period(staging, key, start, period_rows, files, copies, bad, options, now)
                replace_dir(staging / "periods" / key, tree / key)
                result.periods.append(outcome)
                if len(periods) > 1 and (i + 1) % max(1, len(periods) // 10) == 0:
                    progress(f"replaced {i + 1}/{len(periods)} period(s)")
            _write_tree_summary(tree)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
            frames.cached.unpersist()
    result.seconds = time.monotonic() - began
    progress(f"done in {result.seconds:.1f} s: {len(result.periods)} period(s) in {tree}")
    return result


def _iso(when: dt.datetime) -> str:
    return when.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _csv_value(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def summary_csv(rows: list[dict[str, Any]]) -> bytes:
    """The summary CSV: a header and the queue rows sorted by tenant, queue, period."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(T.SUMMARY_COLUMNS)
    ordered = sorted(rows, key=lambda r: (r["tenant"], r["queue"], r["period_start"]))
    for row in ordered:
        writer.writerow([_csv_value(row[c]) for c in T.SUMMARY_COLUMNS])
    return out.getvalue().encode()


def _assemble_period(
    staging: Path,
    key: str,
    start: dt.datetime,
    rows: list[dict[str, Any]],
    files: list[UsageFile],
    copies: list[UsageFile],
    bad: list[BadFile],
    options: ReportOptions,
    now: dt.datetime,
) -> PeriodResult:
    """Gather one period's outputs into ``staging/periods/<key>`` (not yet visible)."""
    directory = staging / "periods" / key
    directory.mkdir(parents=True)
    for name in DATASETS:
        part = staging / name / f"period={key}"
        if part.is_dir():
            part.rename(directory / name)
    end = start + T.GRANULARITIES[options.granularity]
    in_period = [f for f in files if start <= f.hour < end]
    bad_in_period = [b for b in bad if start <= b.hour < end]
    input_records = sum(f.rows for f in in_period)
    counted = sum(int(r["records"]) for r in rows)
    provisional = end + options.settle > now
    manifest = {
        "granularity": options.granularity,
        "period": key,
        "period_start": _iso(start),
        "period_end": _iso(end),
        "provisional": provisional,
        "generated_at": _iso(now),
        "tenant_filter": options.tenant,
        "input_files": [str(f.path) for f in in_period if f not in copies],
        "copied_files": [str(f.path) for f in in_period if f in copies],
        "input_records": input_records,
        "records_counted": counted,
        # Only meaningful over all tenants: a tenant filter also leaves records out.
        "duplicate_records": input_records - counted if options.tenant is None else None,
        "malformed_files": [{"path": str(b.path), "reason": b.reason} for b in bad_in_period],
        "queue_rows": len(rows),
    }
    (directory / "summary.csv").write_bytes(summary_csv(rows))
    (directory / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return PeriodResult(key, provisional, len(rows), len(in_period), len(bad_in_period))


def _write_tree_summary(tree: Path) -> None:
    """Rebuild the tree's summary.csv and manifest.json from every period directory in it."""
    header: list[str] | None = None
    lines: list[list[str]] = []

    def order(line: list[str]) -> tuple[str, str, str]:
        # tenant, queue, period_start are the first three columns; ISO times sort as text.
        return line[0], line[1], line[2]

    periods: list[dict[str, Any]] = []
    for directory in sorted(p for p in tree.iterdir() if p.is_dir() and not p.name.startswith(".")):
        summary, manifest = directory / "summary.csv", directory / "manifest.json"
        if not (summary.is_file() and manifest.is_file()):
            continue
        with open(summary, newline="") as f:
            reader = csv.reader(f)
            header = next(reader)
            lines.extend(reader)
        doc = json.loads(manifest.read_text())
        periods.append(
            {
                k: doc[k]
                for k in ("period", "period_start", "period_end", "provisional", "generated_at", "queue_rows")
            }
            | {"malformed_files": len(doc["malformed_files"])}
        )
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(header or T.SUMMARY_COLUMNS)
    ordered: list[list[str]] = sorted(lines, key=order)
    writer.writerows(ordered)
    write_atomic(tree / "summary.csv", out.getvalue().encode())
    manifest_doc = {"granularity": tree.name, "periods": periods}
    write_atomic(tree / "manifest.json", (json.dumps(manifest_doc, indent=2, sort_keys=True) + "\n").encode())
