"""Group-commit figures for metrics: batch sizes and commit (fsync) durations, as histograms.

The writer thread records; a metrics scrape reads. Plain integer cells, no lock: a scrape
may see one commit half-recorded (a bucket ahead of the count), which Prometheus
tolerates and nobody can act on.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

BATCH_BUCKETS: tuple[float, ...] = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1024)
COMMIT_SECONDS_BUCKETS: tuple[float, ...] = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    1.0,
)


@dataclass(slots=True)
class FixedHistogram:
    """Cumulative-at-read histogram over fixed upper bounds (+Inf is the last cell)."""

    bounds: tuple[float, ...]
    cells: list[int] = field(default_factory=list)
    count: int = 0
    total: float = 0.0

    def __post_init__(self) -> None:
        self.cells = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        self.cells[bisect.bisect_left(self.bounds, value)] += 1
        self.count += 1
        self.total += value

    def cumulative(self) -> list[tuple[str, int]]:
        """``(le, count)`` pairs as Prometheus wants them, ending with ``+Inf``."""
        out: list[tuple[str, int]] = []
        running = 0
        for bound, cell in zip((*self.bounds, float("inf")), self.cells, strict=True):
            running += cell
            out.append(("+Inf" if bound == float("inf") else repr(float(bound)), running))
        return out


@dataclass(slots=True)
class CommitStats:
    """Per committed batch that wrote something: how many operations, how long the commit took."""

    batch_size: FixedHistogram = field(default_factory=lambda: FixedHistogram(BATCH_BUCKETS))
    commit_seconds: FixedHistogram = field(default_factory=lambda: FixedHistogram(COMMIT_SECONDS_BUCKETS))

    def record(self, operations: int, seconds: float) -> None:
        self.batch_size.observe(operations)
        self.commit_seconds.observe(seconds)
