"""A process's watch checks fall due together and go to etcd as one request (session 78).

A node, manager or gateway watches six to eight prefixes, each checked every 2 s; on a
3-node dev cluster those checks were about 19 etcd round trips a second and, at 10,000
inboxes, a third of the cluster's idle CPU. The moments are held without I/O, the batching
with a read that counts its calls, and against a real etcd: the answers are each prefix's,
and several watches of one process check it in one request a moment.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence

import pytest

from backend_store.cluster.coordination.coordinator import CoordinatorUnavailable
from backend_store.cluster.coordination.etcd_coordinator import EtcdCoordinator
from backend_store.cluster.coordination.fingerprint_batch import MOST_PER_READ, FingerprintBatch
from backend_store.cluster.coordination.prefix_fingerprint import Fingerprint, check_due
from backend_store.cluster.coordination.watched_prefix import WatchedPrefix
from tests.conftest import scaled
from tests.fixtures.etcd_server import unique_prefix


def test_checks_of_one_interval_fall_due_at_the_same_moments() -> None:
    # Watches that last checked at different times check next at one moment...
    assert check_due(99.0, 2.0) == check_due(100.3, 2.0) == check_due(100.9, 2.0) == 102.0
    # ... at least half an interval away (a check just made is not made again at once) ...
    assert check_due(101.0, 2.0) == check_due(101.2, 2.0) == 104.0
    # ... and a check made late by a busy loop keeps its place, one interval on.
    assert check_due(102.05, 2.0) == 104.0
    # A large prefix's longer interval has moments of its own, which meet the others'.
    assert check_due(100.3, 20.0) == 120.0 and 120.0 % 2.0 == 0


class Reads:
    """A fingerprint read that records each call's prefixes."""

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[list[str]] = []
        self.fail = fail

    async def __call__(self, prefixes: Sequence[str]) -> list[Fingerprint]:
        self.calls.append(list(prefixes))
        await asyncio.sleep(0)
        if self.fail:
            raise CoordinatorUnavailable("etcd: no answer")
        return [Fingerprint(7, len(p), 0) for p in prefixes]


async def test_checks_asked_together_are_one_read_each_answered_its_own() -> None:
    reads = Reads()
    batch = FingerprintBatch(reads)
    answers = await asyncio.gather(
        batch.fingerprint("/a/"), batch.fingerprint("/bb/"), batch.fingerprint("/a/")
    )
    assert reads.calls == [["/a/", "/bb/"]]  # one read, each prefix once
    assert list(answers) == [Fingerprint(7, 3, 0), Fingerprint(7, 4, 0), Fingerprint(7, 3, 0)]
    # A check asked later is a read of its own.
    assert await batch.fingerprint("/c/") == Fingerprint(7, 3, 0)
    assert reads.calls[1:] == [["/c/"]]


async def test_many_prefixes_go_in_reads_within_etcds_transaction_limit() -> None:
    reads = Reads()
    batch = FingerprintBatch(reads)
    prefixes = [f"/p{i:03d}/" for i in range(MOST_PER_READ + 6)]
    answers = await asyncio.gather(*(batch.fingerprint(p) for p in prefixes))
    assert [len(call) for call in reads.calls] == [MOST_PER_READ, 6]
    assert [a.count for a in answers] == [len(p) for p in prefixes]


async def test_a_failed_read_fails_each_waiter_and_a_cancelled_one_leaves_the_others() -> None:
    reads = Reads(fail=True)
    batch = FingerprintBatch(reads)
    outcomes = await asyncio.gather(
        batch.fingerprint("/a/"), batch.fingerprint("/b/"), return_exceptions=True
    )
    assert [type(o) for o in outcomes] == [CoordinatorUnavailable, CoordinatorUnavailable]
    assert outcomes[0] is not outcomes[1]  # each waiter raises its own exception

    reads.fail = False
    gone = asyncio.create_task(batch.fingerprint("/gone/"))
    kept = asyncio.create_task(batch.fingerprint("/kept/"))
    await asyncio.sleep(0)
    gone.cancel()
    assert await kept == Fingerprint(7, 6, 0)
    assert reads.calls[-1] == ["/kept/"]  # nobody waits for the cancelled one's answer


class CountingChecks(EtcdCoordinator):
    """Counts the fingerprint reads sent to etcd, and the prefixes in each."""

    def __init__(self, endpoints: list[str]) -> None:
        super().__init__(endpoints)
        self.reads: list[int] = []
        self.wanted = 0  # checks after which ``enough`` is set (0: never)
        self.enough = asyncio.Event()

    async def _fingerprints(self, prefixes: Sequence[str]) -> list[Fingerprint]:
        self.reads.append(len(prefixes))
        if self.wanted and sum(self.reads) >= self.wanted:
            self.enough.set()
        return await super()._fingerprints(prefixes)


@pytest.fixture
async def counted(etcd_endpoints: list[str]) -> AsyncIterator[CountingChecks]:
    coordinator = CountingChecks(etcd_endpoints)
    async with coordinator:
        yield coordinator


async def test_one_transaction_answers_each_prefix_as_a_range_would(counted: CountingChecks) -> None:
    base = unique_prefix()
    await counted.put(f"{base}a/1", b"x")
    newest_a = await counted.put(f"{base}a/2", b"x")
    newest_b = await counted.put(f"{base}b/1", b"x")
    beside = await counted.put(f"{base}c", b"x")  # beside both prefixes: etcd's revision moves
    seen = await counted._fingerprints([f"{base}a/", f"{base}b/", f"{base}none/"])
    assert seen == [
        Fingerprint(beside, 2, newest_a),
        Fingerprint(beside, 1, newest_b),
        Fingerprint(beside, 0, 0),
    ]
    assert await counted.fingerprint(f"{base}a/") == Fingerprint(beside, 2, newest_a)


async def test_a_processs_watches_check_etcd_in_one_request_a_moment(counted: CountingChecks) -> None:
    base = unique_prefix()
    watches = [WatchedPrefix(counted, f"{base}{name}/", reread_every_s=0.25) for name in "abcd"]
    for watch in watches:  # started at different moments, as a process's watches are
        await watch.start(timeout_s=scaled(10))
        await asyncio.sleep(0.07)
    try:
        counted.wanted = 4 * 8  # about ten moments
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(scaled(20)):
                await counted.enough.wait()
    finally:
        for watch in watches:
            await watch.close()
    checks = sum(counted.reads)
    assert checks >= 4 * 5  # every watch kept checking (about ten moments each)...
    assert len(counted.reads) <= checks / 3  # ... four prefixes a request: one a watch before
