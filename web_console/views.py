"""Turning samples and alerts into what templates and the live stream show."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from starlette.responses import RedirectResponse, Response

from .alerts import Alert
from .monitor import QueueSample


def age_text(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def queue_row(q: QueueSample) -> dict[str, Any]:
    """One overview row; the same keys the live stream sends, so the page script is a lookup."""
    return {
        "name": q.name,
        "visible": q.visible,
        "in_flight": q.in_flight,
        "delayed": q.delayed,
        "oldest": age_text(q.oldest_age_s),
        "send_rate": f"{q.send_rate:.1f}",
        "ack_rate": f"{q.ack_rate:.1f}",
        "delivered_rate": f"{q.delivered_rate:.1f}",
        "dead_letter_rate": f"{q.dead_letter_rate:.1f}",
        "consumers": q.consumers,
    }


def size_text(count: float | None) -> str:
    """Bytes for people: 512 B, 3.4 KiB, 12.0 MiB, 1.5 GiB."""
    if count is None:
        return "-"
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"  # not reached


def growth_text(per_hour: float | None) -> str:
    """A storage growth rate: "+1.2 MiB/h", "-300 B/h", "-" while unknown."""
    if per_hour is None:
        return "-"
    sign = "+" if per_hour >= 0 else "-"
    return f"{sign}{size_text(abs(per_hour))}/h"


def alert_row(a: Alert) -> dict[str, Any]:
    return {
        "rule_id": a.rule_id,
        "kind": a.kind,
        "subject": a.subject,
        "value": f"{a.value:g}",
        "threshold": f"{a.threshold:g}",
        "since": a.since,
        "description": a.description,
    }


PER_PAGE = 200
MAX_PER_PAGE = 1000


@dataclass(frozen=True, slots=True)
class Listing:
    """One page of a tenant's queues, filtered by a name substring (the overview and its stream)."""

    queues: list[QueueSample]
    query: str
    page: int
    pages: int
    per_page: int
    total: int

    @classmethod
    def of(cls, queues: Sequence[QueueSample], params: Mapping[str, str]) -> Listing:
        query = params.get("q", "").strip()[:80]
        matching = [q for q in queues if query.lower() in q.name.lower()] if query else list(queues)
        page, pages, per_page, start = page_bounds(len(matching), params, PER_PAGE)
        return cls(matching[start : start + per_page], query, page, pages, per_page, len(matching))

    def params(self, page: int) -> str:
        """The query string of another page of the same listing."""
        parts = [f"page={page}"]
        if self.query:
            parts.append(f"q={quote(self.query)}")
        if self.per_page != PER_PAGE:
            parts.append(f"per_page={self.per_page}")
        return "&".join(parts)


def page_bounds(count: int, params: Mapping[str, str], default_per_page: int) -> tuple[int, int, int, int]:
    """``(page, pages, per_page, start)`` of a listing of ``count`` rows (``?page=``, ``?per_page=``)."""
    per_page = _int(params.get("per_page"), default_per_page, 1, MAX_PER_PAGE)
    pages = max(1, -(-count // per_page))
    page = _int(params.get("page"), 1, 1, pages)
    return page, pages, per_page, (page - 1) * per_page


def back_to(path: str, message: str, key: str = "notice") -> Response:
    """After an action: back to its page, which shows ``message`` (``?notice=`` or ``?error=``)."""
    return RedirectResponse(f"{path}?{key}={quote(message)}", status_code=303)


def _int(raw: str | None, default: int, low: int, high: int) -> int:
    try:
        value = int(raw) if raw is not None else default
    except ValueError:
        value = default
    return max(low, min(high, value))
