"""A partition leader's voters, learners and in-sync set, over real TCP between real LMDB
stores (the harness of test_replication.py): a learner is shipped the log but its
acknowledgements count in no majority; a voting set is *settled* (published, so the
manager may take the next membership step) only once a majority of it holds everything
written before it was adopted; a follower is in sync while it keeps acknowledging the
whole log."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from backend_store.cluster.replication.log_shipping import ReplicationLeader
from backend_store.errors import Unavailable
from backend_store.lmdb_store.engine import LmdbBackend
from backend_store.types import Epoch, Lsn
from tests.backend.harness import T1, q, send_one
from tests.conftest import scaled

from .test_replication import PARTITION, FollowerNode, open_store, until


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Set:
    """A leader with followers f1, f2, f3 linked, counting over ``voters``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.clock = Clock()
        self.store: LmdbBackend | None = None
        self.leader: ReplicationLeader | None = None
        self.followers: dict[str, FollowerNode] = {}
        self.links: dict[str, asyncio.Task[None]] = {}

    async def start(self, voters: tuple[str, ...]) -> ReplicationLeader:
        self.store = await open_store(self.root / "leader")
        self.leader = ReplicationLeader(
            self.store,
            partition=PARTITION,
            epoch=Epoch(3),
            replicas=len(voters),
            node_id="leader",
            voters=voters,
            clock=self.clock,
            heartbeat_s=0.05,
        )
        await self.leader.start()
        await self.store.create_queue(T1, q("orders"), {})
        for name in ("f1", "f2", "f3"):
            node = FollowerNode(name, await open_store(self.root / name))
            await node.start()
            self.followers[name] = node
            await self.link(name)
        return self.leader

    async def link(self, name: str) -> None:
        assert self.leader is not None
        reader, writer = await asyncio.open_connection("127.0.0.1", self.followers[name].port)
        self.links[name] = asyncio.create_task(self.leader.follow(name, reader, writer))

    async def cut(self, name: str) -> None:
        await self.followers[name].stop()
        link = self.links.pop(name, None)
        if link is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(link, scaled(5))

    async def heal(self, name: str) -> None:
        await self.followers[name].start()
        await self.link(name)

    async def write(self, body: str, timeout_s: float) -> Lsn:
        assert self.store is not None and self.leader is not None
        await send_one(self.store, T1, "orders", body)
        lsn = self.store.last_lsn
        await self.leader.replicate(lsn, timeout_s=timeout_s)
        return lsn

    async def close(self) -> None:
        for name in list(self.followers):
            await self.cut(name)
            await self.followers[name].store.close()
        if self.store is not None:
            await self.store.close()


@pytest.fixture
async def replica_set(tmp_path: Path) -> AsyncIterator[Set]:
    s = Set(tmp_path)
    try:
        yield s
    finally:
        await s.close()


async def test_a_learners_acknowledgements_count_in_no_majority(replica_set: Set) -> None:
    # Voters: the leader, f1 and f2; f3 is a learner. With f1 and f2 cut off, f3 alone
    # holding a write must not make it acknowledged.
    leader = await replica_set.start(("leader", "f1", "f2"))
    await replica_set.write("before", scaled(5))
    await replica_set.cut("f1")
    await replica_set.cut("f2")
    with pytest.raises(Unavailable):
        await replica_set.write("learner only", 0.5)
    assert replica_set.store is not None
    await until(lambda: leader.followers["f3"].acked == replica_set.store.last_lsn, "the learner to hold it")
    assert leader.committed_lsn < replica_set.store.last_lsn
    # The learner joins the voters: the leader and f3 are two of four, no majority either.
    leader.set_voters(("leader", "f1", "f2", "f3"))
    assert leader.committed_lsn < replica_set.store.last_lsn
    await replica_set.heal("f1")
    await until(lambda: leader.committed_lsn == replica_set.store.last_lsn, "leader, f1 and f3 to hold it")


async def test_a_voting_set_settles_once_a_majority_of_it_holds_what_came_before(replica_set: Set) -> None:
    leader = await replica_set.start(("leader", "f1", "f2"))
    await replica_set.write("a", scaled(5))
    await until(lambda: leader.settled_voters() == ("leader", "f1", "f2"), "the first set to settle")
    # f1 and f2 cut off; entries written meanwhile are on the leader and the learner f3 only.
    await replica_set.cut("f1")
    await replica_set.cut("f2")
    assert replica_set.store is not None
    for i in range(3):
        await send_one(replica_set.store, T1, "orders", f"b{i}")
    # f3 joins the voters: the new set is not settled while no majority of it (three of
    # four) holds those entries; the old one stays published.
    leader.set_voters(("leader", "f1", "f2", "f3"))
    leader.notify()
    await asyncio.sleep(0.3)
    assert leader.settled_voters() == ("leader", "f1", "f2")
    await replica_set.heal("f2")
    await until(lambda: leader.settled_voters() == ("leader", "f1", "f2", "f3"), "the new set to settle")


async def test_in_sync_is_who_acknowledged_the_whole_log_lately(replica_set: Set) -> None:
    leader = await replica_set.start(("leader", "f1", "f2"))
    await replica_set.write("a", scaled(5))
    await until(lambda: leader.in_sync(1.0) == ("f1", "f2", "f3"), "every follower in sync")
    await replica_set.cut("f2")
    replica_set.clock.now += 5.0  # time passes; f1 and f3 answer heartbeats, f2 cannot
    await until(lambda: leader.in_sync(1.0) == ("f1", "f3"), "f2 out of sync")
    await replica_set.heal("f2")
    await until(lambda: leader.in_sync(1.0) == ("f1", "f2", "f3"), "f2 back in sync")
