"""An hour of figures at a coarse step: depth per queue (the queue page's chart and DLQ
growth) and bytes stored per node (the nodes page's storage growth)."""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Iterable, Iterator
from typing import Generic, TypeVar

from .snapshot import QueueSample

K = TypeVar("K", bound=Hashable)

# Queues added between pauses by the ``adding`` forms: 10,000 queues at once held a gateway's
# event loop 9-46 ms for each history (session 85).
PER_TURN = 1000


class _Rings(Generic[K]):
    """Per-key rings of ``(time, value)``; at most one point per ``step_s`` per key.

    Memory is bounded: ``span_s / step_s`` points per key (121 at the defaults), and a key
    missing from a sample is dropped.
    """

    def __init__(self, span_s: float = 3600.0, step_s: float = 30.0) -> None:
        self.span_s = span_s
        self.step_s = step_s
        self._points = max(2, int(span_s / step_s) + 1)
        self._rings: dict[K, deque[tuple[float, int]]] = {}

    def _add(self, at: float, values: Iterable[tuple[K, int]]) -> None:
        for _ in self._adding(at, values):
            pass

    def _adding(self, at: float, values: Iterable[tuple[K, int]]) -> Iterator[None]:
        """``_add`` a turn at a time: a pause (a ``yield``) after every ``PER_TURN`` values,
        for a caller on an event loop to let others run (the sampler's history of thousands
        of queues). Keys missing from ``values`` are dropped once they are all added."""
        seen: set[K] = set()
        for n, (key, value) in enumerate(values, 1):
            if n % PER_TURN == 0:
                yield
            seen.add(key)
            ring = self._rings.get(key)
            if ring is None:
                ring = self._rings[key] = deque(maxlen=self._points)
            if ring and at - ring[-1][0] < self.step_s:
                # Keep the newest value within a step, so the chart's last point is current.
                ring[-1] = (ring[-1][0], value)
            else:
                ring.append((at, value))
        for key in [k for k in self._rings if k not in seen]:
            del self._rings[key]

    def _points_of(self, key: K) -> list[tuple[float, int]]:
        return list(self._rings.get(key, ()))


class DepthHistory(_Rings[tuple[str, str]]):
    """Every queue's depth (visible, in flight and delayed) over the last hour."""

    def add(self, at: float, queues: Iterable[QueueSample]) -> None:
        self._add(at, ((q.key, q.depth) for q in queues))

    def adding(self, at: float, queues: Iterable[QueueSample]) -> Iterator[None]:
        """:meth:`add` a turn at a time (``_Rings._adding``)."""
        return self._adding(at, ((q.key, q.depth) for q in queues))

    def points(self, tenant: str, name: str) -> list[tuple[float, int]]:
        return self._points_of((tenant, name))

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


class StorageHistory(_Rings[str]):
    """Bytes stored per node (``store`` for the embedded store) over the last hour."""

    # Growth is not told from noise over less than this.
    MIN_SPAN_S = 60.0

    def add(self, at: float, used: Iterable[tuple[str, int]]) -> None:
        self._add(at, used)

    def points(self, key: str) -> list[tuple[float, int]]:
        return self._points_of(key)

    def growth_per_hour(self, key: str) -> float | None:
        """Bytes per hour over the kept points (None: under a minute of history)."""
        ring = self._rings.get(key)
        if not ring or ring[-1][0] - ring[0][0] < self.MIN_SPAN_S:
            return None
        (t0, v0), (t1, v1) = ring[0], ring[-1]
        return (v1 - v0) / (t1 - t0) * 3600.0
