"""A thread pool whose threads all start with it: a server's thread count fixed at start.

asyncio's default executor (every ``asyncio.to_thread``: a node's store reads, file reads)
starts a thread only when a task finds none idle, up to ``min(32, CPUs + 4)``. So a node's
thread count grew with how many reads ever overlapped, which looked like growth with its
queues (issue 49: 25 threads at 10 queues, 27 at 10,000, where the target is within 10%).
Started at once, the pool is the same size from the first second: what an operator sizes
and alerts on does not drift with load.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

# How long starting waits for every thread to be up (a machine this slow has other trouble).
_START_TIMEOUT_S = 30.0


def default_workers() -> int:
    """What Python's ``ThreadPoolExecutor`` would grow to by itself."""
    return min(32, (os.cpu_count() or 1) + 4)


def started_pool(workers: int, name: str) -> ThreadPoolExecutor:
    """A pool of ``workers`` threads, every one of them running when this returns.

    Each of ``workers`` tasks waits at a barrier until all are running: while one waits, its
    thread is busy, so the pool starts a new thread for the next (documented since Python
    3.8: idle threads are reused before new ones start, up to ``max_workers``). A pool that
    did otherwise fails here, loudly (``BrokenBarrierError``), rather than run smaller."""
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)
    everyone = threading.Barrier(workers, timeout=_START_TIMEOUT_S)
    for started in [pool.submit(everyone.wait) for _ in range(workers)]:
        started.result()
    return pool
