"""A held event loop is logged with where it was held (backend_store/loop_watch.py).

Nodes and managers run a :class:`LoopWatch`: issue 48's leaders stepped down because a node's
loop was held past its lease's deadline, and the log said only that the lease was lost. Here
the loop is really held (a synchronous sleep in a callback, what a long pass over thousands
of records does) past the threshold: one warning names how long, and the function that held
it, from a sample taken while it did.
"""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from backend_store.loop_watch import LoopWatch
from tests.conftest import scaled


def a_pass_over_every_queue(seconds: float) -> None:
    time.sleep(seconds)  # the GIL is let go, as a busy loop lets it go every switch interval


async def test_a_held_loop_is_logged_with_the_function_that_held_it(caplog: pytest.LogCaptureFixture) -> None:
    watch = LoopWatch(threshold_s=0.3)
    caplog.set_level(logging.WARNING, logger="pushgate.loop")
    watch.start()
    try:
        await asyncio.sleep(0.2)  # a beat or more first
        a_pass_over_every_queue(1.5)  # long enough for a sample on a loaded machine
        deadline = time.monotonic() + scaled(10)
        while not any("event loop held for" in r.getMessage() for r in caplog.records):
            assert time.monotonic() < deadline, "no warning of the held loop"
            await asyncio.sleep(0.05)
    finally:
        watch.stop()
    warning = next(r.getMessage() for r in caplog.records if "event loop held for" in r.getMessage())
    assert float(warning.split("held for ")[1].split()[0]) >= 0.3
    assert "a_pass_over_every_queue" in warning
