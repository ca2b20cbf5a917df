"""Whole reads and the watch's periodic check, a page at a time (issue 48, item 3).

A node, a manager and a gateway each read ``queues/`` whole every two seconds, to check what
their watches applied. Read in one range and compared in one pass, 3,000 queue records held
a node's event loop for 0.97-0.99 s on a loaded 2-core machine, its etcd lease ran out
and it stepped down from every partition it led, with no fault anywhere
(bench/leader_stability.py, docs/cluster.md section 3). Now a whole read asks etcd for
``_READ_PAGE`` keys at a time, all at the first page's revision, and the check compares a
page per turn of the loop. These tests hold the read to its promise (one consistent state,
also while the prefix changes under it) against a real etcd, and the comparison to a page
per turn without any clock.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from backend_store.cluster.coordination import etcd_coordinator
from backend_store.cluster.coordination.coordinator import Entry, PrefixState
from backend_store.cluster.coordination.etcd_coordinator import EtcdCoordinator, changed_in_pages
from backend_store.cluster.coordination.watched_prefix import WatchedPrefix, changed_keys
from tests.cluster.test_watch_events import read_at
from tests.conftest import scaled
from tests.fixtures.etcd_server import unique_prefix

PAGE = etcd_coordinator._READ_PAGE
KEYS = PAGE * 2 + 234  # three pages, the last one partial


@pytest.fixture
async def coordinator(etcd_endpoints: list[str]) -> AsyncIterator[EtcdCoordinator]:
    async with EtcdCoordinator(etcd_endpoints) as c:
        yield c


async def fill(coordinator: EtcdCoordinator, prefix: str, count: int) -> None:
    async def put(i: int) -> None:
        await coordinator.put(f"{prefix}q{i:05d}", b"record %d" % i)

    for begin in range(0, count, 25):
        await asyncio.gather(*(put(i) for i in range(begin, min(count, begin + 25))))


async def test_a_whole_read_of_more_than_a_page_is_etcds_own_read_at_its_revision(
    coordinator: EtcdCoordinator,
) -> None:
    prefix = unique_prefix() + "queues/"
    await fill(coordinator, prefix, KEYS)
    await coordinator.put(prefix.rstrip("/") + "-beside", b"not under the prefix")
    state = await coordinator.read_prefix(prefix)
    assert len(state.entries) == KEYS
    assert state.entries == await read_at(coordinator, prefix, state.revision)


async def test_a_whole_read_made_while_the_prefix_changes_is_one_revisions_state(
    coordinator: EtcdCoordinator,
) -> None:
    """Pages read while keys are written, added and deleted still make the state of the
    first page's revision: never a page from before a write beside one from after it."""
    prefix = unique_prefix() + "queues/"
    await fill(coordinator, prefix, KEYS)
    writing = asyncio.Event()

    async def writer() -> None:
        i = 0
        while not writing.is_set():
            # Keys of the last page rewritten, of the first deleted, new ones added past the
            # end: a read mixing pages of two revisions differs from etcd's read at either.
            await coordinator.put(f"{prefix}q{KEYS - 1 - i % 100:05d}", b"rewritten %d" % i)
            await coordinator.delete(f"{prefix}q{i:05d}")
            await coordinator.put(f"{prefix}z{i:05d}", b"added %d" % i)
            i += 1

    task = asyncio.create_task(writer())
    try:
        for _ in range(5):
            state = await coordinator.read_prefix(prefix)
            assert state.entries == await read_at(coordinator, prefix, state.revision)
    finally:
        writing.set()
        await asyncio.wait_for(task, scaled(10))


async def test_a_check_read_reaches_the_watchers_naming_what_it_changed(
    coordinator: EtcdCoordinator,
) -> None:
    """A periodic check newer than the events applied is handed out with the keys it changed
    (none, here: only a key beside the prefix was written), so no consumer compares every
    record again, and it equals etcd's read at its revision."""
    prefix = unique_prefix() + "queues/"
    await fill(coordinator, prefix, KEYS)
    watched = WatchedPrefix(coordinator, prefix, reread_every_s=0.2)
    await watched.start(timeout_s=scaled(10))
    told: list[set[str]] = []
    watched.add_listener(lambda _state, keys: told.append(keys))
    try:
        beside = await coordinator.put(prefix.rstrip("/") + "-beside", b"not under the prefix")
        # No event under the prefix brings this revision: only a check read can.
        assert await watched.caught_up(beside, timeout_s=scaled(10))
        assert told == []
        state = watched.state
        assert state.changed == frozenset()
        assert state.entries == await read_at(coordinator, prefix, state.revision)
    finally:
        await watched.close()


def states(
    count: int, changed: set[int], removed: set[int], added: set[int]
) -> tuple[PrefixState, PrefixState]:
    def entry(i: int, rev: int) -> Entry:
        return Entry(f"/p/q{i:05d}", b"v%d" % rev, i + 1, rev)

    old = {f"/p/q{i:05d}": entry(i, i + 1) for i in range(count)}
    new = {k: e for k, e in old.items() if int(k[4:]) not in removed}
    for i in changed:
        new[f"/p/q{i:05d}"] = entry(i, 10_000 + i)
    for i in added:
        new[f"/p/q{i:05d}"] = entry(i, 20_000 + i)
    return PrefixState("/p/", 100, old), PrefixState("/p/", 200, new)


def test_a_check_compares_a_page_per_turn_of_the_event_loop() -> None:
    """Driven by hand, no loop and no clock: the comparison of three pages of keys gives the
    loop back twice, and finds exactly what the one-pass comparison finds."""
    old, new = states(KEYS, changed={3, PAGE + 5, KEYS - 1}, removed={7}, added={KEYS + 1})
    comparison = changed_in_pages(old, new)
    turns = 0
    while True:
        try:
            comparison.send(None)
        except StopIteration as done:
            keys = done.value
            break
        turns += 1
    assert turns == 2
    assert keys == changed_keys(old, new)
    assert keys == {f"/p/q{i:05d}" for i in (3, PAGE + 5, KEYS - 1, 7, KEYS + 1)}
