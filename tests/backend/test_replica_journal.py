"""A node's partition replica journals like a standalone store (lmdb_store/recorded_txn.py,
checkpoint.py): one fdatasync per commit on a leader and on a follower, every commit synced
(receives too) before anyone hears of it, and what a replica reports as its position
(``last_lsn``: what a follower acknowledges, what a leader counts as its own copy) only ever
durable. After a power cut, simulated over many seeds, a leader's and a follower's replicas
keep every entry they had acknowledged, and read whole.
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import threading
from pathlib import Path

import pytest

from backend_store.lmdb_store import checkpoint
from backend_store.lmdb_store.engine import LmdbBackend
from backend_store.types import Epoch, Lsn, NewMessage

from ..conftest import scaled
from .harness import T1, msg, q
from .test_journal import PAGE, assert_whole, counting_fdatasync, crash_image
from .test_lmdb_engine import counted_syncs
from .test_replica_store import Replicas, contents, replicas, ship

__all__ = ["replicas"]  # the fixture, used by name

QUEUE = q("r")


async def test_a_replica_syncs_once_per_commit_on_leader_and_follower(
    replicas: Replicas, monkeypatch: pytest.MonkeyPatch
) -> None:
    leader_syncs, leader_fdatasync = counting_fdatasync()
    follower_syncs, follower_fdatasync = counting_fdatasync()
    leader = await replicas.open(
        "leader", fdatasync=leader_fdatasync, checkpoint_interval_s=3600, max_batch=5
    )
    follower = await replicas.open("follower", fdatasync=follower_fdatasync, checkpoint_interval_s=3600)
    for store in (leader, follower):
        env = store._require_env()
        assert env.journaled and not env.env.flags()["sync"]  # LMDB itself syncs nothing
    await leader.raise_epoch(Epoch(1))
    await leader.create_queue(T1, QUEUE, {})
    await ship(leader, follower)
    lmdb_syncs = [counted_syncs(store, monkeypatch) for store in (leader, follower)]
    # Idle: a send is one commit and one sync before it returns; so is a receive (a
    # replica's log never loses its tail), and so is each apply on the follower.
    before = len(leader_syncs)
    await leader.send(T1, QUEUE, [_message("m1")])
    got = await leader.receive(T1, QUEUE, 1, 30)
    assert len(got) == 1
    assert len(leader_syncs) - before == 2
    before = len(follower_syncs)
    await ship(leader, follower)  # one apply, one commit
    await ship(leader, follower)  # nothing new: no commit, no sync
    assert len(follower_syncs) - before == 1
    assert follower.last_lsn == leader.last_lsn
    # Under load: one sync per commit (at most five operations a commit on the leader).
    writer = leader._writer
    assert writer is not None
    batches, before = writer.batches, len(leader_syncs)
    await asyncio.gather(*(leader.send(T1, QUEUE, [_message(f"n{i}")]) for i in range(100)))
    commits = writer.batches - batches
    assert commits >= 20
    assert len(leader_syncs) - before == commits
    assert lmdb_syncs == [[], []]  # no sync of an LMDB file: no checkpoint was due


async def test_a_replica_reports_an_entry_only_once_it_is_durable(replicas: Replicas) -> None:
    """A follower acknowledges, and a leader counts itself as holding, ``last_lsn``: an
    entry committed to LMDB whose journal sync has not returned is not in it yet."""
    in_sync = threading.Event()
    release = threading.Event()

    def slow_fdatasync(fd: int) -> None:
        in_sync.set()
        assert release.wait(scaled(10))

    leader = await replicas.open("leader", checkpoint_interval_s=3600)
    await leader.raise_epoch(Epoch(1))
    await leader.create_queue(T1, QUEUE, {})
    await leader.send(T1, QUEUE, [_message("m1")])
    release.set()  # the follower's start and first apply go through
    follower = await replicas.open("follower", fdatasync=slow_fdatasync, checkpoint_interval_s=3600)
    await ship(leader, follower)
    position = follower.last_lsn
    release.clear()
    in_sync.clear()
    await leader.send(T1, QUEUE, [_message("m2")])
    entries = await leader.read_replication_log(position)
    applying = asyncio.ensure_future(follower.apply_replicated(entries))
    assert await asyncio.to_thread(in_sync.wait, scaled(10)), "the apply never synced"
    # Committed to LMDB (a read sees the entry), not yet synced: not reported.
    assert [e.lsn for e in await follower.read_replication_log(position)] == [e.lsn for e in entries]
    assert follower.last_lsn == position
    assert follower.last_entry[0] == position
    release.set()
    assert await applying == leader.last_lsn
    assert follower.last_lsn == leader.last_lsn


async def test_power_loss_of_a_leader_and_a_follower_loses_no_acknowledged_entry(
    replicas: Replicas, tmp_path: Path
) -> None:
    leader = await replicas.open("leader", checkpoint_interval_s=3600)
    follower = await replicas.open("follower", checkpoint_interval_s=3600)
    await leader.raise_epoch(Epoch(1))
    await leader.create_queue(T1, QUEUE, {})
    for i in range(20):
        await leader.send(T1, QUEUE, [_message(f"old-{i}")])
    await ship(leader, follower)
    paths = {"leader": leader.path, "follower": follower.path}
    # A clean checkpoint each: what the disks hold from here.
    await replicas.factory("leader").close(leader)
    await replicas.factory("follower").close(follower)
    images = {name: (path / "data.mdb").read_bytes() for name, path in paths.items()}
    # The leader's syncs, through its options (not patched onto its journal: a compiled
    # build's Journal has no per-instance attributes to patch).
    leader_syncs = SwitchableSync()
    leader = await replicas.open("leader", checkpoint_interval_s=3600, fdatasync=leader_syncs)
    follower = await replicas.open("follower", checkpoint_interval_s=3600)
    stores = {"leader": leader, "follower": follower}
    synced: dict[str, tuple[bytes, int]] = {}
    for round_ in range(6):
        await leader.send(T1, QUEUE, [_message(f"new-{round_}-{i}") for i in range(10)])
        got = await leader.receive(T1, QUEUE, 4, 3600)
        await leader.ack(T1, [m.receipt for m in got[:2]])
        await ship(leader, follower)
    acknowledged = {"leader": leader.last_lsn, "follower": follower.last_lsn}
    expected = {"leader": await contents(leader), "follower": await contents(follower)}
    for name, store in stores.items():
        journaling = store._writer._journaling  # type: ignore[union-attr]
        assert journaling is not None
        synced[name] = ((store.path / "journal").read_bytes(), journaling.journal.written)
    # One more send on the leader, never acknowledged: its journal entry may be cut anywhere.
    leader_syncs.on = False
    await leader.send(T1, QUEUE, [_message("unacknowledged")])
    finals: dict[str, tuple[bytes, bytes, bytes]] = {}
    for name, store in stores.items():
        directory = store.path
        finals[name] = (
            (directory / "data.mdb").read_bytes(),
            (directory / "journal").read_bytes(),
            (directory / "checkpoint").read_bytes(),
        )
        saved = checkpoint.load(directory)
        assert saved is not None and not saved.clean
    for name, store in stores.items():
        await replicas.factory(name).close(store)

    torn_states = 0
    for seed in range(40):
        for name in ("leader", "follower"):
            rng = random.Random(seed * 2 + (name == "follower"))
            final, journal, saved_checkpoint = finals[name]
            crashed = tmp_path / f"crash-{seed}" / name
            shutil.copytree(paths[name], crashed)
            image = crash_image(images[name], final, rng)
            torn_states += image[: 2 * PAGE] != images[name][: 2 * PAGE]
            (crashed / "data.mdb").write_bytes(image)
            synced_journal, synced_length = synced[name]
            assert journal[:synced_length] == synced_journal[:synced_length]
            cut = synced_length + rng.randrange(0, len(journal) - synced_length + 1)
            (crashed / "journal").write_bytes(journal[:cut] + bytes(rng.randrange(0, 64)))
            (crashed / "checkpoint").write_bytes(saved_checkpoint)
            (crashed / "lock.mdb").unlink()
            store = LmdbBackend(crashed, replicas.factory(name).options(replication_log_keep=1000))
            await store.start()
            try:
                assert store.last_lsn >= acknowledged[name], f"seed {seed}: {name} lost acknowledged entries"
                if store.last_lsn == acknowledged[name]:
                    assert await contents(store) == expected[name], f"seed {seed}: {name} differs"
                else:  # the unacknowledged send survived whole
                    assert name == "leader" and store.last_lsn == acknowledged[name] + 1
                assert store.epoch == Epoch(1)
                entries = await store.read_replication_log(Lsn(0), 100_000)
                assert [e.lsn for e in entries] == list(range(1, store.last_lsn + 1))
            finally:
                await store.close()
            assert_whole(crashed)
    assert torn_states, "no seed wrote a later meta page: the simulation proved little"


def _message(body: str) -> NewMessage:
    return msg(body.encode() * 20)


class SwitchableSync:
    """An fdatasync that can be switched off: the writes after that are never made durable,
    as a power cut before their sync would leave them."""

    def __init__(self) -> None:
        self.on = True

    def __call__(self, fd: int) -> None:
        if self.on:
            os.fdatasync(fd)
