"""The usage report on synthetic usage files: time for 1, 3 and 10 million records.

Run: ``python bench/usage_report.py [--rows 1000000,3000000,10000000] [--master local[2]]``;
``--standalone`` starts a standalone master and worker here (pyspark's ``spark-class``) and
runs on them; ``--cli`` times ``pushgate usage report`` child processes instead (what an
operator waits for: the session's start included); ``--rows 7`` is the 7-record case;
``--data-dir DIR`` keeps the generated files (10 million records: 100 files, 18 MB) for
the next run.

What it does, in one run (compare the ratios, not absolute figures across runs):

- writes synthetic usage files the way a gateway does (Parquet, zstd, the usage schema,
  ``date=/hour=`` partitions), 100,000 records per file spread over the 24 hours of one
  day: 50 tenants x 40 queues x 10 (operation, outcome) kinds, latency histograms filled;
- starts one SparkSession (its start-up time is printed on its own) and runs the report
  once on a small warm-up set, so the JVM's JIT warm-up is not charged to the first size;
- runs ``spark.report.run_report`` (day granularity) on each size and prints seconds,
  records per second and the growth against the smallest size (linear growth is 1.0x
  per 1.0x more records).

The gateway's cost of recording usage (usage on vs off) is measured by
``bench/usage_overhead.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from gateway.local_ports import free_ports
from gateway.usage.record import BUCKETS, FILE_ID_KEY, SCHEMA
from spark.report import ReportOptions, run_report
from spark.session import build_session
from spark.standalone import StandaloneCluster

DAY = dt.datetime(2026, 11, 20, tzinfo=dt.UTC)
PER_FILE = 100_000
KINDS = [
    ("send", "ok", "http"),
    ("send", "queue_not_found", "http"),
    ("push", "ok", "ws"),
    ("push", "ok", "sse"),
    ("receive", "ok", "http"),
    ("ack", "ok", "ws"),
    ("nack", "ok", "ws"),
    ("deduplicated", "ok", "http"),
    ("throttled", "rate_limited", "http"),
    ("connect", "ok", "ws"),
]


def _template(n: int) -> dict[str, pa.Array]:
    """The columns every file shares (all but record_id and the window)."""
    tenants, queues = 50, 40
    index = list(range(n))
    kind = [KINDS[i % len(KINDS)] for i in index]
    histogram = [[(i + b) % 7 if b < BUCKETS - 1 else 0 for b in range(BUCKETS)] for i in range(64)]
    return {
        "tenant": pa.array([f"tenant-{(i // len(KINDS)) % tenants}" for i in index]),
        "queue": pa.array([f"queue-{(i // (len(KINDS) * tenants)) % queues}" for i in index]),
        "operation": pa.array([k[0] for k in kind]),
        "transport": pa.array([k[2] for k in kind]),
        "outcome": pa.array([k[1] for k in kind]),
        "count": pa.array([1 + i % 97 for i in index], pa.int64()),
        "bytes": pa.array([1024 * (1 + i % 97) for i in index], pa.int64()),
        "latency_count": pa.array([sum(histogram[i % 64]) for i in index], pa.int64()),
        "latency_sum_ms": pa.array([float(i % 500) for i in index], pa.float64()),
        "latency_buckets": pa.array([histogram[i % 64] for i in index], pa.list_(pa.int64())),
        "row": pa.array([str(i) for i in index]),
    }


def write_files(root: Path, rows: int, template: dict[str, pa.Array]) -> int:
    files = 0
    for start in range(0, rows, PER_FILE):
        n = min(PER_FILE, rows - start)
        sequence = start // PER_FILE
        hour = DAY + dt.timedelta(hours=sequence % 24, seconds=10 * (sequence // 24))
        gateway = f"bench{sequence % 4}"
        directory = root / "usage" / f"date={hour:%Y-%m-%d}" / f"hour={hour:%H}"
        directory.mkdir(parents=True, exist_ok=True)
        window = pa.array([int(hour.timestamp() * 1e6)] * n, pa.timestamp("us", tz="UTC"))
        columns = {
            "record_id": pc.binary_join_element_wise(
                f"{gateway}-{sequence}", template["row"].slice(0, n), "-"
            ),
            "gateway_id": pa.array([gateway] * n),
            "window_start": window,
            "window_end": window,
        }
        columns |= {k: v.slice(0, n) for k, v in template.items() if k != "row"}
        table = pa.table({f.name: columns[f.name] for f in SCHEMA}, schema=SCHEMA)
        # Named as the gateway's writer names its files, so the report reads them as it
        # reads real ones (copies found by file id, no record-by-record dedupe).
        file_id = f"{gateway}-{sequence}".encode()
        table = table.replace_schema_metadata({**table.schema.metadata, FILE_ID_KEY: file_id})
        pq.write_table(table, directory / f"{gateway}-{sequence:010d}.parquet", compression="zstd")
        files += 1
    return files


def ensure_data(base: Path, rows: int, template: dict[str, pa.Array]) -> tuple[Path, int, float]:
    """``base/data-<rows>``, written unless a complete earlier run left it: (usage directory,
    files, seconds spent writing)."""
    data = base / f"data-{rows}"
    done = data / "complete"
    began = time.monotonic()
    if not done.exists():
        files = write_files(data, rows, template)
        done.write_text(f"{files}\n")
    return data / "usage", int(done.read_text()), time.monotonic() - began


def _cli_run(master: str, usage: Path, out: Path, conf: list[str]) -> tuple[float, float]:
    """``pushgate usage report`` as an operator runs it, in a child process: (wall seconds,
    the report's own seconds, i.e. without the session start)."""
    command = [sys.executable, "-m", "gateway.cli", "usage", "report", "--master", master]
    command += [
        "--usage",
        str(usage),
        "--out",
        str(out),
        "--from",
        f"{DAY:%Y-%m-%d}",
        "--to",
        f"{DAY + dt.timedelta(days=1):%Y-%m-%d}",
    ]
    command += [item for c in conf for item in ("--conf", c)]
    began = time.monotonic()
    run = subprocess.run(command, capture_output=True, text=True, check=False)
    wall = time.monotonic() - began
    if run.returncode != 0:
        raise SystemExit(f"the report failed:\n{run.stderr[-3000:]}")
    done = re.search(r"done in ([0-9.]+) s", run.stderr)
    return wall, float(done.group(1)) if done else float("nan")


def _in_process(
    args: argparse.Namespace, master: str, base: Path, sizes: list[int], template: dict[str, pa.Array]
) -> None:
    began = time.monotonic()
    spark = build_session(
        master, app_name="pushgate-usage-bench", conf=dict(c.split("=", 1) for c in args.conf)
    )
    spark.sparkContext.setLogLevel("ERROR")
    print(f"SparkSession start ({master}): {time.monotonic() - began:.1f} s")
    quiet = lambda _message: None  # noqa: E731
    end = DAY + dt.timedelta(days=1)
    warm, _, _ = ensure_data(base, PER_FILE, template)
    began = time.monotonic()
    run_report(spark, ReportOptions((str(warm),), str(base / "out-warm"), DAY, end, "day"), progress=quiet)
    print(f"warm-up run (100,000 records): {time.monotonic() - began:.1f} s")
    print(f"{'records':>12} {'files':>6} {'write s':>8} {'report s':>9} {'records/s':>11} {'growth':>8}")
    first: tuple[int, float] | None = None
    for rows in sizes:
        usage, files, written = ensure_data(base, rows, template)
        for _ in range(args.rounds):
            began = time.monotonic()
            options = ReportOptions((str(usage),), str(base / f"out-{rows}"), DAY, end, "day")
            run_report(spark, options, progress=quiet)
            seconds = time.monotonic() - began
            first = first or (rows, seconds)
            growth = (seconds / first[1]) / (rows / first[0])
            print(
                f"{rows:>12,} {files:>6} {written:>8.1f} {seconds:>9.1f} {rows / seconds:>11,.0f} {growth:>7.2f}x"
            )
    spark.stop()


def _cold(
    args: argparse.Namespace, master: str, base: Path, sizes: list[int], template: dict[str, pa.Array]
) -> None:
    print(f"{'records':>12} {'files':>6} {'command s':>10} {'report s':>9} {'load':>5}")
    for rows in sizes:
        usage, files, _ = ensure_data(base, rows, template)
        for _ in range(args.rounds):
            wall, report = _cli_run(master, usage, base / f"out-cli-{rows}", args.conf)
            print(f"{rows:>12,} {files:>6} {wall:>10.1f} {report:>9.1f} {os.getloadavg()[0]:>5.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rows", default="1000000,3000000,10000000")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument(
        "--standalone", action="store_true", help="start a standalone master and worker here and use them"
    )
    parser.add_argument("--cores", type=int, default=2, help="the standalone worker's cores")
    parser.add_argument(
        "--cli",
        action="store_true",
        help="time `pushgate usage report` child processes (session start included)",
    )
    parser.add_argument("--rounds", type=int, default=1, help="runs per size")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="a Spark setting")
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory (default: temp)")
    parser.add_argument(
        "--data-dir", type=Path, default=None, help="keep the generated usage files here and reuse them"
    )
    args = parser.parse_args()
    sizes = [int(s) for s in args.rows.split(",")]
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.1f}, Python {platform.python_version()}"
    )
    template = _template(PER_FILE)
    with contextlib.ExitStack() as stack:
        scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(dir=args.dir)))
        base = args.data_dir or scratch
        base.mkdir(parents=True, exist_ok=True)
        master = args.master
        if args.standalone:
            master_port, web_port = free_ports(2)
            cluster = StandaloneCluster(
                scratch / "cluster", master_port, web_port, cores=args.cores, memory="3g"
            )
            began = time.monotonic()
            master = stack.enter_context(cluster.running())
            print(f"standalone master and worker ({args.cores} cores) up: {time.monotonic() - began:.1f} s")
        (_cold if args.cli else _in_process)(args, master, base, sizes, template)


if __name__ == "__main__":
    main()
