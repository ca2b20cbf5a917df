"""Replication of one partition between replica stores over the node protocol.

A layer on top of the store, which knows no peers (:class:`~backend_store.backend.ReplicaStore`):

- :class:`ReplicationLeader` runs on the partition's leader. For each follower it is given
  a connection to, it ships log entries in order (``Replicate``, tagged with the leader's
  epoch; the newest ones as the store's writer offers them, before the leader's own commit,
  so both fsyncs run at once), keeps a bounded window in flight, and tracks the LSN each
  follower has acknowledged after its own fsync. :meth:`ReplicationLeader.replicate` is what
  a write waits on: in ``sync`` mode until a majority of the replica set (the leader's own
  fsynced log counts, but need not be part of it) holds the LSN; in ``async`` mode not at
  all (lag is measured instead).
- :class:`ReplicationFollower` runs on a follower: it reports its position (its last LSN),
  applies shipments in LSN order (those queued while one commits go together in the next
  commit) and acknowledges after its fsync, or
  refuses it with ``stale_epoch`` (the sender was deposed) or ``replication_gap`` (the
  leader resends from the position the refusal carries).

A follower whose missing entries the leader has already trimmed is re-seeded: the leader
streams a consistent copy of its store (``SnapshotChunk``), holding its log from that
point, the follower installs it (:class:`~.reseed.LmdbReseeder`) and reports its new
position, and catch-up goes on from the log. :meth:`ReplicationLeader.maintain` dials a
follower and re-dials it when the link breaks (or the caller hands over connections it
opened itself, :meth:`ReplicationLeader.follow`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import shutil
import ssl
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import BinaryIO

from ...backend import ReplicaStore
from ...errors import PushgateError, ReplicationGap, StaleEpoch, Unavailable
from ...types import Epoch, LogEntry, Lsn
from ..protocol.connection import Closed, Connection, ConnectionClosedError, Event
from ..protocol.stream import NodeStream
from ..protocol.wire import NO_EPOCH, NO_LSN, Replicate, Replicated, SnapshotChunk
from .commit_waiters import CommitWaiters
from .quorum import QuorumCheck

# Snapshot chunks stay well under the default frame limit (16 MiB).
SNAPSHOT_CHUNK = 1024 * 1024
# Installs a leader's snapshot (a directory holding it) in place of the old store.
InstallSnapshot = Callable[[ReplicaStore, Path], Awaitable[ReplicaStore]]
# A connection to a follower's node, opened by ``maintain``'s caller (TCP, with TLS when
# asked, for a node process; the simulated network in the simulation).
Streams = tuple[asyncio.StreamReader, asyncio.StreamWriter]
Connect = Callable[[], Awaitable[Streams]]
# Entries a leader ships to a follower before hearing back (``ReplicationLeader``).
WINDOW_ENTRIES = 2048

log = logging.getLogger("pushgate.cluster")


class ReplicationMode(StrEnum):
    SYNC = "sync"
    ASYNC = "async"


@dataclass(slots=True)
class FollowerProgress:
    """What the leader knows of one follower.

    Two measures of where the follower is, for two uses: ``acked`` is what counts towards a
    majority (entries this leader shipped and the follower fsynced: never a reported
    position, which may include a deposed leader's entries), ``answered`` is where the
    follower's latest answer on this link put it, what the shipping window counts from. A
    follower the leader knows nothing of (a new term, or one forgotten while it was down)
    has acknowledged nothing, yet once it reports LSN 2470 nothing below that is in flight:
    counted from ``acked``, a position past the window let nothing go, and under steady
    writes no idle heartbeat came to move it (issue 24, the random-fault test's seed 2)."""

    node_id: str
    acked: Lsn = NO_LSN  # fsynced by the follower
    sent: Lsn = NO_LSN  # shipped, maybe not yet applied
    answered: Lsn = NO_LSN  # where its latest answer on this link put it (<= sent)
    connected: bool = False
    positioned: bool = False  # its position report has arrived on this connection
    needs_snapshot: bool = False
    snapshots_sent: int = 0
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    # The newest shipment that reached the end of our log: its last LSN and when it went.
    tail_sent: Lsn = NO_LSN
    tail_sent_at: float = float("-inf")
    # When the end of our log as of then was last acknowledged (in sync since: in_sync()).
    caught_up_at: float = float("-inf")

    @property
    def in_flight(self) -> int:
        """Entries shipped on this link that the follower has not answered for yet."""
        return self.sent - self.answered

    def ship_from(self, lsn: Lsn) -> None:
        """The follower said where to ship from (its position report, or a refusal that
        vouches for its log only up to ``lsn``): nothing past it is held for us, nothing
        before it is in flight."""
        self.positioned = True
        self.sent = self.answered = lsn
        self.acked = min(self.acked, lsn)

    def acknowledge(self, lsn: Lsn) -> None:
        """The follower fsynced what we shipped up to ``lsn`` (capped at what we shipped:
        beyond it the follower may hold a deposed leader's tail)."""
        held = min(lsn, self.sent)
        self.acked = max(self.acked, held)
        self.answered = max(self.answered, held)


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
        window_entries: int = WINDOW_ENTRIES,
        heartbeat_s: float = 0.5,
        quorum: QuorumCheck | None = None,
        clock: Callable[[], float] = time.monotonic,
        voters: Collection[str] | None = None,
    ) -> None:
        """``quorum``: told of every follower reply (check-quorum: the node asks it whether
        this leader still hears from a majority); ``clock`` is what it is told the time by.
        ``voters``: the node ids whose acknowledgements count towards a majority (others it
        ships to are learners); None: every follower counts, out of ``replicas``."""
        self.store = store
        self.quorum = quorum
        self.clock = clock
        self.heartbeat_s = heartbeat_s
        self.partition = partition
        self.epoch = epoch
        self.replicas = replicas
        self.node_id = node_id
        self.mode = mode
        self.batch_entries = batch_entries
        self.window_entries = window_entries
        self.followers: dict[str, FollowerProgress] = {}
        self.voters: tuple[str, ...] | None = None
        # The voting set a majority of which holds every write acknowledged (settled_voters),
        # and the one adopted since, with the last LSN when it was (settled once committed).
        self._settled: tuple[str, ...] = ()
        self._adopted_from = NO_LSN
        self._committed = NO_LSN  # committed_lsn's high-water mark
        # Set when a follower refuses us with a newer epoch: stop taking writes.
        self.deposed = asyncio.Event()
        self.newer_epoch: Epoch | None = None
        # Set when this leader resigned for lack of a quorum: writes are no longer promised.
        self.resigned = False
        self._resigned_why = "no quorum"
        self._waiters = CommitWaiters(self._not_replicated)
        # Followers being re-seeded: the LSN their snapshot was taken at (log held from there).
        self._holds: dict[str, Lsn] = {}
        # The tip of the log as the store's writer offers it, before its own commit (oldest
        # first): shipped from here, so followers fsync while we do, not after.
        self._early: dict[Lsn, LogEntry] = {}
        if voters is not None:
            self.set_voters(voters)

    async def start(self) -> None:
        """Start this term in storage (entries written from now on carry the epoch), and
        take the store's entries as they are written, before their commit."""
        await self.store.raise_epoch(self.epoch)
        loop = asyncio.get_running_loop()

        def offer(entry: LogEntry) -> None:  # the writer thread
            with contextlib.suppress(RuntimeError):  # the loop closed: the node is stopping
                loop.call_soon_threadsafe(self._offered, entry)

        def lost(lsn: Lsn) -> None:  # the writer thread
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._lost, lsn)

        self.store.ship_early(offer, lost)

    def stop(self, why: str = "the term ended here") -> None:
        """This term is over here: stop taking entries from the store's writer, and fail every
        write still waiting for a majority with ``unavailable`` (outcome unknown) at once:
        with its links gone no acknowledgement can come, so it would only wait out its
        timeout."""
        with contextlib.suppress(Unavailable):  # a closed store takes no more entries anyway
            self.store.ship_early(None, None)
        self._early.clear()
        self._waiters.fail(
            lambda lsn: Unavailable(f"partition {self.partition}: LSN {lsn} not known on a majority; {why}")
        )

    def _offered(self, entry: LogEntry) -> None:
        if entry.epoch != self.epoch or self.deposed.is_set():
            return
        early = self._early
        early[entry.lsn] = entry
        # Keep what some follower may still be shipped from here (its ``sent`` is the prev of
        # its next shipment), at most a window; anything older is read from the log.
        floor = min((p.sent for p in self.followers.values()), default=entry.lsn)
        floor = max(floor, Lsn(entry.lsn - self.window_entries))
        while early and (first := next(iter(early))) < floor:
            del early[first]
        self.notify()

    def _lost(self, lsn: Lsn) -> None:
        """An entry shipped early did not commit here: followers may hold an LSN that this
        replica will write differently. This term must end (a new one fences the old entry
        off; followers then drop it as a deposed leader's tail)."""
        log.error(
            "partition %d: entry %d was shipped but did not commit here; ending term %d",
            self.partition,
            lsn,
            self.epoch,
        )
        self._depose(self.epoch)

    @property
    def _last_lsn(self) -> Lsn:
        """The newest entry we can ship: committed here, or offered by the writer."""
        last = self.store.last_lsn
        if self._early:
            last = max(last, next(reversed(self._early)))
        return last

    def _from_memory(self, sent: Lsn) -> list[LogEntry] | None:
        """The entry at ``sent`` (the prev) and up to a batch after it, if all are in the
        early buffer; None: read the log."""
        early = self._early
        if Lsn(sent + 1) not in early or (sent > 0 and sent not in early):
            return None
        out = [early[sent]] if sent > 0 else []
        lsn = Lsn(sent + 1)
        while lsn in early and len(out) <= self.batch_entries:
            out.append(early[lsn])
            lsn = Lsn(lsn + 1)
        return out

    # What writes wait on -------------------------------------------------------

    @property
    def majority(self) -> int:
        return self.replicas // 2 + 1

    @property
    def committed_lsn(self) -> Lsn:
        """The highest LSN a majority of the voters acknowledged in this term: it never goes
        back (Raft's commit index), though a follower's later position report may lower what
        it is counted as holding now (what a resignation vouches for must include every write
        acknowledged; the simulation's ``restore`` seed 1133 lost one that way)."""
        held = self._majority_holds()
        if held > self._committed:
            self._committed = held
        return self._committed

    def _majority_holds(self) -> Lsn:
        """The highest LSN a majority of the current voters holds now (the leader's log counts)."""
        voters = self.voters
        followers = [p for p in self.followers.values() if voters is None or p.node_id in voters]
        held = sorted([self.store.last_lsn, *(p.acked for p in followers)], reverse=True)
        held += [NO_LSN] * (self.replicas - len(held))
        return held[self.majority - 1]

    # Membership (docs/cluster.md, "Membership changes") ---------------------------

    def set_voters(self, voters: Collection[str]) -> None:
        """Count majorities over ``voters`` from now on (the partition record changed: a
        learner joined the voters, or a voter left). The set is *settled* once a majority
        of it holds everything written before it was adopted: only then may the manager
        take the next step (one voter at a time, each set's majorities overlapping the
        next's), as Raft commits a configuration entry before the next."""
        ordered = tuple(voters)
        if self.voters is not None and set(ordered) == set(self.voters):
            self.voters = ordered
            return
        self.voters = ordered
        self.replicas = len(ordered)
        self._adopted_from = self._last_lsn
        self._settle_waiters()

    def settled_voters(self) -> tuple[str, ...]:
        """The voting set a majority of which holds every write this leader acknowledged
        (empty until the first one settles: a term's own set settles once its first entries
        are on a majority of it)."""
        voters = self.voters
        if voters is not None and self._settled != voters and self._majority_holds() >= self._adopted_from:
            self._settled = voters
        return self._settled

    def in_sync(self, within_s: float) -> tuple[str, ...]:
        """The followers (voters and learners) that acknowledged the whole of our log as it
        was at some moment in the last ``within_s`` seconds (Kafka's in-sync replicas:
        caught up lately, so in contact and not lagging)."""
        now = self.clock()
        return tuple(sorted(p.node_id for p in self.followers.values() if now - p.caught_up_at <= within_s))

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
        if self.resigned:
            raise self._resigned_error(lsn)
        self.notify()
        if self.mode is ReplicationMode.ASYNC or self.committed_lsn >= lsn:
            return
        await self._waiters.wait(lsn, timeout_s)

    def _not_replicated(self, lsn: Lsn, timeout_s: float) -> Unavailable:
        return Unavailable(f"partition {self.partition}: LSN {lsn} not on a majority within {timeout_s:g}s")

    def notify(self) -> None:
        """New entries were committed or offered locally: wake each follower's sender that
        has something to ship now.

        Only those: a wake restarts an idle sender's wait for its heartbeat, and a committed
        read (or a write that wrote nothing) notifies too. Waking every link, a leader of an
        idle partition read more often than every heartbeat shipped its followers nothing,
        they answered nothing, and check-quorum gave its term up every 2 s, the next
        leader's too, for as long as the reads went on (issue 48; docs/cluster.md,
        "Heartbeats")."""
        for progress in self.followers.values():
            if self._has_entries_for(progress):
                progress.wake.set()

    def _has_entries_for(self, progress: FollowerProgress) -> bool:
        """Whether the sender of ``progress``'s link would ship entries now: the follower
        said where to ship from, our log goes past it, and the window has room."""
        backlog = self._last_lsn - progress.sent
        return progress.positioned and backlog > 0 and progress.in_flight < self.window_entries

    def _settle_waiters(self) -> None:
        self._waiters.settle(self.committed_lsn)

    def resign(self, why: str = "no quorum") -> None:
        """This term gives up (check-quorum, or a finished hand-over): fail every write still
        waiting for a majority with ``unavailable`` (its outcome is unknown: a follower may
        hold it and be promoted), at once rather than at its timeout, and every later one."""
        self.resigned = True
        self._resigned_why = why
        self._waiters.fail(self._resigned_error)

    def _resigned_error(self, lsn: Lsn) -> Unavailable:
        return Unavailable(
            f"partition {self.partition}: LSN {lsn} not on a majority; the leader resigned ({self._resigned_why})"
        )

    def _heard(self, follower_id: str) -> None:
        if self.quorum is not None:
            self.quorum.heard(follower_id, self.clock())

    def _depose(self, epoch: Epoch) -> None:
        if not self.deposed.is_set():
            log.warning("partition %d: deposed by epoch %d (ours %d)", self.partition, epoch, self.epoch)
        self.newer_epoch = epoch
        self.deposed.set()
        error = StaleEpoch(f"partition {self.partition}: epoch {self.epoch} was superseded by {epoch}")
        self._waiters.fail(lambda lsn: error)

    # One follower's link ---------------------------------------------------------

    async def follow(
        self, follower_id: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """Replicate to one follower over a connection the caller opened, until it closes."""
        progress = self.followers.setdefault(follower_id, FollowerProgress(follower_id))
        stream = NodeStream(Connection(self.node_id, partition=self.partition), reader, writer)
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
            try:
                await _stop(sender)
            finally:
                await stream.close()

    async def maintain(
        self,
        follower_id: str,
        connect: Connect,
        *,
        retry_s: float = 0.2,
        connect_timeout_s: float = 2.0,
    ) -> None:
        """Keep a link to one follower: dial (``connect``), replicate until the link breaks,
        dial again.

        Runs until cancelled or deposed. A follower that restarts is caught up from the
        position it reports on the new connection.
        """
        warned = False  # a refused TLS handshake is logged once per run of failures
        while not self.deposed.is_set():
            try:
                async with asyncio.timeout(connect_timeout_s):
                    reader, writer = await connect()
            except ssl.SSLError as exc:
                if not warned:
                    warned = True
                    what = "partition %d: TLS handshake with %s failed: %s"
                    log.warning(what, self.partition, follower_id, exc)
                await asyncio.sleep(retry_s)
                continue
            except (OSError, TimeoutError):
                await asyncio.sleep(retry_s)
                continue
            warned = False
            await self.follow(follower_id, reader, writer)
            await asyncio.sleep(retry_s)

    def _on_reply(self, progress: FollowerProgress, reply: Replicated) -> None:
        self._heard(progress.node_id)
        if reply.code == "stale_epoch":
            if reply.epoch > self.epoch:
                self._depose(reply.epoch)
            return
        if reply.code == "replication_gap" or not progress.positioned:
            # A position report, or "I can vouch for my log only up to here": ship from
            # there. Only acknowledgements of what this leader shipped count as held: a
            # reported position may include a deposed leader's entries.
            if not progress.positioned:
                # Once per link (and re-seed): a restarted follower's catch-up begins here, which
                # said nothing when it stalled (issue 24: only the link's close was logged).
                what = "partition %d: %s reports LSN %d (ours %d): shipping from there"
                log.info(what, self.partition, progress.node_id, reply.lsn, self._last_lsn)
            self._release_hold(progress.node_id)
            progress.ship_from(min(reply.lsn, self._last_lsn))
        elif reply.code is None:
            progress.acknowledge(reply.lsn)
            if progress.acked >= progress.tail_sent:
                progress.caught_up_at = max(progress.caught_up_at, progress.tail_sent_at)
        progress.wake.set()
        self._settle_waiters()

    async def _ship(self, progress: FollowerProgress, stream: NodeStream) -> None:
        try:
            await self._ship_entries(progress, stream)
        except (PushgateError, ConnectionClosedError, OSError) as exc:
            log.warning("partition %d: link to %s failed: %s", self.partition, progress.node_id, exc)
        # A sender that stops (deposed, or failed) ends the link: follow() returns and a
        # maintained link dials again.
        await stream.close()

    async def _ship_entries(self, progress: FollowerProgress, stream: NodeStream) -> None:
        conn = stream.connection
        while not conn.closed and not self.deposed.is_set():
            progress.wake.clear()
            if self._has_entries_for(progress):
                # From the entry at ``sent`` (the follower's last, sent as prev for log matching).
                sent = progress.sent
                # Committed before the read starts, so the read sees at least this far.
                committed = self.store.last_lsn
                entries = self._from_memory(sent)
                if entries is None:
                    entries = await self.store.read_replication_log(
                        Lsn(max(0, sent - 1)), self.batch_entries + 1
                    )
                if progress.sent != sent or not progress.positioned:
                    # A reply moved where to ship from while we read (a follower stepping us
                    # back past a deposed tail): start again from there. (Read against the
                    # moved ``sent``, this batch looked like a trimmed log and the follower
                    # was re-seeded from a snapshot for nothing.)
                    continue
                prev = (NO_LSN, NO_EPOCH)
                if progress.sent > 0 and entries and entries[0].lsn == progress.sent:
                    prev = (entries[0].lsn, entries[0].epoch)
                    entries = entries[1:]
                if not entries and committed <= progress.sent:
                    # What follows ``sent`` was offered but not committed here when the read
                    # began, and ``sent`` is older than the early buffer (a new term's first
                    # entry): its commit wakes us. Not a trimmed log: re-seeding would copy the
                    # whole store. (Judged by what was committed before the read: the commit
                    # may land while it runs, and the read would not show it.)
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(self.heartbeat_s):
                            await progress.wake.wait()
                    continue
                # (A prev that is no longer in the log is old, committed history: sent unchecked.)
                if not entries or entries[0].lsn != progress.sent + 1:
                    log.warning(
                        "partition %d: %s needs LSN %d, trimmed here: re-seeding it from a snapshot",
                        self.partition,
                        progress.node_id,
                        progress.sent + 1,
                    )
                    progress.needs_snapshot = True
                    await self._send_snapshot(progress, stream)
                    continue
                conn.replicate(self.partition, self.epoch, entries, self.committed_lsn, prev)
                stream.flush()
                progress.sent = entries[-1].lsn
                if progress.sent >= self._last_lsn:
                    progress.tail_sent, progress.tail_sent_at = progress.sent, self.clock()
                await stream.drain()
                continue
            # Idle: woken by new entries (notify wakes only a link it has some for) or by the
            # follower's answer; else a heartbeat is due.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.heartbeat_s):
                    await progress.wake.wait()
            if not progress.wake.is_set() and progress.positioned and not conn.closed:
                # Idle: an empty shipment tells the follower our term (its fence rises, so a
                # deposed leader is refused even before our next write) and what is committed.
                # It names our entry at ``sent`` as prev, so the answer vouches for the
                # follower's log up to there, or says where it diverges: a rejoining deposed
                # leader reports a position past entries of its own term, which must not
                # count as holding ours.
                prev = await self._entry_at(progress.sent)
                if progress.sent >= self._last_lsn:
                    progress.tail_sent, progress.tail_sent_at = progress.sent, self.clock()
                conn.replicate(self.partition, self.epoch, [], self.committed_lsn, prev)
                stream.flush()

    async def _entry_at(self, lsn: Lsn) -> tuple[Lsn, Epoch]:
        """(lsn, its epoch) in our log, as a shipment's prev; unchecked if trimmed (old history)."""
        if lsn == NO_LSN:
            return NO_LSN, NO_EPOCH
        if (early := self._early.get(lsn)) is not None:
            return lsn, early.epoch
        entries = await self.store.read_replication_log(Lsn(lsn - 1), 1)
        if entries and entries[0].lsn == lsn:
            return lsn, entries[0].epoch
        return NO_LSN, NO_EPOCH

    async def _send_snapshot(self, progress: FollowerProgress, stream: NodeStream) -> None:
        """Stream a consistent copy of the store; ship nothing more until the follower reports."""
        # Entries after the copy must stay until the follower has caught up from them.
        self._holds[progress.node_id] = self.store.last_lsn
        self.store.hold_log_from(min(self._holds.values()))
        conn = stream.connection
        with tempfile.TemporaryDirectory(prefix="pushgate-snapshot-") as tmp:
            await self.store.snapshot(Path(tmp))
            source = await asyncio.to_thread(open, Path(tmp) / "data.mdb", "rb")
            try:
                offset = 0
                while chunk := await asyncio.to_thread(source.read, SNAPSHOT_CHUNK):
                    conn.snapshot_chunk(self.partition, self.epoch, offset, chunk)
                    stream.flush()
                    offset += len(chunk)
                    await stream.drain()
                    # A follower being re-seeded answers only once it has the whole copy:
                    # each chunk taken off our hands counts as contact meanwhile (else an
                    # RF 2 leader re-seeding its follower for longer than the check-quorum
                    # window would resign and start over).
                    self._heard(progress.node_id)
                conn.snapshot_chunk(self.partition, self.epoch, offset, b"", done=True)
                stream.flush()
            finally:
                source.close()
        progress.needs_snapshot = False
        progress.positioned = False
        progress.snapshots_sent += 1

    def _release_hold(self, node_id: str) -> None:
        if self._holds.pop(node_id, None) is not None:
            self.store.hold_log_from(min(self._holds.values()) if self._holds else None)


class ReplicationFollower:
    def __init__(
        self,
        store: ReplicaStore,
        *,
        partition: int,
        node_id: str,
        staging: Path | None = None,
        install_snapshot: InstallSnapshot | None = None,
        floor: Callable[[], Epoch] | None = None,
    ) -> None:
        """``staging`` (a directory it may wipe) and ``install_snapshot`` enable re-seeding.
        ``floor``: the oldest term this replica may follow now, asked at each shipment (the
        node's: a term of an incarnation before the cluster's current one is over,
        ``coordination/timeline.py``'s ``incarnation_floor``); a leader of an older one is
        refused as stale, above its fence, so it is deposed."""
        self.store = store
        self.partition = partition
        self.node_id = node_id
        self.staging = staging
        self.install_snapshot = install_snapshot
        self.floor = floor
        self.snapshots_installed = 0

    def _fence(self) -> Epoch:
        """The oldest term this replica follows: its store's fence, or the floor if higher."""
        fence = self.store.epoch
        return max(fence, self.floor()) if self.floor is not None else fence

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Take one leader connection (an ``asyncio.start_server`` callback) until it closes.

        Shipments that arrive while one is being applied are applied together in the next
        commit (group commit on the follower: one fsync for all of them) and acknowledged
        with one reply.
        """
        stream = NodeStream(Connection(self.node_id), reader, writer)
        await self.serve_stream(stream, stream.events())

    async def serve_stream(self, stream: NodeStream, events: AsyncIterator[Event]) -> None:
        """Take a leader connection whose events someone already started reading (a node
        that routed the connection by its hello)."""
        inbox = _Inbox()
        applier = asyncio.create_task(self._apply_queued(inbox, stream), name=f"apply p{self.partition}")
        try:
            async for event in events:
                if isinstance(event, Replicate | SnapshotChunk) and event.partition == self.partition:
                    inbox.put(event)
        finally:
            try:
                await _stop(applier)
            finally:
                await stream.close()

    def _report_position(self, stream: NodeStream) -> None:
        stream.connection.replicated(self.partition, self.store.epoch, self.store.last_lsn)
        stream.flush()

    async def _apply_queued(self, inbox: _Inbox, stream: NodeStream) -> None:
        try:
            await self._apply_inbox(inbox, stream)
        except (PushgateError, ConnectionClosedError, OSError) as exc:
            log.warning("partition %d: replication from the leader failed: %s", self.partition, exc)
        # Ending the applier ends the link: the leader dials again and we report afresh.
        await stream.close()

    async def _apply_inbox(self, inbox: _Inbox, stream: NodeStream) -> None:
        # Our position first: the leader ships from there.
        self._report_position(stream)
        snapshot: BinaryIO | None = None
        try:
            while True:
                item = await inbox.get()
                if isinstance(item, SnapshotChunk):
                    snapshot = await self._take_chunk(item, snapshot, stream)
                    continue
                # One connection carries one leader's term; shipments that continue each other
                # go together, the first one's prev checking them all. One that does not (the
                # leader stepped back after a refusal) starts a new commit with its own check.
                for run in _contiguous_runs([item, *inbox.take_shipments()]):
                    first = run[0]
                    entries = [entry for shipment in run for entry in shipment.entries]
                    epoch, lsn, code = await self._apply(
                        entries, run[-1].epoch, first.prev_lsn, first.prev_epoch
                    )
                    if stream.connection.closed:
                        return
                    stream.connection.replicated(self.partition, epoch, lsn, code)
                    stream.flush()
        finally:
            if snapshot is not None:
                snapshot.close()

    async def _take_chunk(
        self, chunk: SnapshotChunk, snapshot: BinaryIO | None, stream: NodeStream
    ) -> BinaryIO | None:
        if self.staging is None or self.install_snapshot is None:
            raise Unavailable(f"partition {self.partition}: this follower cannot be re-seeded")
        if chunk.epoch < self._fence():
            return snapshot  # a deposed leader's copy: ignored (it will learn from our replies)
        staged = self.staging / "data.mdb"
        if chunk.offset == 0 and not chunk.done:
            if snapshot is not None:
                snapshot.close()
            await asyncio.to_thread(_fresh_dir, self.staging)
            snapshot = await asyncio.to_thread(open, staged, "wb")
        if snapshot is None:
            return None  # a copy that started before we connected: wait for the next one
        if chunk.data:
            await asyncio.to_thread(snapshot.write, chunk.data)
        if not chunk.done:
            return snapshot
        await asyncio.to_thread(_sync_and_close, snapshot)
        self.store = await self.install_snapshot(self.store, self.staging)
        self.snapshots_installed += 1
        log.warning(
            "partition %d: re-seeded from a snapshot of epoch %d at LSN %d",
            self.partition,
            chunk.epoch,
            self.store.last_lsn,
        )
        self._report_position(stream)
        return None

    async def _apply(
        self, entries: list[LogEntry], epoch: Epoch, prev_lsn: Lsn, prev_epoch: Epoch
    ) -> tuple[Epoch, Lsn, str | None]:
        store = self.store
        if (fence := self._fence()) > store.epoch and epoch < fence:
            # A term of an earlier incarnation (its store would take it): refused as the
            # store refuses a term older than its fence, with the floor as the newer epoch.
            return fence, store.last_lsn, "stale_epoch"
        try:
            if prev_lsn > store.last_lsn:
                raise ReplicationGap(f"missing entries before {prev_lsn}")
            if prev_epoch and prev_lsn and await self._epoch_at(prev_lsn) not in (prev_epoch, None):
                # Diverged at prev: vouch only for what comes before it; the leader steps back.
                return store.epoch, Lsn(prev_lsn - 1), "replication_gap"
            # What an acknowledgement vouches for: our log equals the leader's up to the
            # shipment's end (its prev matched, its entries are applied or already held).
            # Not our last LSN: past that end we may hold a deposed leader's entries.
            vouched = entries[-1].lsn if entries else prev_lsn
            entries = await self._drop_held(entries, epoch)
            await store.apply_replicated(entries, epoch)
        except StaleEpoch:
            return store.epoch, store.last_lsn, "stale_epoch"
        except ReplicationGap:
            return store.epoch, store.last_lsn, "replication_gap"
        return store.epoch, vouched, None

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
        last, epoch = self.store.last_entry
        if lsn == last and epoch is not None:
            return epoch  # the usual case, a shipment continuing our tail
        entries = await self.store.read_replication_log(Lsn(lsn - 1), 1)
        return entries[0].epoch if entries and entries[0].lsn == lsn else None


def _contiguous_runs(shipments: list[Replicate]) -> list[list[Replicate]]:
    """Split shipments where one does not start at the previous one's end."""
    runs: list[list[Replicate]] = []
    for shipment in shipments:
        if runs:
            last = runs[-1][-1]
            end = last.entries[-1].lsn if last.entries else last.prev_lsn
            if shipment.prev_lsn == end:
                runs[-1].append(shipment)
                continue
        runs.append([shipment])
    return runs


class _Inbox:
    """Shipments and snapshot chunks in arrival order (a deque: batches are taken from its head)."""

    def __init__(self) -> None:
        self._items: collections.deque[Replicate | SnapshotChunk] = collections.deque()
        self._ready = asyncio.Event()

    def put(self, item: Replicate | SnapshotChunk) -> None:
        self._items.append(item)
        self._ready.set()

    async def get(self) -> Replicate | SnapshotChunk:
        while not self._items:
            self._ready.clear()
            await self._ready.wait()
        return self._items.popleft()

    def take_shipments(self) -> list[Replicate]:
        """The shipments at the head, up to the next snapshot chunk."""
        out: list[Replicate] = []
        while self._items and isinstance(head := self._items[0], Replicate):
            self._items.popleft()
            out.append(head)
        return out


def _fresh_dir(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)


def _sync_and_close(file: BinaryIO) -> None:
    file.flush()
    os.fsync(file.fileno())
    file.close()


async def _stop(task: asyncio.Task[None]) -> None:
    """Cancel a helper task and wait for its end. Not ``suppress(CancelledError)`` around
    ``await task``: that would also swallow a cancellation of the caller arriving meanwhile
    (a link closing just as its partition is dropped kept re-dialling for ever)."""
    task.cancel()
    await asyncio.wait([task])
