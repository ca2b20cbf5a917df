"""The reserve of room that sends may not use (backend_store/lmdb_store/room.py), on real LMDB
environments: sends are refused with ``unavailable`` ("disk full") before they write; receives,
acks and nacks go on; the pages acks free count as room again; and a store that keeps a
replication log (a backend node's replica) trims it short, so its acks free room too.

A map that may not grow past a few MiB stands in for a small disk here (the room is the
smaller of the two); tests/gateway/test_disk_full.py and tests/cluster/test_full_disks.py
fill real file systems.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from backend_store.errors import Unavailable
from backend_store.lmdb_store.engine import LmdbBackend
from backend_store.lmdb_store.room import default_reserve
from backend_store.options import StoreOptions
from backend_store.types import Epoch

from .harness import T1, msg, q

MIB = 1024 * 1024
BODY = os.urandom(48 * 1024)
SMALL = os.urandom(1024)


async def open_store(
    path: Path, *, log_keep: int = 0, reserve: int | None = None, journal: bool = True
) -> LmdbBackend:
    store = LmdbBackend(
        path,
        StoreOptions(
            map_size=8 * MIB,
            max_map_size=8 * MIB,
            disk_reserve_bytes=reserve,
            replication_log_keep=log_keep,
            sweep_interval_s=0,
            journal=journal,
        ),
    )
    await store.start()
    if log_keep:
        await store.raise_epoch(Epoch(1))  # a leader's replica: its own writes are logged
    return store


async def fill(store: LmdbBackend, body: bytes = BODY, per_send: int = 1) -> int:
    """Send until the store refuses; return how many were stored."""
    stored = 0
    while True:
        try:
            results = await store.send(T1, q("big"), [msg(body) for _ in range(per_send)])
        except Unavailable as exc:
            assert exc.detail == "store is full", "the map, not the disk, is the limit here"
            return stored
        assert not any(isinstance(r, Exception) for r in results), results
        stored += per_send
        assert stored < 100_000, "never refused"


async def drain(store: LmdbBackend, per_ack: int) -> int:
    """Receive and ack everything, ``per_ack`` at a time, as a consumer does; return how many."""
    acked = 0
    while got := await store.receive(T1, q("big"), per_ack):
        result = await store.ack(T1, [m.receipt for m in got])
        assert result.acked == len(got)
        acked += len(got)
    return acked


@pytest.mark.parametrize("log_keep", [0, 1000], ids=["embedded", "replica"])
async def test_sends_stop_at_the_reserve_and_acks_make_room_again(tmp_path: Path, log_keep: int) -> None:
    store = await open_store(tmp_path / "s", log_keep=log_keep, reserve=MIB)
    try:
        await store.create_queue(T1, q("big"), {"max_message_bytes": 1 * MIB})
        stored = await fill(store, BODY)
        assert stored > 10
        # Receives, nacks, visibility changes and acks may use the reserve.
        got = await store.receive(T1, q("big"), 3)
        await store.change_visibility(T1, q("big"), got[0].receipt, 0)
        assert (await store.nack(T1, [got[1].receipt])).acked == 1
        assert (await store.ack(T1, [got[2].receipt])).acked == 1
        assert await drain(store, 5) == stored - 1
        # Room again. Large messages take less than the first time: LMDB keeps each in a run
        # of contiguous free pages, and freed runs break up; small ones as much as before.
        again = await fill(store, BODY)
        assert again >= stored // 3
        assert await drain(store, 5) == again
        first = stored = await fill(store, SMALL, per_send=50)
        for _ in range(2):
            # Acks of many messages at once: on a replica their log entry holds them all
            # (before log_pages.py, this drain stopped at "store is full" after 600 messages).
            assert await drain(store, 100) == stored
            stored = await fill(store, SMALL, per_send=50)
            assert stored >= first * 9 // 10
    finally:
        await store.close()


async def test_a_refused_send_writes_nothing(tmp_path: Path) -> None:
    store = await open_store(tmp_path / "s", reserve=MIB)
    try:
        await store.create_queue(T1, q("big"), {"max_message_bytes": 1 * MIB})
        stored = await fill(store)
        with pytest.raises(Unavailable, match="store is full"):
            await store.send(T1, q("big"), [msg(b"small"), msg(BODY)])
        assert (await store.get_queue(T1, q("big"))).stats.visible == stored
    finally:
        await store.close()


async def test_a_log_short_of_room_keeps_only_its_newest_entries(tmp_path: Path) -> None:
    # LMDB's own syncs: a journaling store's checkpoint (taken when the map is full) lets go
    # of the pages its pinned reader kept, so the fill's last send may commit with room
    # again, and keep one entry more than a commit short of room would. The trimming under
    # test is the same either way.
    store = await open_store(tmp_path / "s", log_keep=1000, reserve=MIB, journal=False)
    try:
        await store.create_queue(T1, q("big"), {"max_message_bytes": 1 * MIB})
        for _ in range(5):
            await store.send(T1, q("big"), [msg(b"small")])
        assert await store.first_retained_lsn() == 1, "with room, the log keeps its 1,000 entries"
        await fill(store)
        first = await store.first_retained_lsn()
        assert first is not None and store.last_lsn - first < 64 + 1
    finally:
        await store.close()


def test_the_default_reserve_is_two_percent_of_what_the_store_may_fill(tmp_path: Path) -> None:
    fs = os.statvfs(tmp_path)
    disk = fs.f_blocks * fs.f_frsize
    assert default_reserve(tmp_path, 1 << 50) == min(1024 * MIB, max(MIB, int(disk * 0.02)))
    if disk >= 1024 * MIB:
        assert default_reserve(tmp_path, 1024 * MIB) == int(1024 * MIB * 0.02)  # the map is the limit
    assert default_reserve(tmp_path, 8 * MIB) == MIB
