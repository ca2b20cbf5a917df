"""The report's output edge: a period's directory assembled aside and swapped into place,
the tree's summary and manifest rebuilt, the run's billing total written.

Every operation goes through a :class:`~spark.storage.Storage`, so the output may live on
any file system the session reaches (a local disk, a shared mount, HDFS, ...).
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from . import transforms as T
from .io import BadFile, UsageFile, gateways_of
from .storage import Storage, join, name_of

DATASETS = ("queues", "tenants", "billing")


@dataclass
class PeriodResult:
    period: str
    provisional: bool
    queue_rows: int
    input_files: int
    bad_files: int


@dataclass(frozen=True, slots=True)
class RunInputs:
    """What one run read: the checked files, the copies left out, the bad files."""

    files: Sequence[UsageFile]
    copies: Sequence[UsageFile]
    bad: Sequence[BadFile]


def iso(when: dt.datetime) -> str:
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


def written_periods(storage: Storage, staging: str) -> dict[str, set[str]]:
    """Per dataset, the period keys Spark wrote a partition for (``<name>/period=<key>``)."""
    found: dict[str, set[str]] = {}
    for name in DATASETS:
        parts = storage.list_dirs(join(staging, name))
        found[name] = {name_of(p).removeprefix("period=") for p in parts if name_of(p).startswith("period=")}
    return found


def assemble_period(
    storage: Storage,
    staging: str,
    written: dict[str, set[str]],
    key: str,
    start: dt.datetime,
    end: dt.datetime,
    rows: list[dict[str, Any]],
    inputs: RunInputs,
    tenant: str | None,
    provisional: bool,
    now: dt.datetime,
) -> tuple[str, PeriodResult]:
    """Gather one period's outputs into ``staging/periods/<key>`` (not yet visible);
    return that directory and the period's result."""
    directory = join(staging, "periods", key)
    storage.mkdirs(directory)
    for name in DATASETS:
        if key in written[name]:
            storage.rename(join(staging, name, f"period={key}"), join(directory, name))
    in_period = [f for f in inputs.files if start <= f.hour < end]
    copied = {f.path for f in inputs.copies}
    read = [f for f in in_period if f.path not in copied]
    bad_in_period = [b for b in inputs.bad if start <= b.hour < end]
    input_records = sum(f.rows for f in in_period)
    counted = sum(int(r["records"]) for r in rows)
    manifest = {
        "period": key,
        "period_start": iso(start),
        "period_end": iso(end),
        "provisional": provisional,
        "generated_at": iso(now),
        "tenant_filter": tenant,
        "input_files": [f.path for f in read],
        "copied_files": [f.path for f in in_period if f.path in copied],
        # Which gateways' files were read: per gateway id ("" for files without a file id).
        "gateways": gateways_of(read),
        "input_records": input_records,
        "records_counted": counted,
        # Only meaningful over all tenants: a tenant filter also leaves records out.
        "duplicate_records": input_records - counted if tenant is None else None,
        "malformed_files": [{"path": b.path, "reason": b.reason} for b in bad_in_period],
        "queue_rows": len(rows),
    }
    storage.write_bytes(join(directory, "summary.csv"), summary_csv(rows))
    storage.write_bytes(
        join(directory, "manifest.json"), (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()
    )
    return directory, PeriodResult(key, provisional, len(rows), len(read), len(bad_in_period))


def write_tree_summary(storage: Storage, tree: str, granularity: str) -> None:
    """Rebuild the tree's summary.csv and manifest.json from every period directory in it."""
    lines: list[dict[str, str]] = []
    periods: list[dict[str, Any]] = []
    for directory in storage.list_dirs(tree):
        summary, manifest = join(directory, "summary.csv"), join(directory, "manifest.json")
        if not (storage.exists(summary) and storage.exists(manifest)):
            continue  # not a period (billing-total/), or one from before manifests
        lines.extend(csv.DictReader(io.StringIO(storage.read_bytes(summary).decode())))
        doc = json.loads(storage.read_bytes(manifest))
        periods.append(
            {
                k: doc[k]
                for k in ("period", "period_start", "period_end", "provisional", "generated_at", "queue_rows")
            }
            | {"malformed_files": len(doc["malformed_files"]), "gateways": sorted(doc.get("gateways", {}))}
        )
    out = io.StringIO()
    # Today's columns: a period written by an older version lacks the newer ones (empty).
    writer = csv.DictWriter(out, T.SUMMARY_COLUMNS, restval="", extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    # ISO times sort as text.
    writer.writerows(sorted(lines, key=lambda line: (line["tenant"], line["queue"], line["period_start"])))
    storage.write_bytes(join(tree, "summary.csv"), out.getvalue().encode())
    manifest_doc = {"granularity": granularity, "periods": periods}
    storage.write_bytes(
        join(tree, "manifest.json"), (json.dumps(manifest_doc, indent=2, sort_keys=True) + "\n").encode()
    )
