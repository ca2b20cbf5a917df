"""In-memory usage aggregation: one cell per (tenant, queue, operation, transport, outcome).

:meth:`UsageAggregator.observe` is on the hot path (every request, every pushed batch),
so it is a dict lookup and a few integer adds, with no lock: the gateway calls it from
the event loop only. :meth:`UsageAggregator.end_window` swaps the cells out for a fresh
dict (on the loop), and the :class:`Window` it returns turns them into
:class:`~gateway.usage.record.UsageRecord` s for the writer, off the loop if need be: it
shares nothing with the aggregator any more.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .record import BUCKETS, LATENCY_BOUNDS_S, OK, UsageRecord, latency_bucket

Key = tuple[str, str, str, str, str]


class Cell:
    """Running totals of one key: count, bytes and the latency histogram."""

    __slots__ = ("buckets", "bytes", "count", "latency_count", "latency_sum_s")

    def __init__(self) -> None:
        self.count = 0
        self.bytes = 0
        self.latency_count = 0
        self.latency_sum_s = 0.0
        self.buckets = [0] * BUCKETS


class UsageAggregator:
    """Aggregates usage between flushes; a sink of the observe point (:class:`~push.observer.Observer`).

    ``clock`` returns the wall time in seconds (tests pass their own).
    """

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._cells: dict[Key, Cell] = {}
        self._window_start = clock()

    def observe(
        self,
        tenant: str,
        queue: str,
        operation: str,
        transport: str,
        outcome: str = OK,
        count: int = 1,
        nbytes: int = 0,
        latency_s: float | None = None,
    ) -> None:
        """Count ``count`` units of ``operation`` and, if given, one latency observation."""
        key = (tenant, queue, operation, transport, outcome)
        cell = self._cells.get(key)
        if cell is None:
            cell = self._cells[key] = Cell()
        cell.count += count
        cell.bytes += nbytes
        if latency_s is not None:
            cell.latency_count += 1
            cell.latency_sum_s += latency_s
            cell.buckets[latency_bucket(latency_s)] += 1

    def observe_latencies(
        self,
        tenant: str,
        queue: str,
        operation: str,
        transport: str,
        nbytes: int,
        latencies_s: Sequence[float],
    ) -> None:
        """Count one unit per latency (a batch of pushed messages, each with its own age)."""
        key = (tenant, queue, operation, transport, OK)
        cell = self._cells.get(key)
        if cell is None:
            cell = self._cells[key] = Cell()
        buckets = cell.buckets
        for latency in latencies_s:
            buckets[bisect_left(LATENCY_BOUNDS_S, latency)] += 1  # latency_bucket, inlined
        n = len(latencies_s)
        cell.count += n
        cell.bytes += nbytes
        cell.latency_count += n
        cell.latency_sum_s += sum(latencies_s)

    @property
    def pending(self) -> int:
        """Keys seen since the last :meth:`take`."""
        return len(self._cells)

    @property
    def window_start(self) -> float:
        return self._window_start

    def end_window(self, now: float | None = None) -> Window:
        """End the current window at ``now`` and start a new one; the ended window's cells."""
        end = self.clock() if now is None else now
        window = Window(self._cells, self._window_start, end)
        self._cells, self._window_start = {}, end
        return window

    def take(self, gateway_id: str, sequence: int, now: float | None = None) -> list[UsageRecord]:
        """End the current window at ``now``: return its records and start a new window."""
        return self.end_window(now).records(gateway_id, sequence)


@dataclass(frozen=True)
class Window:
    """The cells of one ended window, from ``start`` to ``end`` (wall seconds)."""

    cells: dict[Key, Cell]
    start: float
    end: float

    def records(self, gateway_id: str, sequence: int) -> list[UsageRecord]:
        """One record a cell, sorted by key. Record ids are ``<gateway_id>-<sequence>-<row>``;
        the caller gives each flush a new ``sequence``, so ids never repeat."""
        start_us, end_us = int(self.start * 1_000_000), int(self.end * 1_000_000)
        records = []
        for row, (key, cell) in enumerate(sorted(self.cells.items())):
            tenant, queue, operation, transport, outcome = key
            records.append(
                UsageRecord(
                    record_id=f"{gateway_id}-{sequence}-{row}",
                    gateway_id=gateway_id,
                    window_start_us=start_us,
                    window_end_us=end_us,
                    tenant=tenant,
                    queue=queue,
                    operation=operation,
                    transport=transport,
                    outcome=outcome,
                    count=cell.count,
                    bytes=cell.bytes,
                    latency_count=cell.latency_count,
                    latency_sum_ms=cell.latency_sum_s * 1000,
                    latency_buckets=tuple(cell.buckets),
                )
            )
        return records
