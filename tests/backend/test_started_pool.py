"""A server's thread pool starts every thread at once (backend_store/started_pool.py)."""

from __future__ import annotations

import threading

from backend_store.started_pool import started_pool


def _named(prefix: str) -> int:
    return sum(1 for t in threading.enumerate() if t.name.startswith(prefix))


def test_every_thread_runs_before_the_first_task() -> None:
    pool = started_pool(5, "started-test")
    try:
        assert _named("started-test") == 5
        # Work that overlaps adds none: the count is the pool's from the start.
        gate = threading.Event()
        busy = [pool.submit(gate.wait, 5) for _ in range(5)]
        assert _named("started-test") == 5
        gate.set()
        assert all(f.result() for f in busy)
        assert _named("started-test") == 5
    finally:
        pool.shutdown()
    assert _named("started-test") == 0
