"""A node's replicas commit on one thread (lmdb_store/commit_thread.py): each replica's
writes, syncs and answers stay its own, one replica stopped or re-opened leaves the others
serving, and the thread ends when the last replica on it closes."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable

from backend_store.lmdb_store.commit_thread import CommitThread

from .harness import T1, q, receive_all, send_one
from .test_replica_store import Replicas, replicas

__all__ = ["replicas"]  # the fixture, used by name

QUEUE = "inbox"


# This test's own thread's name: other tests' writer threads may still be ending.
NAME = "pushgate-writer-under-test"


def writer_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == NAME]


async def test_replicas_on_one_thread_each_keep_their_own_writes(replicas: Replicas) -> None:
    shared = CommitThread(NAME)
    assert writer_threads() == []
    stores = [await replicas.open(name, commit_thread=shared) for name in ("p0", "p1", "p2")]
    assert len(writer_threads()) == 1 and shared.members == 3
    for store in stores:
        await store.create_queue(T1, q(QUEUE), {})
    # Sends to all three at once: the thread's rounds mix them; each store holds its own.
    await asyncio.gather(
        *(send_one(store, T1, QUEUE, f"{index}-{n}") for n in range(50) for index, store in enumerate(stores))
    )
    for index, store in enumerate(stores):
        bodies = sorted(m.body.decode() for m in await receive_all(store, T1, QUEUE))
        assert bodies == sorted(f"{index}-{n}" for n in range(50))
    # One closed: the others still take writes on the same thread.
    await stores[0].close()
    assert shared.members == 2 and len(writer_threads()) == 1
    await send_one(stores[1], T1, QUEUE, "after")
    assert [m.body for m in await receive_all(stores[1], T1, QUEUE)] == [b"after"]
    # The last one closed ends the thread; a replica opened again starts it again.
    for store in stores[1:]:
        await store.close()
    await _until(lambda: not writer_threads())
    assert shared.members == 0
    again = await replicas.open("p0", commit_thread=shared)
    assert len(writer_threads()) == 1
    await send_one(again, T1, QUEUE, "reopened")
    assert [m.body for m in await receive_all(again, T1, QUEUE)] == [b"reopened"]


async def test_a_send_is_answered_only_after_its_own_replicas_journal_is_synced(replicas: Replicas) -> None:
    """Two journaled replicas on one thread: while one replica's journal sync is held, its
    send stays unanswered, whatever the other replica's syncs do; released, it is answered."""
    shared = CommitThread()
    holding, released, entered = threading.Event(), threading.Event(), threading.Event()

    def held_fdatasync(fd: int) -> None:
        if holding.is_set():
            entered.set()
            released.wait(10)
        os.fdatasync(fd)

    other = await replicas.open("p0", commit_thread=shared)
    held = await replicas.open(
        "p1", commit_thread=shared, fdatasync=held_fdatasync, checkpoint_interval_s=3600
    )
    for store in (other, held):
        await store.create_queue(T1, q(QUEUE), {})
    holding.set()
    other_send = asyncio.ensure_future(send_one(other, T1, QUEUE, "a"))
    held_send = asyncio.ensure_future(send_one(held, T1, QUEUE, "b"))
    await asyncio.to_thread(entered.wait, 10)
    assert entered.is_set()
    await asyncio.sleep(0.2)
    assert not held_send.done()  # the held replica's send waits for its sync
    holding.clear()
    released.set()
    first, second = await asyncio.wait_for(asyncio.gather(other_send, held_send), 10)
    assert first.id and second.id
    assert [m.body for m in await receive_all(held, T1, QUEUE)] == [b"b"]


async def _until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.01)
