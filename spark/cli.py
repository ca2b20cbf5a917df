"""``pushgate usage report``: the usage report from the command line.

``gateway/cli.py`` imports this module only when ``usage`` is asked for, so the gateway
runs without pyspark installed (it is the ``spark`` extra).
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from collections.abc import Sequence
from pathlib import Path

from .report import ReportError, ReportOptions, run_report


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pushgate usage", description="Usage reports (docs/usage.md).")
    commands = parser.add_subparsers(dest="command", required=True)
    report = commands.add_parser(
        "report",
        help="per-tenant and per-queue usage and billing for [--from, --to)",
        description="Read the usage files under --data and write one report directory per period "
        "(UTC; --from inclusive, --to exclusive) under --out, replacing earlier runs' periods.",
    )
    report.add_argument("--data", type=Path, required=True, help="the gateway's data directory")
    report.add_argument("--from", dest="start", type=parse_utc, required=True, help="UTC start (inclusive)")
    report.add_argument("--to", dest="end", type=parse_utc, required=True, help="UTC end (exclusive)")
    report.add_argument("--granularity", choices=["hour", "day"], default="day")
    report.add_argument("--tenant", help="only this tenant (written under OUT/tenant=T/)")
    report.add_argument("--master", default="local[*]", help="Spark master URL (default local[*])")
    report.add_argument("--out", type=Path, help="output directory (default <data>/reports)")
    return parser


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(argv)
    try:
        options = ReportOptions(
            data_dir=args.data,
            out_dir=args.out or args.data / "reports",
            start=args.start,
            end=args.end,
            granularity=args.granularity,
            tenant=args.tenant,
        ).check()
    except ReportError as exc:
        print(f"pushgate usage report: {exc}", file=sys.stderr)
        return 2
    if not args.data.is_dir():
        print(f"pushgate usage report: no data directory at {args.data}", file=sys.stderr)
        return 1

    from pyspark.sql import SparkSession

    from .session import build_session

    # Called from a program that has a session already (a notebook, the tests): use it,
    # and leave it running. Otherwise start one on --master and stop it at the end.
    active = SparkSession.getActiveSession()
    spark = active or build_session(args.master)
    try:
        result = run_report(spark, options)
    finally:
        if active is None:
            spark.stop()
    for period in result.periods:
        flag = " (provisional)" if period.provisional else ""
        print(f"{period.period}: {period.queue_rows} queue row(s) from {period.input_files} file(s){flag}")
    print(f"summary: {result.tree / 'summary.csv'}")
    if result.bad_files:
        print(f"{len(result.bad_files)} bad usage file(s) skipped (named in the manifests)")
    return 0
