"""An hour of depth per queue, at a coarse step, for the queue page's chart and DLQ growth."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from .snapshot import QueueSample


class DepthHistory:
    """Per-queue rings of ``(time, depth)``; at most one point per ``step_s`` per queue.

    Memory is bounded: ``span_s / step_s`` points per queue (120 at the defaults), and a
    queue that disappears from the samples is dropped.
    """

    def __init__(self, span_s: float = 3600.0, step_s: float = 30.0) -> None:
        self.span_s = span_s
        self.step_s = step_s
        self._points = max(2, int(span_s / step_s) + 1)
        self._rings: dict[tuple[str, str], deque[tuple[float, int]]] = {}

    def add(self, at: float, queues: Iterable[QueueSample]) -> None:
        seen: set[tuple[str, str]] = set()
        for q in queues:
            seen.add(q.key)
            ring = self._rings.get(q.key)
            if ring is None:
                ring = self._rings[q.key] = deque(maxlen=self._points)
            if ring and at - ring[-1][0] < self.step_s:
                # Keep the newest value within a step, so the chart's last point is current.
                ring[-1] = (ring[-1][0], q.depth)
            else:
                ring.append((at, q.depth))
        for key in [k for k in self._rings if k not in seen]:
            del self._rings[key]

    def points(self, tenant: str, name: str) -> list[tuple[float, int]]:
        return list(self._rings.get((tenant, name), ()))

    def growth(self, tenant: str, name: str, window_s: float, now: float) -> int:
        """How much the depth rose over the last ``window_s`` (0 when it fell or is unknown)."""
        ring = self._rings.get((tenant, name))
        if not ring:
            return 0
        base = ring[0][1]
        for t, depth in ring:
            if t >= now - window_s:
                break
            base = depth
        return max(0, ring[-1][1] - base)
