"""The per-tenant billing total: billing types summed over a run's range (no Spark)."""

from __future__ import annotations

import csv
import io
from typing import Any

from spark.billing_total import COLUMNS, billing_total_csv, billing_totals
from tests.spark.records import DAY, at


def _row(tenant: str, period: str, provisional: bool, **measures: int) -> dict[str, Any]:
    zero = dict.fromkeys(("sent", "delivered", "bytes", "delivered_bytes", "connections"), 0)
    return {"tenant": tenant, "queue": "q", "period": period, "provisional": provisional, **zero, **measures}


def test_totals_sum_every_period_and_queue_and_say_if_any_is_provisional() -> None:
    rows = [
        _row("acme", "2026-11-20", False, sent=3, bytes=30),
        _row("acme", "2026-11-20", False, sent=1, bytes=5, connections=2),  # another queue
        _row("acme", "2026-11-21", True, sent=2, bytes=20, delivered=4, delivered_bytes=40),
        _row("beta", "2026-11-20", False, connections=1),
        _row("gamma", "2026-11-20", False),  # nothing billable: no line
    ]
    totals = billing_totals(rows, DAY, at(48))
    assert [
        (t["tenant"], t["usage_type"], t["quantity"], t["periods"], t["provisional"]) for t in totals
    ] == [
        ("acme", "connections", 2, 1, False),
        ("acme", "data-in", 55, 2, True),
        ("acme", "data-out", 40, 1, True),
        ("acme", "messages-delivered", 4, 1, True),
        ("acme", "messages-sent", 6, 2, True),
        ("beta", "connections", 1, 1, False),
    ]
    parsed = list(csv.DictReader(io.StringIO(billing_total_csv(totals).decode())))
    assert tuple(parsed[0]) == COLUMNS
    assert parsed[1] == {
        "tenant": "acme",
        "usage_type": "data-in",
        "quantity": "55",
        "unit": "bytes",
        "range_start": "2026-11-20T00:00:00Z",
        "range_end": "2026-11-22T00:00:00Z",
        "periods": "2",
        "provisional": "true",
    }
