"""Replication of one partition between replica stores over the node protocol.

A layer on top of the store, which knows no peers (:class:`~backend_store.backend.ReplicaStore`):

- :class:`ReplicationLeader` runs on the partition's leader. For each follower it is given
  a connection to, it ships committed log entries in order (``Replicate``, tagged with the
  leader's epoch), keeps a bounded window in flight, and tracks the LSN each follower has
  acknowledged after its own fsync. :meth:`ReplicationLeader.replicate` is what a write
  waits on: in ``sync`` mode until a majority of the replica set, the leader's own fsynced
  log included, holds the LSN; in ``async`` mode not at all (lag is measured instead).
- :class:`ReplicationFollower` runs on a follower: it reports its position (its last LSN),
  applies shipments in LSN order (those queued while one commits go together in the next
  commit) and acknowledges after its fsync, or
  refuses it with ``stale_epoch`` (the sender was deposed) or ``replication_gap`` (the
  leader resends from the position the refusal carries).

A follower whose missing entries the leader has already trimmed is marked
``needs_snapshot``; re-seeding it from a snapshot is the node's job (not built yet). So is
dialling: the caller opens the connections and hands them over, and reconnects.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from enum import StrEnum

from ..backend import ReplicaStore
from ..errors import ReplicationGap, StaleEpoch, Unavailable
from ..types import Epoch, LogEntry, Lsn
from .connection import Closed, Connection
from .stream import NodeStream
from .wire import NO_EPOCH, NO_LSN, Replicate, Replicated

log = logging.getLogger("pushgate.cluster")


class ReplicationMode(StrEnum):
    SYNC = "sync"
    ASYNC = "async"


@dataclass(slots=True)
class FollowerProgress:
    """What the leader knows of one follower."""

    node_id: str
    acked: Lsn = NO_LSN  # fsynced by the follower
    sent: Lsn = NO_LSN  # shipped, maybe not yet applied
    connected: bool = False
    positioned: bool = False  # its position report has arrived on this connection
    needs_snapshot: bool = False
    wake: asyncio.Event = field(default_factory=asyncio.Event)


class ReplicationLeader:
    def __init__(
        self,
        store: ReplicaStore,
        *,
        partition: int,
        epoch: Epoch,
        replicas: int,
        node_id: str,
        mode: ReplicationMode = ReplicationMode.SYNC,
        batch_entries: int = 256,
        window_entries: int = 2048,
    ) -> None:
        self.store = store
        self.partition = partition
        self.epoch = epoch
        self.replicas = replicas
        self.node_id = node_id
        self.mode = mode
        self.batch_entries = batch_entries
        self.window_entries = window_entries
        self.followers: dict[str, FollowerProgress] = {}
        # Set when a follower refuses us with a newer epoch: stop taking writes.
        self.deposed = asyncio.Event()
        self.newer_epoch: Epoch | None = None
        self._waiters: list[tuple[Lsn, asyncio.Future[None]]] = []

    async def start(self) -> None:
        """Start this term in storage (entries written from now on carry the epoch)."""
        await self.store.raise_epoch(self.epoch)

    # What writes wait on -------------------------------------------------------

    @property
    def majority(self) -> int:
        return self.replicas // 2 + 1

    @property
    def committed_lsn(self) -> Lsn:
        """The highest LSN a majority of the replica set holds (the leader's log counts)."""
        held = sorted([self.store.last_lsn, *(p.acked for p in self.followers.values())], reverse=True)
        held += [NO_LSN] * (self.replicas - len(held))
        return held[self.majority - 1]

    def lag(self) -> dict[str, int]:
        """Entries each follower has not acknowledged yet."""
        last = self.store.last_lsn
        return {p.node_id: last - p.acked for p in self.followers.values()}

    async def replicate(self, lsn: Lsn, timeout_s: float = 5.0) -> None:
        """After a local commit of ``lsn``: ship it; in sync mode, wait for a majority.

        Raises :class:`StaleEpoch` once deposed, :class:`Unavailable` when no majority
        acknowledged in time (the write is on the leader's disk but not promised).
        """
        if self.deposed.is_set():
            raise StaleEpoch(f"partition {self.partition}: epoch {self.epoch} was superseded")
        self.notify()
        if self.mode is ReplicationMode.ASYNC or self.committed_lsn >= lsn:
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((lsn, future))
        try:
            await asyncio.wait_for(asyncio.shield(future), timeout_s)
        except TimeoutError:
            raise Unavailable(
                f"partition {self.partition}: LSN {lsn} not on a majority within {timeout_s:g}s"
            ) from None
        finally:
            with contextlib.suppress(ValueError):
                self._waiters.remove((lsn, future))

    def notify(self) -> None:
        """New entries were committed locally: wake every follower's sender."""
        for progress in self.followers.values():
            progress.wake.set()

    def _settle_waiters(self) -> None:
        committed = self.committed_lsn
        for lsn, future in self._waiters:
            if lsn <= committed and not future.done():
                future.set_result(None)

    def _depose(self, epoch: Epoch) -> None:
        if not self.deposed.is_set():
            log.warning("partition %d: deposed by epoch %d (ours %d)", self.partition, epoch, self.epoch)
        self.newer_epoch = epoch
        self.deposed.set()
        error = StaleEpoch(f"partition {self.partition}: epoch {self.epoch} was superseded by {epoch}")
        for _, future in self._waiters:
            if not future.done():
                future.set_exception(error)

    # One follower's link ---------------------------------------------------------

    async def follow(
        self, follower_id: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """Replicate to one follower over a connection the caller opened, until it closes."""
        progress = self.followers.setdefault(follower_id, FollowerProgress(follower_id))
        stream = NodeStream(Connection(self.node_id), reader, writer)
        progress.connected, progress.positioned = True, False
        sender = asyncio.create_task(
            self._ship(progress, stream), name=f"replicate p{self.partition}->{follower_id}"
        )
        try:
            async for event in stream.events():
                if isinstance(event, Replicated) and event.partition == self.partition:
                    self._on_reply(progress, event)
                elif isinstance(event, Closed):
                    log.info("partition %d: link to %s closed (%s)", self.partition, follower_id, event.code)
        finally:
            progress.connected = False
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sender
            await stream.close()

    def _on_reply(self, progress: FollowerProgress, reply: Replicated) -> None:
        if reply.code == "stale_epoch":
            if reply.epoch > self.epoch:
                self._depose(reply.epoch)
            return
        if reply.code == "replication_gap" or not progress.positioned:
            # A position report, or "I can vouch for my log only up to here": ship from
            # there. Only acknowledgements of what this leader shipped count as held: a
            # reported position may include a deposed leader's entries.
            progress.positioned = True
            progress.sent = min(reply.lsn, self.store.last_lsn)
            progress.acked = min(progress.acked, progress.sent)
        elif reply.code is None:
            # Capped at what we shipped: beyond it the follower may hold a deposed tail.
            progress.acked = max(progress.acked, min(reply.lsn, progress.sent))
        progress.wake.set()
        self._settle_waiters()

    async def _ship(self, progress: FollowerProgress, stream: NodeStream) -> None:
        conn = stream.connection
        while not conn.closed and not self.deposed.is_set():
            progress.wake.clear()
            backlog = self.store.last_lsn - progress.sent
            in_flight = progress.sent - progress.acked
            if progress.positioned and backlog > 0 and in_flight < self.window_entries:
                # From the entry at ``sent`` (the follower's last, sent as prev for log matching).
                after = max(0, progress.sent - 1)
                entries = await self.store.read_replication_log(Lsn(after), self.batch_entries + 1)
                prev = (NO_LSN, NO_EPOCH)
                if progress.sent > 0 and entries and entries[0].lsn == progress.sent:
                    prev = (entries[0].lsn, entries[0].epoch)
                    entries = entries[1:]
                # (A prev that is no longer in the log is old, committed history: sent unchecked.)
                if not entries or entries[0].lsn != progress.sent + 1:
                    progress.needs_snapshot = True
                    log.warning(
                        "partition %d: %s needs LSN %d, trimmed here: re-seed it from a snapshot",
                        self.partition,
                        progress.node_id,
                        progress.sent + 1,
                    )
                    return
                conn.replicate(self.partition, self.epoch, entries, self.committed_lsn, prev)
                stream.flush()
                progress.sent = entries[-1].lsn
                await stream.drain()
                continue
            await progress.wake.wait()


class ReplicationFollower:
    def __init__(self, store: ReplicaStore, *, partition: int, node_id: str) -> None:
        self.store = store
        self.partition = partition
        self.node_id = node_id

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Take one leader connection (an ``asyncio.start_server`` callback) until it closes.

        Shipments that arrive while one is being applied are applied together in the next
        commit (group commit on the follower: one fsync for all of them) and acknowledged
        with one reply.
        """
        stream = NodeStream(Connection(self.node_id), reader, writer)
        conn = stream.connection
        # Our position first: the leader ships from there.
        conn.replicated(self.partition, self.store.epoch, self.store.last_lsn)
        stream.flush()
        queued: asyncio.Queue[Replicate] = asyncio.Queue()
        applier = asyncio.create_task(self._apply_queued(queued, stream), name=f"apply p{self.partition}")
        try:
            async for event in stream.events():
                if isinstance(event, Replicate) and event.partition == self.partition:
                    queued.put_nowait(event)
        finally:
            applier.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await applier
            await stream.close()

    async def _apply_queued(self, queued: asyncio.Queue[Replicate], stream: NodeStream) -> None:
        while True:
            shipments = [await queued.get()]
            while not queued.empty():
                shipments.append(queued.get_nowait())
            # One connection carries one leader's term and contiguous shipments: the first
            # one's prev checks them all.
            first = shipments[0]
            entries = [entry for shipment in shipments for entry in shipment.entries]
            epoch, lsn, code = await self._apply(
                entries, shipments[-1].epoch, first.prev_lsn, first.prev_epoch
            )
            if stream.connection.closed:
                return
            stream.connection.replicated(self.partition, epoch, lsn, code)
            stream.flush()

    async def _apply(
        self, entries: list[LogEntry], epoch: Epoch, prev_lsn: Lsn, prev_epoch: Epoch
    ) -> tuple[Epoch, Lsn, str | None]:
        store = self.store
        try:
            if prev_lsn > store.last_lsn:
                raise ReplicationGap(f"missing entries before {prev_lsn}")
            if prev_epoch and prev_lsn and await self._epoch_at(prev_lsn) not in (prev_epoch, None):
                # Diverged at prev: vouch only for what comes before it; the leader steps back.
                return store.epoch, Lsn(prev_lsn - 1), "replication_gap"
            entries = await self._drop_held(entries, epoch)
            lsn = await store.apply_replicated(entries, epoch)
        except StaleEpoch:
            return store.epoch, store.last_lsn, "stale_epoch"
        except ReplicationGap:
            return store.epoch, store.last_lsn, "replication_gap"
        return store.epoch, lsn, None

    async def _drop_held(self, entries: list[LogEntry], epoch: Epoch) -> list[LogEntry]:
        """Skip entries this replica already holds; truncate at the first one that conflicts.

        As in Raft: same LSN and epoch means the same entry (one leader per epoch); another
        epoch means this replica holds a deposed leader's unacknowledged tail.
        """
        last = self.store.last_lsn
        if not entries or entries[0].lsn > last:
            return entries
        held = {
            e.lsn: e.epoch
            for e in await self.store.read_replication_log(Lsn(entries[0].lsn - 1), last - entries[0].lsn + 1)
        }
        skip = 0
        for entry in entries:
            # An entry no longer in our log (trimmed) is old, agreed history.
            if entry.lsn > last or held.get(entry.lsn, entry.epoch) != entry.epoch:
                break
            skip += 1
        rest = entries[skip:]
        if rest and rest[0].lsn <= last:
            dropped = await self.store.truncate_after(Lsn(rest[0].lsn - 1), epoch)
            log.warning(
                "partition %d: dropped %d entries a deposed leader wrote after LSN %d",
                self.partition,
                dropped,
                rest[0].lsn - 1,
            )
        return rest

    async def _epoch_at(self, lsn: Lsn) -> Epoch | None:
        """The epoch of our entry at ``lsn`` (None: trimmed from our log)."""
        entries = await self.store.read_replication_log(Lsn(lsn - 1), 1)
        return entries[0].epoch if entries and entries[0].lsn == lsn else None
