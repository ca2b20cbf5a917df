"""``pushgate usage report``: the usage report from the command line.

``gateway/cli.py`` imports this module only when ``usage`` is asked for, so the gateway
runs without pyspark installed (it is the ``spark`` extra).
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from collections.abc import Sequence

from .report import ReportError, ReportOptions, missing_usage_dirs, run_report
from .storage import StorageError, join


def parse_utc(text: str) -> dt.datetime:
    """``2026-11-22``, ``2026-11-22T13``, ``2026-11-22T13:00[:00][Z|+00:00]``: UTC."""
    raw = text.strip().removesuffix("Z")
    if len(raw) == 13 and raw[10] == "T":  # 2026-11-22T13
        raw += ":00"
    try:
        when = dt.datetime.fromisoformat(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a date or time: {text!r}") from None
    if when.tzinfo is None:
        return when.replace(tzinfo=dt.UTC)
    if when.utcoffset() != dt.timedelta(0):
        raise argparse.ArgumentTypeError(f"give times in UTC: {text!r}")
    return when.astimezone(dt.UTC)


def parse_conf(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"--conf takes KEY=VALUE, not {text!r}")
    return key.strip(), value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pushgate usage", description="Usage reports (docs/usage.md).")
    commands = parser.add_subparsers(dest="command", required=True)
    report = commands.add_parser(
        "report",
        help="per-tenant and per-queue usage and billing for [--from, --to)",
        description="Read the usage files of every gateway in the usage directories and write one "
        "report directory per period (UTC; --from inclusive, --to exclusive) under --out, replacing "
        "earlier runs' periods. Directories and --out are local paths or any URI the session's "
        "Hadoop configuration reads (file:, hdfs:, s3a:, ...).",
    )
    report.add_argument(
        "--usage",
        dest="usage_dirs",
        action="append",
        default=[],
        metavar="DIR",
        help="a usage directory (pushgate serve --usage-dir); repeat for several",
    )
    report.add_argument("--data", help="a gateway's data directory: reads DATA/usage")
    report.add_argument("--from", dest="start", type=parse_utc, required=True, help="UTC start (inclusive)")
    report.add_argument("--to", dest="end", type=parse_utc, required=True, help="UTC end (exclusive)")
    report.add_argument("--granularity", choices=["hour", "day"], default="day")
    report.add_argument("--tenant", help="only this tenant (written under OUT/tenant=T/)")
    report.add_argument("--master", default="local[*]", help="Spark master URL (default local[*])")
    report.add_argument("--out", help="output directory (default DATA/reports; required without --data)")
    report.add_argument(
        "--conf",
        type=parse_conf,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting for the session (spark.executor.memory=4g, spark.hadoop.*=...)",
    )
    return parser


def main(argv: Sequence[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    usage_dirs = list(args.usage_dirs) + ([join(args.data, "usage")] if args.data else [])
    out_dir = args.out or (join(args.data, "reports") if args.data else None)
    if out_dir is None:
        parser.error("--out is required without --data")
    try:
        options = ReportOptions(
            usage_dirs=tuple(usage_dirs),
            out_dir=out_dir,
            start=args.start,
            end=args.end,
            granularity=args.granularity,
            tenant=args.tenant,
        ).check()
    except ReportError as exc:
        print(f"pushgate usage report: {exc}", file=sys.stderr)
        return 2
    # The local ones now, before Spark starts; the others once it has.
    missing = missing_usage_dirs(usage_dirs, None)
    if missing:
        print(f"pushgate usage report: no usage directory at {', '.join(missing)}", file=sys.stderr)
        return 1

    from pyspark.sql import SparkSession

    from .session import build_session

    # Called from a program that has a session already (a notebook, the tests): use it as
    # it is (--conf does not change it), and leave it running. Otherwise start one on
    # --master and stop it at the end.
    active = SparkSession.getActiveSession()
    spark = active or build_session(args.master, conf=dict(args.conf))
    try:
        result = run_report(spark, options)
    except (ReportError, StorageError) as exc:
        print(f"pushgate usage report: {exc}", file=sys.stderr)
        return 1
    finally:
        if active is None:
            spark.stop()
    for period in result.periods:
        flag = " (provisional)" if period.provisional else ""
        print(f"{period.period}: {period.queue_rows} queue row(s) from {period.input_files} file(s){flag}")
    for gateway, read in result.gateways.items():
        print(f"gateway {gateway or '(no file id)'}: {read['files']} file(s), {read['records']} record(s)")
    print(f"summary: {join(result.tree, 'summary.csv')}")
    print(f"billing total: {result.billing_total}")
    if result.bad_files:
        print(f"{len(result.bad_files)} bad usage file(s) skipped (named in the manifests)")
    return 0
