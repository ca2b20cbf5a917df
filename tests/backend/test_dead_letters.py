"""Peek and redrive (the DeadLetters capability), and storage usage.

Redrive's promise: each message moves exactly once, even when the call is repeated or
the process is killed half-way (the crash test SIGKILLs a child in the middle of a
long redrive and checks that every message is in exactly one of the two queues).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from backend_store import Backend, StoreOptions, open_backend
from backend_store.backend import DeadLetters, StorageStats
from backend_store.errors import InvalidRequest, QueueNotFound

from ..conftest import ManualClock, scaled
from .harness import T1, T2, msg, ok, q

REPO = Path(__file__).resolve().parents[2]


def capable(store: Backend) -> DeadLetters:
    # A kind without peek/redrive must name these tests in its `lacks` (harness.py).
    assert isinstance(store, DeadLetters), "this backend kind has no peek/redrive"
    return store


async def dead_letter(store: Backend, clock: ManualClock, bodies: list[str], **fields: object) -> None:
    """Fill ``dlq`` with ``bodies`` the way production does: receives past max_receives."""
    await store.create_queue(T1, q("dlq"), {"ordering": fields.get("ordering", "best_effort")})
    await store.create_queue(
        T1,
        q("orders"),
        {
            "visibility_timeout_s": 1,
            "max_receives": 1,
            "dead_letter_queue": "dlq",
            "ordering": fields.get("ordering", "best_effort"),
        },
    )
    group = fields.get("group_id")
    for body in bodies:
        ok((await store.send(T1, q("orders"), [msg(body, group_id=group, attributes={"b": body})]))[0])
    for _ in bodies:
        await store.receive(T1, q("orders"), 100)
        clock.advance(2)
    assert await store.receive(T1, q("orders"), 100) == []
    assert (await store.get_queue(T1, q("dlq"))).stats.visible == len(bodies)


async def test_peek_changes_nothing(store: Backend, clock: ManualClock) -> None:
    dl = capable(store)
    await store.create_queue(T1, q("orders"), {})
    await store.send(T1, q("orders"), [msg("a"), msg("b"), msg("c", delay_s=60)])
    [held] = await store.receive(T1, q("orders"), 1)
    before = (await store.get_queue(T1, q("orders"))).stats
    peeked = await dl.peek(T1, q("orders"), 10)
    assert [(m.body, m.state) for m in peeked] == [(b"a", "in_flight"), (b"b", "visible"), (b"c", "delayed")]
    assert peeked[0].id == held.id and peeked[0].receive_count == 1
    assert [m.body for m in await dl.peek(T1, q("orders"), 2)] == [b"a", b"b"]
    assert (await store.get_queue(T1, q("orders"))).stats == before
    # The receipt still works: peek did not touch the message.
    assert (await store.ack(T1, [held.receipt])).acked == 1
    with pytest.raises(QueueNotFound):
        await dl.peek(T2, q("orders"), 1)
    with pytest.raises(InvalidRequest):
        await dl.peek(T1, q("orders"), 0)


async def test_redrive_moves_each_message_once(store: Backend, clock: ManualClock) -> None:
    dl = capable(store)
    await dead_letter(store, clock, ["m1", "m2", "m3"])
    original = await dl.peek(T1, q("dlq"), 10)
    assert await dl.redrive(T1, q("dlq"), q("orders"), 2) == 2
    assert await dl.redrive(T1, q("dlq"), q("orders"), 2) == 1
    assert await dl.redrive(T1, q("dlq"), q("orders"), 2) == 0  # a repeat finds nothing left
    got = await store.receive(T1, q("orders"), 10)
    assert [m.body for m in got] == [b"m1", b"m2", b"m3"]
    # Same ids, bodies and attributes; a fresh start (receive count 1 after this receive).
    assert [m.id for m in got] == [m.id for m in original]
    assert [m.attributes for m in got] == [{"b": "m1"}, {"b": "m2"}, {"b": "m3"}]
    assert all(m.receive_count == 1 and m.sent_at == clock.now for m in got)
    dlq = (await store.get_queue(T1, q("dlq"))).stats
    assert (dlq.visible, dlq.in_flight, dlq.delayed) == (0, 0, 0)


async def test_redrive_leaves_in_flight_dead_letters(store: Backend, clock: ManualClock) -> None:
    dl = capable(store)
    await dead_letter(store, clock, ["x", "y"])
    [held] = await store.receive(T1, q("dlq"), 1)
    assert await dl.redrive(T1, q("dlq"), q("orders"), 10) == 1
    assert (await store.ack(T1, [held.receipt])).acked == 1
    with pytest.raises(InvalidRequest):
        await dl.redrive(T1, q("dlq"), q("dlq"), 10)
    with pytest.raises(QueueNotFound):
        await dl.redrive(T1, q("dlq"), q("missing"), 10)


async def test_redrive_keeps_fifo_groups_in_order(store: Backend, clock: ManualClock) -> None:
    dl = capable(store)
    await dead_letter(store, clock, ["g1", "g2"], ordering="fifo", group_id="g")
    assert await dl.redrive(T1, q("dlq"), q("orders"), 10) == 2
    [first] = await store.receive(T1, q("orders"), 10)  # one in flight per group
    assert (first.body, first.group_id) == (b"g1", "g")
    await store.ack(T1, [first.receipt])
    [second] = await store.receive(T1, q("orders"), 10)
    assert second.body == b"g2"


async def test_redrive_stops_at_a_full_target(store: Backend, clock: ManualClock) -> None:
    dl = capable(store)
    await dead_letter(store, clock, ["a", "b", "c"])
    await store.update_queue(T1, q("orders"), {"max_messages": 2})
    assert await dl.redrive(T1, q("dlq"), q("orders"), 10) == 2
    assert (await store.get_queue(T1, q("dlq"))).stats.visible == 1


async def test_storage_usage(store: Backend) -> None:
    assert isinstance(store, StorageStats), "this backend kind reports no local storage use"
    before = await store.storage_usage()
    await store.create_queue(T1, q("big"), {"max_message_bytes": 1048576})
    await store.send(T1, q("big"), [msg(os.urandom(200_000)) for _ in range(5)])
    after = await store.storage_usage()
    assert after.used_bytes >= before.used_bytes + 1_000_000
    assert 0 < after.used_ratio < 1 and after.map_size <= after.max_map_size


_CHILD = """
import asyncio, sys
from backend_store import StoreOptions, open_backend, TenantId, QueueName

async def main():
    store = open_backend(sys.argv[1], StoreOptions(sweep_interval_s=0))
    await store.start()
    print("ready", flush=True)
    while await store.redrive(TenantId("tenant-one"), QueueName("dlq"), QueueName("orders"), 3):
        pass
    print("done", flush=True)

asyncio.run(main())
"""


def test_redrive_killed_half_way_moves_each_message_once(tmp_path: Path) -> None:
    # A sync test with plain subprocess, as test_crash.py does (see there why).
    url = f"lmdb://{tmp_path / 'store'}"
    asyncio.run(_fill_dead_letters(url))
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, url],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
        start_new_session=True,
    )
    assert child.stdout is not None
    with child.stdout:
        assert child.stdout.readline().strip() == "ready"
        moved_before_kill = asyncio.run(_kill_once_some_moved(url, child))
    assert child.returncode == -signal.SIGKILL
    dlq_all, orders_all = asyncio.run(_drain_both(url))
    assert 0 < moved_before_kill <= len(orders_all) < 3000, "the child was not killed half-way"
    assert len(dlq_all) + len(orders_all) == 3000
    assert dlq_all.isdisjoint(orders_all)
    assert dlq_all | orders_all == {f"m{i}".encode() for i in range(3000)}


async def _fill_dead_letters(url: str) -> None:
    store = open_backend(url, StoreOptions(sweep_interval_s=0))
    await store.start()
    try:
        await store.create_queue(T1, q("dlq"), {})
        await store.create_queue(T1, q("orders"), {})
        for start in range(0, 3000, 100):
            await store.send(T1, q("dlq"), [msg(f"m{i}") for i in range(start, start + 100)])
    finally:
        await store.close()


async def _kill_once_some_moved(url: str, child: subprocess.Popen[str]) -> int:
    store = open_backend(url, StoreOptions(sweep_interval_s=0))
    await store.start()
    try:
        deadline = time.monotonic() + scaled(30)
        while (moved := (await store.get_queue(T1, q("orders"))).stats.visible) == 0:
            assert time.monotonic() < deadline, "the child moved nothing"
        os.killpg(child.pid, signal.SIGKILL)
        child.wait(scaled(10))
        return moved
    finally:
        await store.close()


async def _drain_both(url: str) -> tuple[set[bytes], set[bytes]]:
    store = open_backend(url, StoreOptions(sweep_interval_s=0))
    await store.start()
    try:
        return await _all_bodies(store, "dlq"), await _all_bodies(store, "orders")
    finally:
        await store.close()


async def _all_bodies(store: Backend, queue: str) -> set[bytes]:
    """Every body of a queue, by receiving them all (each exactly once: a list, not a set, is checked)."""
    bodies: list[bytes] = []
    while batch := await store.receive(T1, q(queue), 1000, visibility_timeout_s=3600):
        bodies.extend(m.body for m in batch)
    assert len(bodies) == len(set(bodies)), f"duplicates in {queue}"
    return set(bodies)
