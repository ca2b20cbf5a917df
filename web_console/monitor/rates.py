"""An hour of message rates per queue: sent, delivered, acked and dead-lettered per second.

Rates are kept as the counters they come from, not as the rates one sample saw: a point
is kept at most every ``step_s`` (the counters at that moment), and the rate over an
interval is the counters' difference over its length. Two samples 0.5 s apart (a send
brings one forward) therefore never make a spike, and the chart's points are true
averages over their step. ``sent``, ``acked`` and ``dead-lettered`` are the store's
durable totals (every gateway's traffic); ``delivered`` is this gateway's count of
deliveries (the store keeps no count of receives).

Memory: one flat ``array('d')`` of ``span_s / step_s + 1`` points of five numbers per
queue (4.8 KiB at the defaults), plus the latest sample's row.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import pairwise

from .history import PER_TURN
from .snapshot import QueueSample

COUNTERS = ("sent", "delivered", "acked", "dead_lettered")
_WIDTH = 1 + len(COUNTERS)  # time, then the counters
Row = tuple[float, float, float, float, float]


@dataclass(frozen=True, slots=True)
class RatePoint:
    """Per-second rates over the interval ending at ``at``."""

    at: float
    sent: float
    delivered: float
    acked: float
    dead_lettered: float

    def of(self, counter: str) -> float:
        value: float = getattr(self, counter)
        return value


def _row(at: float, q: QueueSample) -> Row:
    return (at, q.sent_total, q.delivered_total, q.acked_total, q.dead_lettered_total)


class RateHistory:
    def __init__(self, span_s: float = 3600.0, step_s: float = 30.0) -> None:
        self.span_s = span_s
        self.step_s = step_s
        self._points = max(2, int(span_s / step_s) + 1)
        self._kept: dict[tuple[str, str], array[float]] = {}
        self._latest: dict[tuple[str, str], Row] = {}

    def add(self, at: float, queues: Iterable[QueueSample]) -> None:
        for _ in self.adding(at, queues):
            pass

    def adding(self, at: float, queues: Iterable[QueueSample]) -> Iterator[None]:
        """:meth:`add` a turn at a time: a pause (a ``yield``) after every ``PER_TURN``
        queues; queues missing from ``queues`` are dropped once they are all added."""
        seen: set[tuple[str, str]] = set()
        for n, q in enumerate(queues, 1):
            if n % PER_TURN == 0:
                yield
            key = q.key
            seen.add(key)
            row = _row(at, q)
            kept = self._kept.get(key)
            if kept is None:
                self._kept[key] = array("d", row)
            elif at - kept[-_WIDTH] >= self.step_s:
                kept.extend(row)
                if len(kept) > self._points * _WIDTH:
                    del kept[:_WIDTH]
            self._latest[key] = row
        for key in [k for k in self._kept if k not in seen]:
            del self._kept[key]
            self._latest.pop(key, None)

    def _rows(self, key: tuple[str, str]) -> list[Row]:
        kept = self._kept.get(key)
        if kept is None:
            return []
        rows: list[Row] = [
            (kept[i], kept[i + 1], kept[i + 2], kept[i + 3], kept[i + 4]) for i in range(0, len(kept), _WIDTH)
        ]
        latest = self._latest.get(key)
        if latest is not None and latest[0] > rows[-1][0]:
            rows.append(latest)
        return rows

    def rates(self, tenant: str, name: str) -> list[RatePoint]:
        """Each kept interval's rates, oldest first, the last one ending at the latest sample."""
        rows = self._rows((tenant, name))
        out = []
        for before, after in pairwise(rows):
            elapsed = after[0] - before[0]
            if elapsed <= 0:
                continue
            # A counter that went back (a queue deleted and made again between samples) is 0.
            sent, delivered, acked, dead = (
                max(0.0, after[i] - before[i]) / elapsed for i in range(1, _WIDTH)
            )
            out.append(RatePoint(after[0], sent, delivered, acked, dead))
        return out

    def increase(self, tenant: str, name: str, counter: str, window_s: float, now: float) -> int:
        """How much a counter rose over the last ``window_s`` (within a step; 0 if unknown).

        Measured from the newest kept point at least ``window_s`` old (or the oldest kept:
        a queue seen only lately counts from when it was first seen, never from zero)."""
        # Read in place, not through _rows: the default dead-letter rule asks this of every
        # queue that changed, each sample (at 10,000 queues a tuple a kept point was most of
        # an evaluation's time).
        key = (tenant, name)
        kept = self._kept.get(key)
        if kept is None:
            return 0
        column = 1 + COUNTERS.index(counter)
        latest = self._latest.get(key)
        if latest is not None and latest[0] > kept[-_WIDTH]:
            last_at, last = latest[0], latest[column]
        else:
            last_at, last = kept[-_WIDTH], kept[-_WIDTH + column]
        since = now - window_s
        base = kept[column]
        for at in range(0, len(kept), _WIDTH):
            if kept[at] > since:
                break
            base = kept[at + column]
        else:
            if last_at <= since:
                base = last
        return max(0, int(last - base))
