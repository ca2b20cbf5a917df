"""Turning samples and alerts into what templates and the live stream show."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

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
        "consumers": q.consumers,
    }


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
        per_page = _int(params.get("per_page"), PER_PAGE, 1, MAX_PER_PAGE)
        pages = max(1, -(-len(matching) // per_page))
        page = _int(params.get("page"), 1, 1, pages)
        start = (page - 1) * per_page
        return cls(matching[start : start + per_page], query, page, pages, per_page, len(matching))

    def params(self, page: int) -> str:
        """The query string of another page of the same listing."""
        parts = [f"page={page}"]
        if self.query:
            parts.append(f"q={quote(self.query)}")
        if self.per_page != PER_PAGE:
            parts.append(f"per_page={self.per_page}")
        return "&".join(parts)


def _int(raw: str | None, default: int, low: int, high: int) -> int:
    try:
        value = int(raw) if raw is not None else default
    except ValueError:
        value = default
    return max(low, min(high, value))
