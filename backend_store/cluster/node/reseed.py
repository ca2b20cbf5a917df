"""Installing a leader's snapshot as a follower's LMDB store (re-seeding).

The follower streams the snapshot into a staging directory beside its store; installing
closes the old store, moves the staged copy into its place and opens it. The copy carries
the leader's data, log and fence, so the follower then reports the copy's last LSN as its
position and catches up from the leader's log.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

from ...backend import ReplicaStore
from ...lmdb_store.engine import LmdbBackend
from ...options import StoreOptions


class LmdbReseeder:
    """Where a follower stages a snapshot, and how it swaps it in (pass both to
    :class:`~.replication.ReplicationFollower`)."""

    def __init__(self, path: Path, options: StoreOptions) -> None:
        self.path = path
        self.options = options

    @property
    def staging(self) -> Path:
        return self.path.with_name(self.path.name + ".incoming")

    async def install(self, old: ReplicaStore, staged: Path) -> ReplicaStore:
        if isinstance(old, LmdbBackend):
            await old.close()
        await asyncio.to_thread(self._swap, staged)
        store = LmdbBackend(self.path, self.options)
        await store.start()
        return store

    def _swap(self, staged: Path) -> None:
        retired = self.path.with_name(self.path.name + ".retired")
        shutil.rmtree(retired, ignore_errors=True)
        if self.path.exists():
            self.path.rename(retired)
        staged.rename(self.path)
        shutil.rmtree(retired, ignore_errors=True)
