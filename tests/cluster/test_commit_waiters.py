"""CommitWaiters: sync writes waiting for a majority, woken in LSN order, timed out by one
timer, failed all at once when the term ends."""

from __future__ import annotations

import asyncio

import pytest

from backend_store.cluster.replication.commit_waiters import CommitWaiters
from backend_store.errors import PushgateError, StaleEpoch, Unavailable
from backend_store.types import Lsn
from tests.conftest import scaled


def timed_out(lsn: Lsn, timeout_s: float) -> PushgateError:
    return Unavailable(f"{lsn} after {timeout_s}")


async def test_writes_are_woken_once_a_majority_holds_their_lsn() -> None:
    waiters = CommitWaiters(timed_out)
    tasks = {lsn: asyncio.create_task(waiters.wait(Lsn(lsn), 5)) for lsn in (3, 3, 4, 7)}
    await asyncio.sleep(0)
    waiters.settle(Lsn(4))
    await asyncio.sleep(0)
    assert [lsn for lsn, t in tasks.items() if t.done()] == [3, 4]
    assert not tasks[7].done() and len(waiters) == 1
    waiters.settle(Lsn(9))
    await asyncio.gather(*tasks.values())
    assert len(waiters) == 0


async def test_a_write_not_on_a_majority_in_time_gets_the_timeout_error_alone() -> None:
    waiters = CommitWaiters(timed_out)
    slow = asyncio.create_task(waiters.wait(Lsn(1), 600))
    await asyncio.sleep(0)
    # A later write with a shorter timeout is not held up by the earlier one's timer.
    with pytest.raises(Unavailable, match=r"2 after 1\b"):
        await asyncio.wait_for(waiters.wait(Lsn(2), 1), scaled(30))
    assert not slow.done()
    waiters.settle(Lsn(1))
    await slow


async def test_timeouts_fire_for_writes_that_arrive_after_others_settled() -> None:
    waiters = CommitWaiters(timed_out)
    # Seconds, not milliseconds: the first must be settled before its own timer fires.
    first = asyncio.create_task(waiters.wait(Lsn(1), 1))
    await asyncio.sleep(0)
    waiters.settle(Lsn(1))
    await first
    with pytest.raises(Unavailable, match=r"2 after 1\b"):
        await asyncio.wait_for(waiters.wait(Lsn(2), 1), scaled(30))


async def test_a_cancelled_write_leaves_the_others_waiting() -> None:
    waiters = CommitWaiters(timed_out)
    gone = asyncio.create_task(waiters.wait(Lsn(1), 5))
    kept = asyncio.create_task(waiters.wait(Lsn(2), 5))
    await asyncio.sleep(0)
    gone.cancel()
    await asyncio.sleep(0)
    waiters.settle(Lsn(2))
    await kept
    assert gone.cancelled()


async def test_the_end_of_a_term_fails_every_waiting_write() -> None:
    waiters = CommitWaiters(timed_out)
    tasks = [asyncio.create_task(waiters.wait(Lsn(n), 5)) for n in (1, 2)]
    await asyncio.sleep(0)
    waiters.fail(lambda lsn: StaleEpoch(f"deposed at {lsn}"))
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert [str(r) for r in results] == ["deposed at 1", "deposed at 2"]
    assert len(waiters) == 0
