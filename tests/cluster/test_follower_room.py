"""A follower catching up on a store short of room (real LMDB stores, real TCP on loopback).

The leader refuses sends that would leave less than its reserve (room.py), commit by commit;
short of room, each of its commits is followed by a checkpoint, so the pages one commit frees
are reused by the next. A follower that lagged got the leader's entries in one shipment and
applied them in one commit, which needs room for every page they write at once: LMDB reuses
no page its own transaction freed. On a disk the leader still had room on, the follower's
commit failed ("disk full"), every retry the same, and the leader trimmed its log past it,
so only a snapshot could bring it back, which needs room for a second copy (session 75:
tests/cluster/test_full_disks.py under load, follower n1 stuck at LSN 180 of 217). Now a
follower commits a backlog in pieces where room is short (replica.py).

A map that may not grow past a few MiB stands in for the small disk here, as in
tests/backend/test_room.py.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from backend_store.cluster.replication.log_shipping import ReplicationMode
from backend_store.errors import Unavailable
from backend_store.lmdb_store.engine import LmdbBackend
from backend_store.options import StoreOptions
from tests.backend.harness import T1, msg, q

from .test_replication import Cluster, contents, until

MIB = 1024 * 1024
BODY = os.urandom(16 * 1024)
PER_SEND = 4
PER_RECEIVE = 16


def small_store_options(keep: int) -> StoreOptions:
    return StoreOptions(
        replication_log_keep=keep,
        sweep_interval_s=0,
        map_size=8 * MIB,
        max_map_size=8 * MIB,
        disk_reserve_bytes=MIB,
    )


async def open_small_store(path: Path, keep: int) -> LmdbBackend:
    store = LmdbBackend(path, small_store_options(keep))
    await store.start()
    return store


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    """A sync leader and two followers on small maps, the queue made."""
    c = Cluster(tmp_path, open_store=open_small_store)
    try:
        await c.start(ReplicationMode.SYNC)
        assert c.leader is not None
        await c.leader.create_queue(T1, q("inbox"), {})
        yield c
    finally:
        await c.close()


async def test_a_follower_catches_up_on_a_backlog_that_fits_only_commit_by_commit(
    cluster: Cluster,
) -> None:
    leader, store = cluster.replication, cluster.leader
    assert leader is not None and store is not None
    # Sends until the leader refuses one: every replica is then near its reserve.
    while True:
        try:
            await store.send(T1, q("inbox"), [msg(BODY) for _ in range(PER_SEND)])
        except Unavailable as exc:
            assert exc.detail == "store is full"
            break
        await leader.replicate(store.last_lsn)
    # f1 misses the drain: consumers receive and ack every message, one batch at a time,
    # each commit's undo holding the bodies it deleted; f2 keeps the majority.
    await cluster.cut("f1")
    lagged_at = cluster.followers["f1"].store.last_lsn
    while batch := await store.receive(T1, q("inbox"), PER_RECEIVE):
        await store.ack(T1, [m.receipt for m in batch], q("inbox"))
    await leader.replicate(store.last_lsn)
    assert store.last_lsn - lagged_at < 64, "a backlog the leader's log still holds, short of room"

    # Back: the backlog is shipped at once, more than the follower's room takes in one commit.
    f1 = await cluster.restart_follower("f1")
    await until(lambda: f1.store.last_lsn == store.last_lsn, "f1 to catch up")
    assert f1.replication.snapshots_installed == 0
    assert await contents(f1.store) == await contents(store)


async def test_a_follower_with_room_to_spare_applies_a_backlog_in_one_commit(cluster: Cluster) -> None:
    leader, store = cluster.replication, cluster.leader
    assert leader is not None and store is not None
    await cluster.cut("f1")
    for i in range(50):
        await store.send(T1, q("inbox"), [msg(f"m{i}")])
    await leader.replicate(store.last_lsn)
    f1 = cluster.followers["f1"]
    before = f1.store.stats["operations"]
    await f1.start()
    await cluster.link("f1")
    await until(lambda: f1.store.last_lsn == store.last_lsn, "f1 to catch up")
    assert f1.store.stats["operations"] - before == 1, "50 entries shipped at once, one commit"
    assert await contents(f1.store) == await contents(store)
