"""The embedded store as one partition replica of a backend node: the
:class:`~backend_store.backend.ReplicaStore` surface, the replica's label and the writer's
counts. The store itself knows no peers: the node's replication layer
(``backend_store/cluster/replication/``) calls these."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Sequence
from pathlib import Path

from ..errors import Unavailable
from ..types import Epoch, LogEntry, Lsn
from .environment import Db, Writes
from .replication_log import ReplicationLog
from .store_core import StoreCore

# A cluster replica's label (its cluster id and partition, docs/cluster.md "Cluster identity"):
# outside the logged writes, like the format mark.
_REPLICA_LABEL = b"\0sys\0replica_label"


class ReplicaRole(StoreCore):
    """Its log, epoch and snapshots, for a node's leader and followers."""

    async def replica_label(self) -> bytes | None:
        """What a cluster node wrote with :meth:`set_replica_label` (None: nothing yet)."""
        return await self._read(lambda v: v.get(Db.META, _REPLICA_LABEL))

    async def set_replica_label(self, value: bytes) -> None:
        """Keep a cluster replica's label (its cluster id and partition) in this store,
        outside the replicated log: each replica keeps its own (a re-seed copies the
        leader's, which names the same cluster and partition)."""

        def put(w: Writes, now: float) -> None:
            w.txn.put(_REPLICA_LABEL, value, db=w.dbs[Db.META])

        await self._write(put)

    @property
    def last_lsn(self) -> Lsn:
        return self._replication_log.last_lsn

    @property
    def epoch(self) -> Epoch:
        return self._replication_log.epoch

    @property
    def last_entry(self) -> tuple[Lsn, Epoch | None]:
        last, _, entry_epoch = self._replication_log.published
        return last, entry_epoch

    async def read_replication_log(self, after: Lsn, limit: int = 1000) -> list[LogEntry]:
        """Committed entries after ``after``, oldest first."""
        return await self._read(lambda v: ReplicationLog.read(v.txn, v.dbs, after, limit))

    async def first_retained_lsn(self) -> Lsn | None:
        return await self._read(lambda v: ReplicationLog.first_lsn(v.txn, v.dbs))

    async def apply_replicated(self, entries: Sequence[LogEntry], epoch: Epoch | None = None) -> Lsn:
        """Apply a leader's entries (followers only); return the new last LSN.

        Where the store has a reserve of room (room.py), in commits that each write at most
        half of it, and an entry a commit once short of room. The leader committed each
        entry alone, refused sends that would leave it less than its reserve, and short of
        room reused between commits the pages the one before freed. One commit of a lagging
        follower's backlog (a shipment holds up to 256 entries) needs room for every page
        they write at once, as LMDB reuses no page its own transaction freed: on a disk the
        leader still had room on, that commit failed at every retry, growing the file into
        the last free block on the way, until the leader trimmed its log past the follower
        (session 75, tests/cluster/test_follower_room.py). Short of room, the follower
        commits as the leader did (half the reserve a commit alone failed that test: pages
        hold more than the bytes counted); with room to spare (twice the reserve), half the
        reserve a commit grows the file well within it.
        """
        max_bytes = self._reserve // 2 or None
        rest = list(entries)
        while True:
            last = await self._write(functools.partial(self._apply_some, rest, epoch, max_bytes))
            rest = rest[last - rest[0].lsn + 1 :] if rest else rest
            if not rest:
                return last

    def _apply_some(
        self, entries: list[LogEntry], epoch: Epoch | None, max_bytes: int | None, w: Writes, now: float
    ) -> Lsn:
        return self._replication_log.apply(w, entries, epoch, max_bytes)

    async def raise_epoch(self, epoch: Epoch) -> Epoch:
        return await self._write(lambda w, now: self._replication_log.raise_epoch(w, epoch))

    async def truncate_after(self, lsn: Lsn, epoch: Epoch | None = None) -> int:
        return await self._write(lambda w, now: self._replication_log.truncate_after(w, lsn, epoch))

    def ship_early(
        self, offer: Callable[[LogEntry], None] | None, lost: Callable[[Lsn], None] | None
    ) -> None:
        """Hand each logged entry to ``offer`` just before its commit, from the writer thread
        (a leader ships it while it fsyncs); ``lost(lsn)`` if that commit then fails. None
        stops it."""
        writer = self._writer
        if writer is None:
            raise Unavailable("store is not started")
        writer.offer, writer.lost = offer, lost

    def hold_log_from(self, lsn: Lsn | None) -> None:
        self._replication_log.follower_floor = lsn

    async def snapshot(self, target: Path) -> None:
        """Write a consistent copy of the environment to ``target`` (for re-seeding and backups)."""
        env = self._require_env()
        await asyncio.to_thread(env.copy_to, target)

    @property
    def stats(self) -> dict[str, int]:
        writer = self._writer
        return {
            "batches": writer.batches if writer else 0,
            "operations": writer.operations if writer else 0,
            "last_lsn": self.last_lsn,
            "epoch": self.epoch,
        }
