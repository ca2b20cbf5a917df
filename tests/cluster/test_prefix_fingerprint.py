"""A watch's periodic check reads a prefix's fingerprint, not every record (issue 49).

At 10,000 queues each node, manager and gateway read ``queues/`` whole every few seconds to
check its watch, and etcd spent more CPU per send serving those reads than any node's
Python did on anything but the send itself (bench/README.md, "Session 58"). The verdicts
are held here without I/O, and against a real etcd: an unchanged prefix is not read again,
while a watcher still follows etcd's revision and sees every change.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from backend_store.cluster.coordination.coordinator import Entry, PrefixState
from backend_store.cluster.coordination.etcd_coordinator import EtcdCoordinator
from backend_store.cluster.coordination.prefix_fingerprint import (
    WHOLE_READ_EVERY_S,
    Fingerprint,
    Verdict,
    check_interval,
    judge,
    whole_read_interval,
)
from backend_store.cluster.coordination.watched_prefix import WatchedPrefix
from tests.cluster.test_watch_events import read_at
from tests.conftest import scaled
from tests.fixtures.etcd_server import unique_prefix


def state_at(revision: int, writes: dict[str, int]) -> PrefixState:
    """A state at ``revision`` whose keys were last written at the given mod revisions."""
    entries = {f"/p/{k}": Entry(f"/p/{k}", b"v", mod, mod) for k, mod in writes.items()}
    return PrefixState("/p/", revision, entries)


HELD = state_at(50, {"a": 10, "b": 40})


def test_a_large_prefix_is_checked_less_often_never_past_the_whole_read() -> None:
    # etcd reads every key of the prefix to answer a fingerprint: a watcher's checks cost it
    # about the same at 10,000 queue records as at 1,000, not ten times as much.
    assert check_interval(2.0, 0) == check_interval(2.0, 1_000) == 2.0
    assert check_interval(2.0, 10_000) == 20.0
    assert check_interval(2.0, 1_000_000) == WHOLE_READ_EVERY_S
    assert check_interval(5.0, 2_000) == 5.0  # a gateway's own, longer interval holds


def test_a_large_prefix_is_read_whole_less_often_and_checked_as_before() -> None:
    # The whole read is a safety net costing etcd and the reader per record: at 10,000
    # queue records, one every 150 s costs a watcher what one every 30 s did at 2,000.
    assert whole_read_interval(2.0, 0) == whole_read_interval(2.0, 2_000) == WHOLE_READ_EVERY_S
    assert whole_read_interval(2.0, 10_000) == 150.0
    assert whole_read_interval(60.0, 10) == 60.0  # a longer reread interval holds
    # What only a check sees (etcd gone back with the stream alive) is seen as soon as before.
    assert check_interval(2.0, 1_000_000) == WHOLE_READ_EVERY_S < whole_read_interval(2.0, 1_000_000)


def test_the_same_keys_and_newest_write_are_the_state_at_etcds_revision() -> None:
    # etcd moved on with other keys' writes: nothing to read.
    assert judge(HELD, Fingerprint(90, 2, 40), None) == (Verdict.SAME, None)
    assert judge(HELD, Fingerprint(50, 2, 40), 45) == (Verdict.SAME, None)


def test_etcd_behind_the_state_went_back_and_is_read_whole() -> None:
    assert judge(HELD, Fingerprint(30, 2, 40), None) == (Verdict.READ, None)


def test_a_write_on_its_way_is_waited_for_once() -> None:
    # A key written at 60, not in the state yet: its event may be on its way.
    verdict, doubt = judge(HELD, Fingerprint(70, 3, 60), None)
    assert (verdict, doubt) == (Verdict.WAIT, 60)
    # It came (the state is now at 60): no doubt left.
    assert judge(state_at(60, {"a": 10, "b": 40, "c": 60}), Fingerprint(70, 3, 60), doubt)[0] is Verdict.SAME
    # It never came: read whole at the next check.
    assert judge(HELD, Fingerprint(70, 3, 60), doubt) == (Verdict.READ, None)


def test_writes_that_keep_coming_are_no_doubt_while_the_events_keep_up() -> None:
    _, doubt = judge(HELD, Fingerprint(70, 3, 60), None)
    caught_up = state_at(65, {"a": 10, "b": 40, "c": 60, "d": 65})
    # The events brought 60 and 65 meanwhile; etcd has 80 already: wait again, no read.
    assert judge(caught_up, Fingerprint(90, 5, 80), doubt) == (Verdict.WAIT, 80)


def test_a_deletion_on_its_way_is_waited_for_and_one_at_the_states_revision_is_read() -> None:
    # "b" deleted after 50 (etcd at 70): the count is short, the newest write older.
    verdict, doubt = judge(HELD, Fingerprint(70, 1, 10), None)
    assert (verdict, doubt) == (Verdict.WAIT, 70)
    assert judge(state_at(55, {"a": 10}), Fingerprint(70, 1, 10), doubt)[0] is Verdict.SAME
    assert judge(HELD, Fingerprint(75, 1, 10), doubt) == (Verdict.READ, None)
    # At the state's own revision nothing can be on its way: a difference is a miss.
    assert judge(HELD, Fingerprint(50, 1, 10), None) == (Verdict.READ, None)


class CountingReads(EtcdCoordinator):
    """Counts the whole-prefix reads (each O(records) for etcd and the reader)."""

    def __init__(self, endpoints: list[str]) -> None:
        super().__init__(endpoints)
        self.whole_reads = 0

    async def read_prefix(self, prefix: str) -> PrefixState:
        self.whole_reads += 1
        return await super().read_prefix(prefix)


@pytest.fixture
async def counted(etcd_endpoints: list[str]) -> AsyncIterator[CountingReads]:
    coordinator = CountingReads(etcd_endpoints)
    async with coordinator:
        yield coordinator


async def test_an_unchanged_prefix_is_checked_without_reading_it_again(counted: CountingReads) -> None:
    prefix = unique_prefix() + "queues/"
    # Two pages of a whole read; a check every 1.2 s (check_interval).
    await asyncio.gather(*(counted.put(f"{prefix}q{i:04d}", b"x" * 300) for i in range(600)))
    watched = WatchedPrefix(counted, prefix, reread_every_s=0.1)
    await watched.start(timeout_s=scaled(10))
    try:
        assert counted.whole_reads == 1  # the first state
        told: list[set[str]] = []
        watched.add_listener(lambda _state, keys: told.append(keys))
        # Writes beside the prefix move etcd's revision: checks follow it without a read.
        for n in range(10):
            beside = await counted.put(prefix.rstrip("/") + f"-beside-{n}", b"beside")
            assert await watched.caught_up(beside, timeout_s=scaled(10))
        assert told == []
        assert watched.state.entries == await read_at(counted, prefix, watched.state.revision)
        # A change under the prefix comes with the watch's events, named.
        changed = await counted.put(f"{prefix}q0007", b"new")
        assert await watched.caught_up(changed, timeout_s=scaled(10))
        assert told == [{f"{prefix}q0007"}]
        entry = watched.get("q0007")
        assert entry is not None and entry.value == b"new"
        # Ten checks and more, and not one whole read of the 600 records (each was one
        # before: 2 pages, 180 KB from etcd, every 0.1 s here and every 2 s on a node).
        assert counted.whole_reads == 1
    finally:
        await watched.close()
