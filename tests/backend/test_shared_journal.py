"""A node's replicas share one journal (lmdb_store/checkpoint.py, ``JournalGroup``): their
commits numbered in one sequence, each entry tagged with its replica, one fdatasync for the
commits of a round, and after a power cut every replica recovered from it at the node's next
start, before any replica opens, having lost nothing acknowledged and undone no ack.
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import threading
from pathlib import Path
from typing import Any

from backend_store.lmdb_store import checkpoint
from backend_store.lmdb_store.checkpoint import JOURNAL_FILES, JournalGroup
from backend_store.lmdb_store.commit_thread import CommitThread
from backend_store.lmdb_store.engine import LmdbBackend
from backend_store.types import ReceivedMessage

from .harness import T1, msg, q, receive_all
from .test_journal import PAGE, assert_whole, crash_image
from .test_replica_journal import SwitchableSync
from .test_replica_store import LOG_KEEP, Replicas, replicas

__all__ = ["replicas"]  # the fixture, used by name

QUEUE = "inbox"
NAMES = ("0", "1", "2")


async def open_replica(
    replicas: Replicas, root: Path, name: str, thread: CommitThread, **overrides: Any
) -> LmdbBackend:
    """Replica ``name`` in ``root/name``, as a node opens one beside its journal."""
    overrides.setdefault("replication_log_keep", LOG_KEEP)
    store = LmdbBackend(root / name, replicas.factory(name).options(commit_thread=thread, **overrides))
    await store.start()
    return store


def node_thread(
    root: Path, fdatasync: SwitchableSync | None = None, interval_s: float = 3600
) -> CommitThread:
    return CommitThread(
        journal=JournalGroup.of_node(root, interval_s=interval_s, fdatasync=fdatasync or os.fdatasync)
    )


async def test_a_round_of_three_replicas_is_one_journal_sync(replicas: Replicas) -> None:
    holding, released, entered = threading.Event(), threading.Event(), threading.Event()
    calls: list[int] = []

    def fdatasync(fd: int) -> None:
        if holding.is_set():
            holding.clear()
            entered.set()
            released.wait(10)
        os.fdatasync(fd)
        calls.append(fd)

    thread = CommitThread(journal=JournalGroup.of_node(replicas.root, interval_s=3600, fdatasync=fdatasync))
    stores = [await open_replica(replicas, replicas.root, name, thread) for name in NAMES]
    for store in stores:
        await store.create_queue(T1, q(QUEUE), {})
    # The thread held in a sync: one send to each replica queues up behind it meanwhile.
    holding.set()
    first = asyncio.ensure_future(stores[0].send(T1, q(QUEUE), [msg("first")]))
    await asyncio.to_thread(entered.wait, 10)
    before = len(calls)
    sends = [asyncio.ensure_future(store.send(T1, q(QUEUE), [msg("round")])) for store in stores]
    deadline = asyncio.get_running_loop().time() + 10
    while thread._queue.qsize() < len(stores):
        assert asyncio.get_running_loop().time() < deadline, "the sends never queued"
        await asyncio.sleep(0.01)
    released.set()
    await asyncio.gather(first, *sends)
    # The held sync, then one for the round: three commits in three environments, one
    # journal they share.
    assert len(calls) - before == 2, calls[before:]
    assert all(not (replicas.root / name / "journal").exists() for name in NAMES)
    assert (replicas.root / "journal").exists()
    for store in stores:
        await store.close()


async def test_power_loss_of_a_node_loses_nothing_acknowledged_on_any_replica(
    replicas: Replicas, tmp_path: Path
) -> None:
    root = replicas.root
    first = node_thread(root)
    stores = {name: await open_replica(replicas, root, name, first) for name in NAMES}
    for store in stores.values():
        await store.create_queue(T1, q(QUEUE), {})
        await store.send(T1, q(QUEUE), [msg(f"old-{i}") for i in range(20)])
    for store in stores.values():
        await store.close()

    syncs = SwitchableSync()
    thread = node_thread(root, syncs)
    stores = {name: await open_replica(replicas, root, name, thread) for name in NAMES}
    survivors: dict[str, set[bytes]] = {name: {f"old-{i}".encode() for i in range(20)} for name in NAMES}
    acked: dict[str, set[bytes]] = {name: set() for name in NAMES}

    async def round_(name: str, number: int) -> None:
        store = stores[name]
        bodies = [f"{name}-{number}-{i}".encode() * 30 for i in range(8)]
        sent = await store.send(T1, q(QUEUE), [msg(body) for body in bodies])
        assert all(not isinstance(result, Exception) for result in sent)
        survivors[name] |= set(bodies)
        got = await store.receive(T1, q(QUEUE), 4, 3600)
        await store.ack(T1, [m.receipt for m in got[:2]])
        acked[name] |= {m.body for m in got[:2]}

    for number in range(6):
        await asyncio.gather(*(round_(name, number) for name in NAMES))
        if number == 2:
            # A replica leaves (closed cleanly) and joins again mid-run.
            await stores["1"].close()
            stores["1"] = await open_replica(replicas, root, "1", thread)
            # Its joining took a checkpoint of every replica (synced): what the disk holds
            # from here, whatever the power cut leaves of the pages written after it.
            images = {name: (root / name / "data.mdb").read_bytes() for name in NAMES}
    journal_file = root / JOURNAL_FILES[0]
    synced_journal = journal_file.read_bytes()
    group = thread.journal
    assert group is not None
    synced_length = group.journal.written
    # One more send on every replica, never synced: its entries may be cut anywhere.
    syncs.on = False
    await asyncio.gather(
        *(store.send(T1, q(QUEUE), [msg(f"unsynced-{name}")]) for name, store in stores.items())
    )
    finals = {name: (root / name / "data.mdb").read_bytes() for name in NAMES}
    checkpoints = {name: (root / name / "checkpoint").read_bytes() for name in NAMES}
    journal = journal_file.read_bytes()
    assert journal[:synced_length] == synced_journal[:synced_length]
    for name in NAMES:
        saved = checkpoint.load(root / name)
        assert saved is not None and saved.shared and not saved.clean
    for store in stores.values():
        await store.close()

    torn_states = 0
    for seed in range(30):
        rng = random.Random(seed)
        crashed = tmp_path / f"crash-{seed}"
        for name in NAMES:
            shutil.copytree(root / name, crashed / name)
            image = crash_image(images[name], finals[name], rng)
            torn_states += image[: 2 * PAGE] != images[name][: 2 * PAGE]
            (crashed / name / "data.mdb").write_bytes(image)
            (crashed / name / "checkpoint").write_bytes(checkpoints[name])
            (crashed / name / "lock.mdb").unlink()
        cut = synced_length + rng.randrange(0, len(journal) - synced_length + 1)
        (crashed / JOURNAL_FILES[0]).write_bytes(journal[:cut] + bytes(rng.randrange(0, 64)))
        got = await everything(crashed, replicas)
        for name in NAMES:
            bodies = [m.body for m in got[name]]
            assert len(bodies) == len(set(bodies)), f"seed {seed}: a message of {name} came back twice"
            missing = survivors[name] - acked[name] - set(bodies)
            assert not missing, f"seed {seed}: {len(missing)} acknowledged sends of {name} lost"
            assert not acked[name] & set(bodies), f"seed {seed}: an acknowledged ack of {name} undone"
            assert set(bodies) - survivors[name] <= {f"unsynced-{name}".encode()}, f"seed {seed}: {name}"
            assert_whole(crashed / name)
    assert torn_states, "no seed wrote a later meta page: the simulation proved little"


async def everything(root: Path, replicas: Replicas) -> dict[str, list[ReceivedMessage]]:
    """Every replica under ``root`` opened as its node opens them (recovered from the shared
    journal first), read past every visibility timeout."""
    later = replicas.clock.now + 7200
    thread = node_thread(root)
    got: dict[str, list[ReceivedMessage]] = {}
    opened: list[LmdbBackend] = []
    try:
        for name in NAMES:
            store = await open_replica(replicas, root, name, thread, clock=lambda: later)
            opened.append(store)
            got[name] = await receive_all(store, T1, QUEUE)
    finally:
        for store in opened:
            await store.close()
    return got


async def test_a_replica_that_journaled_alone_before_the_upgrade_replays_its_own_journal(
    replicas: Replicas, tmp_path: Path
) -> None:
    """A node of the release before session 72 journaled each replica in its own directory,
    under a checkpoint file of format 2 (a store alone still writes it): killed, then started
    on today's code, the replica replays that journal at its open and then journals in its
    node's."""
    before = tmp_path / "before"
    store = LmdbBackend(before / "5", replicas.factory("5").options(replication_log_keep=LOG_KEEP))
    await store.start()
    await store.create_queue(T1, q(QUEUE), {})
    bodies = [f"sent-{i}".encode() for i in range(30)]
    for body in bodies:
        await store.send(T1, q(QUEUE), [msg(body)])
    # SIGKILL: the page cache keeps everything written, synced or not.
    killed = tmp_path / "node" / "partitions"
    shutil.copytree(before / "5", killed / "5")
    await store.close()
    (killed / "5" / "lock.mdb").unlink()
    saved = checkpoint.load(killed / "5")
    assert saved is not None and not saved.shared and not saved.clean
    # A store's own journal keeps the format earlier releases wrote and read.
    assert (killed / "5" / "checkpoint").read_bytes().startswith(b"PGCKPT2\0")

    upgraded = await open_replica(replicas, killed, "5", node_thread(killed))
    try:
        assert sorted(m.body for m in await receive_all(upgraded, T1, QUEUE)) == sorted(bodies)
        saved = checkpoint.load(killed / "5")
        assert saved is not None and saved.shared
    finally:
        await upgraded.close()
