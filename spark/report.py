"""The usage report job: usage files in, per-period report directories out.

Input: any number of usage directories (``--usage``; ``--data D`` is ``D/usage``), each
holding the files of any number of gateways; every record counted once (``spark/io.py``).
Output, under ``--out`` (``OUT``), one directory per period, each replaced whole::

    OUT/<granularity>/<period>/queues/*.parquet    per tenant x queue (all measures,
                                                   histograms and percentiles)
                              /tenants/*.parquet   per tenant
                              /billing/*.parquet   per tenant x usage type
                              /summary.csv         the queue rows, sorted
                              /manifest.json       inputs, gateways, bad files, counts
    OUT/<granularity>/summary.csv                  every period's rows, sorted
    OUT/<granularity>/manifest.json                every period, in order
    OUT/<granularity>/billing-total/<from>_<to>.csv  per tenant x usage type, the run's range

With ``--tenant T`` the tree is ``OUT/tenant=T/<granularity>/...`` so that a one-tenant
run never replaces an all-tenant period. ``<period>`` is ``2026-11-22`` or ``2026-11-22T13``.
Inputs and output may be on any storage the session reaches (``spark/storage.py``).
"""

from __future__ import annotations

import datetime as dt
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from . import transforms as T
from .billing_total import billing_total_csv, billing_totals
from .io import BadFile, UsageRoot, drop_copies, find_usage_files, gateways_of, read_usage
from .output import PeriodResult, RunInputs, assemble_period, write_tree_summary, written_periods
from .session import sized_shuffles
from .storage import StorageError, join, open_storage

Progress = Callable[[str], None]
# How long after a period ends its data may still arrive: a gateway holds at most one
# flush interval (10 s by default) plus retries of a failed write; 15 minutes is ample.
DEFAULT_SETTLE = dt.timedelta(minutes=15)


class ReportError(Exception):
    """A report that cannot run as asked (bad range, missing input); ``code`` is stable."""

    code = "invalid_report_request"


@dataclass(frozen=True, slots=True)
class ReportOptions:
    usage_dirs: tuple[str, ...]  # paths or URIs of usage directories
    out_dir: str  # path or URI
    start: dt.datetime  # UTC, inclusive
    end: dt.datetime  # UTC, exclusive
    granularity: str = "day"
    tenant: str | None = None
    settle: dt.timedelta = DEFAULT_SETTLE
    now: dt.datetime | None = None  # tests fix it; None: the wall clock

    def check(self) -> ReportOptions:
        if not self.usage_dirs:
            raise ReportError("name at least one usage directory (--usage DIR or --data DIR)")
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
    def tree(self) -> str:
        base = self.out_dir if self.tenant is None else join(self.out_dir, f"tenant={self.tenant}")
        return join(base, self.granularity)


@dataclass
class ReportResult:
    tree: str
    periods: list[PeriodResult] = field(default_factory=list)
    files_read: int = 0
    bad_files: list[BadFile] = field(default_factory=list)
    # Per gateway id ("" for files without one): files and records read.
    gateways: dict[str, dict[str, int]] = field(default_factory=dict)
    billing_total: str = ""  # where the run's per-tenant billing total is
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


def missing_usage_dirs(usage_dirs: Sequence[str], spark: SparkSession | None) -> list[str]:
    """The usage directories that do not exist: without a session, only the local ones are
    checked (the command line does so before it starts Spark)."""
    missing = []
    for location in usage_dirs:
        try:
            storage = open_storage(location, spark)
        except StorageError:
            continue  # not checkable without a session
        if not storage.exists(storage.qualify(location)):
            missing.append(location)
    return missing


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


def _gateway_line(gateways: dict[str, dict[str, int]]) -> str:
    named = [f"{g or '(no file id)'} ({n['files']} file(s))" for g, n in gateways.items()]
    return f"{len(gateways)} gateway(s): " + ", ".join(named) if named else "no gateway's files"


def run_report(spark: SparkSession, options: ReportOptions, progress: Progress | None = None) -> ReportResult:
    """Run the report for [start, end) and replace each of its periods' directories."""
    options.check()
    began = time.monotonic()
    progress = progress or StderrProgress()
    now = options.now or dt.datetime.now(dt.UTC)
    missing = missing_usage_dirs(options.usage_dirs, spark)
    if missing:
        raise ReportError(f"no usage directory at {', '.join(missing)}")
    roots = []
    for location in options.usage_dirs:
        storage = open_storage(location, spark)
        roots.append(UsageRoot(storage.qualify(location), storage))
    out = open_storage(options.out_dir, spark)
    tree = out.qualify(options.tree)
    out.mkdirs(tree)
    result = ReportResult(tree)
    # Two runs on one tree would race on the same period directories.
    with out.lock(join(tree, ".lock")):
        names = ", ".join(dict.fromkeys(r.location for r in roots))
        progress(
            f"checking usage files in {names} for [{options.start:%Y-%m-%dT%H:%MZ}, {options.end:%Y-%m-%dT%H:%MZ})"
        )
        files, bad = find_usage_files(roots, options.start, options.end)
        result.files_read, result.bad_files = len(files), bad
        progress(
            f"{len(files)} file(s), {sum(f.rows for f in files)} record(s); {len(bad)} bad file(s) skipped"
        )
        for b in bad:
            progress(f"skipped {b.path}: {b.reason}")
        read, copies = drop_copies(files)
        if copies:
            progress(f"{len(copies)} copied file(s) left out (their records are in another file)")
        result.gateways = gateways_of(read)
        progress(f"reading the files of {_gateway_line(result.gateways)}")
        # Files without a file id (not written by a gateway) may repeat any record.
        dedupe_records = any(f.file_id is None for f in read)
        staging = join(tree, f".staging-{uuid.uuid4().hex[:12]}")
        with sized_shuffles(spark, sum(f.rows for f in read)) as partitions:
            progress(f"{partitions} shuffle partition(s)")
            frames = build_report(read_usage(spark, read), options, now, dedupe_records)
            try:
                for name, frame in (
                    ("queues", frames.queues),
                    ("tenants", frames.tenants),
                    ("billing", frames.billing),
                ):
                    progress(f"aggregating and writing {name}")
                    # No repartition: the aggregation is cached in a few partitions already, and
                    # a shuffle per output cost more than the few extra small files.
                    frame.write.partitionBy("period").parquet(out.spark_path(join(staging, name)))
                progress("collecting the summary")
                rows = [r.asDict() for r in _summary_rows(frames.queues).collect()]
                written = written_periods(out, staging)
                inputs = RunInputs(files, copies, bad)
                periods = periods_between(options.start, options.end, options.granularity)
                step = T.GRANULARITIES[options.granularity]
                for i, start in enumerate(periods):
                    key = period_key(start, options.granularity)
                    directory, outcome = assemble_period(
                        out,
                        staging,
                        written,
                        key,
                        start,
                        start + step,
                        [r for r in rows if r["period"] == key],
                        inputs,
                        options.tenant,
                        start + step + options.settle > now,
                        now,
                    )
                    out.replace_dir(directory, join(tree, key))
                    result.periods.append(outcome)
                    if len(periods) > 1 and (i + 1) % max(1, len(periods) // 10) == 0:
                        progress(f"replaced {i + 1}/{len(periods)} period(s)")
                write_tree_summary(out, tree, options.granularity)
                range_key = f"{period_key(options.start, options.granularity)}_{period_key(options.end, options.granularity)}"
                result.billing_total = join(tree, "billing-total", f"{range_key}.csv")
                out.mkdirs(join(tree, "billing-total"))
                totals = billing_totals(rows, options.start, options.end)
                out.write_bytes(result.billing_total, billing_total_csv(totals))
            finally:
                out.delete(staging)
                frames.cached.unpersist()
    result.seconds = time.monotonic() - began
    progress(f"done in {result.seconds:.1f} s: {len(result.periods)} period(s) in {tree}")
    return result


def _summary_rows(queues: DataFrame) -> DataFrame:
    """The queue rows as the summaries and the billing total need them."""
    return queues.select(
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
    )
