"""Queue records created together: the creates of the moment in one etcd transaction.

A gateway creating queues one etcd transaction each, then reading each key back for its
revisions, paid two round trips to etcd per queue, and every watcher of ``queues/`` (each
node, manager and gateway) took one state per queue (issue 49: 15 creates a second at
10,000 queues). Here a create that comes while a transaction is in flight waits for it and
goes in the next one with every other create waiting (up to :data:`MOST_PER_TRANSACTION`):
one round trip and one revision for all of them, which is each new key's create and mod
revision, so nothing is read back. One create alone goes at once, as before.

etcd refuses the whole transaction when one of its keys exists; it then says which do
(:meth:`~..coordination.coordinator.Coordinator.create_many`): those creates answer 0 (the
caller reads the record, as for a refused create), and the others go again in the next
transaction. Two creates of one key at once go in different transactions (etcd refuses a
key twice in one): the second finds the first's record.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

from ..coordination.coordinator import Coordinator

# etcd's default --max-txn-ops is 128 (compares and puts each count): well inside it, and
# under its 1.5 MiB request limit at ~330 bytes a record.
MOST_PER_TRANSACTION = 64


@dataclass(slots=True)
class _Create:
    key: str
    value: bytes
    answer: asyncio.Future[int]


class RecordCreates:
    """Creates of absent keys, many to an etcd transaction (see the module docstring)."""

    def __init__(self, coordinator: Coordinator, *, most: int = MOST_PER_TRANSACTION) -> None:
        self.coordinator = coordinator
        self.most = most
        self._waiting: list[_Create] = []
        self._running: asyncio.Task[None] | None = None

    async def create(self, key: str, value: bytes) -> int:
        """Write ``key`` if it is absent: the revision it was written at, 0 if it exists."""
        create = _Create(key, value, asyncio.get_running_loop().create_future())
        self._waiting.append(create)
        if self._running is None or self._running.done():
            self._running = asyncio.create_task(self._run(), name="queue record creates")
        return await create.answer

    async def _run(self) -> None:
        while self._waiting:
            batch: dict[str, _Create] = {}
            later: list[_Create] = []
            for create in self._waiting:
                if create.answer.done():
                    continue  # its caller was cancelled
                if create.key in batch or len(batch) >= self.most:
                    later.append(create)
                else:
                    batch[create.key] = create
            self._waiting = later
            if batch:
                await self._write(batch)

    async def _write(self, batch: dict[str, _Create]) -> None:
        try:
            revision, present = await self.coordinator.create_many({k: c.value for k, c in batch.items()})
        except Exception as exc:  # etcd unreachable: every create of the batch fails alike
            for create in batch.values():
                _answer(create, exc)
            return
        if revision or not present:
            # Written; or refused with none present (one deleted meanwhile): each caller
            # reads its record, as after a refused create, and tries again.
            for create in batch.values():
                _answer(create, revision)
            return
        for key in present:
            _answer(batch[key], 0)
        self._waiting[:0] = [c for k, c in batch.items() if k not in present]


def _answer(create: _Create, result: int | Exception) -> None:
    with contextlib.suppress(asyncio.InvalidStateError):  # its caller was cancelled
        if isinstance(result, Exception):
            create.answer.set_exception(result)
        else:
            create.answer.set_result(result)
