"""One entry per (LSN, epoch) (issue 24, defect 4), on real LMDB stores.

A leader's store offers each entry to its followers before its own commit (early
shipping). When that commit then fails (here: the map is full at commit time, which LMDB
reports when the freed pages it must record need room), followers may hold the entry;
the batch used to be retried at the same LSN and epoch with other contents (new message
ids), and log matching, which takes equal (LSN, epoch) for equal entries, would then
never repair the difference. Now the term takes no more writes after such a loss; the
next term's entries, at a higher epoch, replace the lost one on every follower.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from backend_store.errors import PushgateError, Unavailable
from backend_store.lmdb_store.engine import LmdbBackend
from backend_store.options import StoreOptions
from backend_store.types import Epoch, LogEntry, Lsn, NewMessage, QueueName, TenantId

T, Q = TenantId("t"), QueueName("q")


async def open_store(path: Path, map_size: int) -> LmdbBackend:
    # Room to grow once: the batch whose commit failed is retried after the map grows. No
    # reserve of room (lmdb_store/room.py), which would refuse the sends before the map
    # fills: a commit can still fail (a failed fsync, a write the reserve did not cover),
    # and this is what must follow.
    store = LmdbBackend(
        path,
        StoreOptions(
            replication_log_keep=100_000,
            sweep_interval_s=0,
            map_size=map_size,
            max_map_size=2 * map_size,
            disk_reserve_bytes=0,
        ),
    )
    await store.start()
    return store


async def fill_until_a_shipped_entry_is_lost(store: LmdbBackend, lost: list[Lsn]) -> None:
    """Concurrent sends of random bodies until a commit fails after its entry was offered."""
    for i in range(400):
        body = os.urandom(1000 + (i * 37) % 3000)
        sends = [store.send(T, Q, [NewMessage(body, is_text=False)]) for _ in range(8)]
        await asyncio.gather(*sends, return_exceptions=True)
        if lost:
            return
    raise AssertionError("no commit failed after its entry was shipped")


async def test_a_shipped_entry_whose_commit_failed_is_never_followed_by_another_at_its_lsn_and_epoch(
    tmp_path: Path,
) -> None:
    leader = await open_store(tmp_path / "leader", 1 << 20)
    follower = await open_store(tmp_path / "follower", 8 << 20)
    try:
        await leader.create_queue(T, Q, {"max_message_bytes": 1 << 20})
        await leader.raise_epoch(Epoch(3))
        offered: list[LogEntry] = []
        lost: list[Lsn] = []
        leader.ship_early(offered.append, lost.append)
        await fill_until_a_shipped_entry_is_lost(leader, lost)
        # Writes go on as a leader's would (the node has yet to end the term).
        after: list[object] = []
        for _ in range(5):
            try:
                after.append(await leader.send(T, Q, [NewMessage(os.urandom(500), is_text=False)]))
            except PushgateError as exc:
                after.append(exc)

        # What followers may hold: the first entry offered at each LSN.
        shipped: dict[tuple[int, int], bytes] = {}
        for entry in offered:
            shipped.setdefault((entry.lsn, entry.epoch), entry.record)
        logged = await leader.read_replication_log(Lsn(0))
        differing = [(e.lsn, e.epoch) for e in logged if shipped.get((e.lsn, e.epoch), e.record) != e.record]
        assert differing == [], "an (LSN, epoch) was committed with other contents than shipped"
        # The term is over for writes: each says its outcome is unknown.
        assert after and all(isinstance(r, Unavailable) for r in after), after

        # A follower that took the lost entry ends equal to the leader's next term.
        await follower.raise_epoch(Epoch(3))
        first = min(lost)
        await follower.apply_replicated([e for e in logged if e.lsn < first])
        await follower.apply_replicated([next(e for e in offered if e.lsn == first)])
        assert follower.last_lsn == first
        await leader.raise_epoch(Epoch(4))  # the node ended the term; it leads the next
        await leader.send(T, Q, [NewMessage(b"next term", is_text=True)])
        new = await leader.read_replication_log(Lsn(first - 1))
        assert new and new[0].lsn == first and new[0].epoch == 4
        # Log matching: the follower's entry at that LSN is of another epoch, so it goes.
        await follower.truncate_after(Lsn(first - 1), Epoch(4))
        await follower.apply_replicated(new, Epoch(4))
        assert follower.last_entry == leader.last_entry
        assert [m.body for m in await follower.peek(T, Q, 1000)] == [
            m.body for m in await leader.peek(T, Q, 1000)
        ]
    finally:
        await leader.close()
        await follower.close()


async def test_a_write_queued_under_a_deposed_term_is_never_logged_in_the_next(tmp_path: Path) -> None:
    """Simulation seed ``all`` 231542 (session 36): n1 led epoch 832 on a slow disk, resigned,
    and n2's term (842) truncated n1's tail; a send n1 had queued as leader then committed,
    and the writer logged it at LSN 58 with the fence's epoch, 842, where n2 had written
    something else. A store logs its own writes only in the term it started last; once a
    newer leader's truncation or entries raise the fence past it, they fail, unlogged."""
    store = await open_store(tmp_path / "n1", 8 << 20)
    try:
        await store.create_queue(T, Q, {})
        await store.raise_epoch(Epoch(5))
        await store.send(T, Q, [NewMessage(b"term 5", is_text=True)])
        last, epoch = store.last_entry
        assert epoch == 5
        # A newer leader (epoch 7) rolls back this deposed leader's unacknowledged tail.
        assert await store.truncate_after(Lsn(last - 1), Epoch(7)) == 1
        before = store.last_entry
        try:
            await store.send(T, Q, [NewMessage(b"queued under term 5", is_text=True)])
            raise AssertionError("a deposed term's write was logged")
        except Unavailable as exc:
            assert "not the leader" in str(exc.detail)
        assert store.last_entry == before
        assert [e.epoch for e in await store.read_replication_log(Lsn(0))] == [0] * (last - 1)
        # Leading again, in a newer term: its writes are logged at its epoch.
        await store.raise_epoch(Epoch(9))
        await store.send(T, Q, [NewMessage(b"term 9", is_text=True)])
        assert store.last_entry == (Lsn(last), Epoch(9))
    finally:
        await store.close()
