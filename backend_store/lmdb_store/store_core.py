"""What every role of the embedded store shares (:class:`StoreCore`).

The embedded store (:class:`~backend_store.lmdb_store.engine.LmdbBackend`) plays several
roles, each in a module of its own that reads alone: the :class:`~backend_store.backend.Backend`
(queues, messages, its life cycle: ``engine.py``), standing receives (``demands.py``), the
metadata store (``metadata.py``), the :class:`~backend_store.backend.ReplicaStore` a backend
node uses (``replica.py``), the sweeper (``sweeper.py``) and the hand-over of receives held in
memory between processes (``hold_hand_over.py``). Each is a class on this core, and
``LmdbBackend`` is all of them: one object, one environment, one writer.

The core is the environment, the one writer and the replication log, and the two ways in: a
write runs as an operation of the writer's next batch (one transaction, one fsync), a read in a
short read transaction on a worker thread. Nothing waits on LMDB on the event loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from ..errors import Unavailable
from ..options import StoreOptions
from .environment import Environment, View, Writes
from .group_commit import GroupCommitWriter
from .message_ops import MessageOps
from .replication_log import ReplicationLog

T = TypeVar("T")


class StoreCore:
    """The environment, the writer and the replication log of one store, and its message
    operations (``message_ops.py``, which hold the receives held in memory)."""

    def __init__(self, path: Path, options: StoreOptions) -> None:
        self.path = path
        self.options = options
        self._clock: Callable[[], float] = options.clock or time.time
        self._ops = MessageOps(options.keyring, options.max_held)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._env: Environment | None = None
        self._writer: GroupCommitWriter | None = None
        self._replication_log = ReplicationLog(options.replication_log_keep)
        # The room sends may not use (room.py), set as the store opens (0: none); it bounds
        # the journal and a follower's commits.
        self._reserve = 0

    def _require_env(self) -> Environment:
        if self._env is None:
            raise Unavailable("store is not started")
        return self._env

    async def _write(self, op: Callable[[Writes, float], T], *, durable: bool = True) -> T:
        if self._writer is None:
            raise Unavailable("store is not started")
        return await self._writer.submit(op, durable=durable)

    async def _read(self, fn: Callable[[View], T]) -> T:
        env = self._require_env()
        return await asyncio.to_thread(env.read, lambda txn: fn(View(txn, env.dbs)))
