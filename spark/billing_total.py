"""The per-tenant billing total of one report run: each billable usage type summed over
every period of the run's range [--from, --to).

The billing lines (``billing/*.parquet``) are per period; an invoice covers a range (a
month of days). The total is summed on the driver from the queue rows the report collects
for its summaries anyway (tenants x queues x periods rows, however many records went in),
with the same table of usage types (:data:`spark.transforms.BILLING_TYPES`) as the lines,
so no Spark job is added for it.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
from collections.abc import Iterable, Mapping
from typing import Any

from .transforms import BILLING_TYPES

COLUMNS = ("tenant", "usage_type", "quantity", "unit", "range_start", "range_end", "periods", "provisional")


def _iso(when: dt.datetime) -> str:
    return when.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def billing_totals(
    rows: Iterable[Mapping[str, Any]], start: dt.datetime, end: dt.datetime
) -> list[dict[str, Any]]:
    """One row per tenant x usage type with a quantity above zero, sorted: ``quantity``
    summed over the range, ``periods`` with usage of that type, ``provisional`` true if any
    of them may still get data (bill a total only when it is false)."""
    totals: dict[tuple[str, str], dict[str, Any]] = {}
    for row in rows:
        for usage_type, measure, unit in BILLING_TYPES:
            quantity = int(row[measure] or 0)
            if quantity <= 0:
                continue
            total = totals.setdefault(
                (row["tenant"], usage_type),
                {
                    "tenant": row["tenant"],
                    "usage_type": usage_type,
                    "quantity": 0,
                    "unit": unit,
                    "range_start": _iso(start),
                    "range_end": _iso(end),
                    "periods": set(),
                    "provisional": False,
                },
            )
            total["quantity"] += quantity
            total["periods"].add(row["period"])
            total["provisional"] = total["provisional"] or bool(row["provisional"])
    out = []
    for key in sorted(totals):
        total = totals[key]
        out.append(total | {"periods": len(total["periods"])})
    return out


def billing_total_csv(totals: Iterable[Mapping[str, Any]]) -> bytes:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLUMNS)
    for total in totals:
        writer.writerow(
            [("true" if v else "false") if isinstance(v, bool) else v for v in (total[c] for c in COLUMNS)]
        )
    return out.getvalue().encode()
