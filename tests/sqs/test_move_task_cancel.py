"""A move task cancelled while its gateway is moving a chunk stops (gateway/sqs/move_tasks.py).

Found when the test gateway's requests stopped waiting 40 ms each (session 47):
``test_a_cancelled_move_task_stops_and_moved_messages_stay_moved`` saw its task end
``COMPLETED``. The cancel was written into the task's record while the runner was moving a
chunk, and the runner's own write of its progress then put ``RUNNING`` back over it. Here
the interleaving is made on purpose, on a real embedded store: the runner's first chunk
waits until the cancel has been answered.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from backend_store.lmdb_store.engine import LmdbBackend
from backend_store.options import StoreOptions
from backend_store.types import NewMessage, QueueName, TenantId
from gateway.sqs.move_tasks import CANCELLED, MoveTasks

T = TenantId("t")
DLQ, TARGET = QueueName("dlq"), QueueName("target")
MESSAGES = 6


class FirstChunkWaits:
    """The store, with the first redrive held until ``go`` is set (``entered`` says it began)."""

    def __init__(self, store: LmdbBackend) -> None:
        self._store = store
        self.entered = asyncio.Event()
        self.go = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def redrive(self, tenant: TenantId, queue: QueueName, to: QueueName, max_messages: int) -> int:
        if not self.entered.is_set():
            self.entered.set()
            await self.go.wait()
        return await self._store.redrive(tenant, queue, to, max_messages)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[LmdbBackend]:
    backend = LmdbBackend(tmp_path / "store", StoreOptions(sweep_interval_s=0))
    await backend.start()
    try:
        yield backend
    finally:
        await backend.close()


async def test_a_cancel_during_a_chunk_stops_the_task(store: LmdbBackend) -> None:
    for queue in (DLQ, TARGET):
        await store.create_queue(T, queue, {})
    await store.send(T, DLQ, [NewMessage(f"m{i}".encode()) for i in range(MESSAGES)])
    held = FirstChunkWaits(store)
    tasks = MoveTasks(held)  # the store's Backend, one method wrapped
    task = await tasks.start(T, DLQ, TARGET, rate=1, to_move=MESSAGES)
    await asyncio.wait_for(held.entered.wait(), 10)
    cancelled = await tasks.cancel(T, task.handle)
    assert cancelled.status == "CANCELLING"
    assert [t.status for t in await tasks.list(T, DLQ)] == ["CANCELLING"]
    held.go.set()

    for _ in range(200):  # 10 s; the runner looks for the cancel after its first chunk's second
        status = (await tasks.list(T, DLQ))[0].status
        if status != "CANCELLING":
            break
        await asyncio.sleep(0.05)
    assert status == CANCELLED
    [listed] = await tasks.list(T, DLQ)
    assert listed.moved == 1, "the chunk under way when the cancel came, and no more"
    moved = (await store.get_queue(T, TARGET)).stats.visible
    left = (await store.get_queue(T, DLQ)).stats.visible
    assert (moved, left) == (1, MESSAGES - 1)
