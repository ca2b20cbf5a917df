"""Group commit: one writer thread applies batches of operations in one transaction and one fsync.

Callers on the event loop submit an operation (a function of a :class:`Writes` and the
batch's clock reading) and await its result. The writer drains whatever is queued, runs
each operation in the batch's transaction (an operation that fails half-way makes the
writer redo the batch one operation per transaction, so it undoes only itself), appends the
batch's mutations to the replication log, commits once, and resolves every caller of the
batch with one hop back to the event loop (:func:`_hand_over`) once the commit is durable:
after one sync of the journal where the store journals (``checkpoint.py``,
:meth:`GroupCommitWriter._settle_journaled`), at once where LMDB syncs each commit whole (a
backend node's replica on an LMDB release the journal was not tested with), else after the next commit's data sync or a sync of its own when there is no
next commit (:meth:`GroupCommitWriter._settle`).
Nothing on the event loop ever waits on LMDB or fsync.

The writer runs on a :class:`~.commit_thread.CommitThread`: its own, or its node's, shared
with the node's other replicas, whose journal they share too (a round's commits of every
replica synced once).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import lmdb

from ..commit_stats import CommitStats
from ..errors import InvalidRequest, PushgateError, Unavailable
from ..types import Epoch, LogEntry, Lsn
from . import meta_pages
from .checkpoint import Journaling
from .commit_thread import CommitThread
from .environment import Db, Environment, LoggedWrites, Touched, Writes, is_disk_full
from .recorded_txn import Change, RecordedTxn
from .replication_log import LogState, NotLeading, ReplicationLog
from .room import RoomGauge

log = logging.getLogger("pushgate.store")
T = TypeVar("T")
Operation = Callable[[Writes, float], T]
# Runs inside each batch's transaction after its operations, with what they touched; returns
# callbacks to run on their event loops once the batch is committed (standing receives).
PostCommit = tuple[asyncio.AbstractEventLoop, Callable[[], None]]
AfterOps = Callable[[Writes, float], list[PostCommit]]


@dataclass(slots=True)
class _Pending(Generic[T]):
    op: Operation[T]
    future: asyncio.Future[T]
    loop: asyncio.AbstractEventLoop
    durable: bool
    outcome: tuple[bool, Any] = field(default=(False, None))


@dataclass(slots=True)
class _Committed:
    """A committed batch and what its callers and listeners get once it is durable."""

    batch: list[_Pending[Any]]
    touched: Touched
    post_commit: list[PostCommit]
    events: list[dict[tuple[str, str, str], int]]
    # The replication log's position after the batch, published to readers once its callers
    # are told (ReplicationLog.published); None: the batch is not durable (its sync failed).
    log_state: LogState | None


_STOP = object()
# From a checkpoint's own thread: its sync and save are over (Journaling.begin).
_CHECKPOINT_DONE = object()


@dataclass(slots=True)
class _Journaling:
    """A request to the writer thread: start journaling (``make`` builds the journal) or
    stop (``make`` None)."""

    done: threading.Event
    make: Callable[[], Journaling] | None
    started: bool = False
    # The store's first journal, at its open: no reopen, and a failure is the opener's.
    first: bool = False
    error: BaseException | None = None


def _disk_full(exc: Exception) -> bool:
    return getattr(exc, "errno", None) == errno.ENOSPC


_HEARTBEAT = b"\0sys\0advance"


class _TermEnded(Exception):
    """The batch would log an entry in a term whose shipped entry failed to commit."""


class _BrokenOperation(Exception):
    """An operation failed after it had written: the batch must be redone without it."""

    def __init__(self, cause: Exception) -> None:
        super().__init__(str(cause))
        self.cause = cause


class GroupCommitWriter:
    """The single writer of one environment."""

    def __init__(
        self,
        env: Environment,
        replication_log: ReplicationLog,
        clock: Callable[[], float],
        on_commit: Callable[[Touched], None],
        max_batch: int = 1024,
        after_ops: AfterOps | None = None,
        on_events: Callable[[list[dict[tuple[str, str, str], int]]], None] | None = None,
        index_listener: Callable[[int, bytes], None] | None = None,
        on_commit_start: Callable[[Touched], None] | None = None,
        room_gauge: RoomGauge | None = None,
        thread: CommitThread | None = None,
    ) -> None:
        self._env = env
        # The thread this writer commits on: its own, or one it shares with the other
        # replicas of a node (commit_thread.py).
        self._thread = thread or CommitThread()
        # A journaling store (checkpoint.py): each committed transaction is appended to the
        # journal, and a batch is durable once the journal is synced (_settle).
        self._journaling: Journaling | None = None
        # A journal write failed since the last checkpoint: only a checkpoint makes what
        # was committed since durable.
        self._journal_failed: OSError | None = None
        self._room_gauge = room_gauge  # Writes.room_gauge of every transaction
        self._log = replication_log
        self._clock = clock
        self._on_commit = on_commit
        self._max_batch = max_batch
        self._after_ops = after_ops
        self._index_listener = index_listener  # Writes.index_listener of every transaction
        # Told (on this thread) what a transaction touched just before it commits
        # (backend.EarlyChanges).
        self._on_commit_start = on_commit_start
        self._post_commit: list[PostCommit] = []
        # Events (Writes.events) of the transactions of the current batch that committed;
        # handed to on_events from the writer thread once the batch is resolved.
        self._on_events = on_events
        self._events: list[dict[tuple[str, str, str], int]] = []
        # Whether the current batch's commits wrote anything (and so synced their data).
        self._wrote = False
        # Committed batches whose meta page is not yet synced, callers not yet told (_settle).
        self._unsynced: list[_Committed] = []
        # Early shipping (LmdbBackend.ship_early): each logged entry is offered just before
        # its commit, and reported lost if that commit then fails.
        self.offer: Callable[[LogEntry], None] | None = None
        self.lost: Callable[[Lsn], None] | None = None
        # The newest epoch in which an entry was shipped early and then did not commit: no
        # entry of that epoch is committed after it (its LSN would carry other content under
        # the same (LSN, epoch), which log matching takes for the same entry). The leader
        # ends the term; writes resume in the next one (a higher epoch).
        self._lost_epoch: Epoch | None = None
        self._closed = False
        # Set on the commit thread once a stop is done (the writer has left the thread).
        self._stopped = threading.Event()
        self._done = False
        # Commits that wrote something (idle sweeps commit nothing).
        self.batches = 0
        self.operations = 0
        self.commit_stats = CommitStats()

    def start(self) -> None:
        self._thread.attach(self)

    def submit(self, op: Operation[T], *, durable: bool = True) -> asyncio.Future[T]:
        """Queue an operation; the future resolves after its batch is committed and synced.

        ``durable=False`` (receives): the operation's commit may be left undone by a crash
        of the machine (never of the process) until a later commit syncs, when the
        environment does not sync each commit itself (``Environment.sync_meta``): a batch
        of such operations only is answered without waiting for its meta page (or, in a
        journaling store, its journal entry) to reach the disk. Any other batch is durable
        before any caller hears of it (``_settle``, ``_settle_journaled``)."""
        if self._closed:
            raise Unavailable("store is closed")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._thread.put(self, _Pending(op, future, loop, durable))
        return future

    def stop(self) -> None:
        """Finish what is queued, then end the thread (blocking; call from a worker thread)."""
        if not self._closed:
            self._closed = True
            self._thread.put(self, _STOP)
            self._stopped.wait()

    def stop_journaling(self) -> None:
        """Leave journaling: a clean checkpoint, then LMDB syncs each commit itself
        (another process opened the store; blocking, call from a worker thread)."""
        control = _Journaling(threading.Event(), None)
        self._thread.put(self, control)
        control.done.wait()

    def begin_journaling(self, make: Callable[[], Journaling]) -> None:
        """At the store's open, before any operation: journal from here on, its first
        checkpoint taken on the commit thread (with every other store of a journal it
        shares); raise what failed (blocking, call from a worker thread)."""
        control = _Journaling(threading.Event(), make, first=True)
        self._thread.put(self, control)
        control.done.wait()
        if control.error is not None:
            raise control.error

    def start_journaling(self, make: Callable[[], Journaling]) -> bool:
        """Journal again (the store is alone with its files again); return whether it does
        (blocking, call from a worker thread)."""
        control = _Journaling(threading.Event(), make)
        self._thread.put(self, control)
        control.done.wait()
        return control.started

    # On the commit thread (commit_thread.Member) ----------------------------

    def wait_s(self) -> float | None:
        if self._unsynced:
            return 0.0  # no next commit to carry the waiting meta page: sync it alone
        return self._journaling.seconds_until_due() if self._journaling is not None else None

    def idle(self) -> None:
        if self._unsynced:
            self._sync_unsynced()
        elif self._journaling is not None and self._journaling.seconds_until_due() == 0:
            self._begin_checkpoint()

    def take(self, items: list[Any]) -> list[_Committed]:
        """Commit the round's operations, at most ``max_batch`` a transaction, and run its
        controls in order. A journaling store's last batch is returned unsettled (the thread
        settles it once every writer of the round has committed, so that a journal the
        writers share is synced once for all); any other batch is settled here, before the
        next commits or control runs."""
        unsettled: list[_Committed] = []
        batch: list[_Pending[Any]] = []
        for item in items:
            if self._done:
                break
            if isinstance(item, _Pending):
                batch.append(item)
                if len(batch) == self._max_batch:
                    # A full batch is a round of its own: it is synced before the next
                    # commits, as a writer alone on its thread would.
                    self._commit(batch, unsettled)
                    batch = []
                    self.settle(unsettled)
                    unsettled = []
                continue
            self._commit(batch, unsettled)
            batch = []
            self.settle(unsettled)
            unsettled = []
            self._control(item)
        self._commit(batch, unsettled)
        return unsettled

    def settle(self, committed: list[_Committed]) -> bool:
        for each in committed:
            self._settle_journaled(each)
        return self._done

    def left(self) -> None:
        self._stopped.set()

    def _commit(self, batch: list[_Pending[Any]], unsettled: list[_Committed]) -> None:
        if not batch:
            return
        committed = self._commit_batch(batch)
        if self._journaling is not None:
            unsettled.append(committed)
        else:
            self._settle(committed)

    def _control(self, control: Any) -> None:
        if control is _STOP:
            self._sync_unsynced()
            self._finish_journaling()
            self._done = True
            return
        if control is _CHECKPOINT_DONE:
            self._complete_checkpoint()
            return
        if control.first:
            self._begin_journaling(control)
            return
        try:
            if control.make is not None:
                control.started = self._start_journaling(control.make)
            elif self._journaling is not None:
                self._finish_journaling()
                self._env.reopen(journaled=False)
                log.info("store %s is shared: no journal, LMDB syncs each commit", self._env.path)
        except (OSError, lmdb.Error, Unavailable):
            # Commits from here on fail ("store write failed"); the writer lives on.
            log.exception("reopening %s with LMDB's own syncs failed", self._env.path)
        finally:
            control.done.set()

    def _begin_journaling(self, control: _Journaling) -> None:
        assert control.make is not None
        journaling: Journaling | None = None
        try:
            journaling = control.make()
            journaling.checkpoint()
            self._journaling = journaling
        except BaseException as exc:
            if journaling is not None:
                journaling.release()
            control.error = exc
        finally:
            control.done.set()

    def _start_journaling(self, make: Callable[[], Journaling]) -> bool:
        """Reopen journaled and take the first checkpoint; on any failure, back to LMDB's
        own syncs (never unsynced commits without a journal)."""
        if self._journaling is not None:
            return True
        self._sync_unsynced()
        journaling: Journaling | None = None
        try:
            self._env.reopen(journaled=True)
            # Another process committed under its own LSNs: continue from the stored one, so
            # the journal's entries follow the checkpoint's.
            self._env.read(lambda txn: self._log.load(txn, self._env.dbs))
            journaling = make()
            journaling.checkpoint()
        except (OSError, lmdb.Error, Unavailable, meta_pages.UnsupportedFormat):
            log.exception("%s could not start journaling; LMDB syncs each commit", self._env.path)
            if journaling is not None:
                journaling.release()
            self._env.reopen(journaled=False)
            return False
        self._journaling = journaling
        log.info("store %s is alone again: it journals", self._env.path)
        return True

    def _begin_checkpoint(self) -> None:
        """A checkpoint is due: start one whose sync of the LMDB file runs off this thread
        (the writer commits meanwhile), or take it here where one cannot start."""
        assert self._journaling is not None
        try:
            if self._journaling.begin(lambda: self._thread.put(self, _CHECKPOINT_DONE)):
                return
        except (OSError, lmdb.Error, meta_pages.UnsupportedFormat):
            log.exception("checkpoint of %s failed", self._env.path)
            return
        if not self._journaling.in_flight:
            self._checkpoint()

    def _complete_checkpoint(self) -> None:
        if self._journaling is None:
            return
        try:
            self._journaling.complete()
        except (OSError, lmdb.Error, meta_pages.UnsupportedFormat):
            log.exception("checkpoint of %s failed", self._env.path)

    def _checkpoint(self) -> bool:
        """Take a checkpoint on this thread; return whether it was taken (a failure is
        logged: the journal keeps every commit durable meanwhile, and the next one is tried
        later)."""
        assert self._journaling is not None
        try:
            self._journaling.checkpoint()
        except (OSError, lmdb.Error, meta_pages.UnsupportedFormat):
            log.exception("checkpoint of %s failed", self._env.path)
            return False
        self._journal_failed = None
        return True

    def _finish_journaling(self) -> None:
        journaling, self._journaling = self._journaling, None
        if journaling is None:
            return
        try:
            journaling.finish()
        except (OSError, lmdb.Error, meta_pages.UnsupportedFormat):
            # The next start recovers from the checkpoint before and the journal.
            log.exception("the last checkpoint of %s failed", self._env.path)

    def _commit_batch(self, batch: list[_Pending[Any]]) -> _Committed:
        touched: Touched = set()
        self._post_commit = []
        self._events = []
        self._wrote = False
        advanced = False
        while True:
            try:
                touched = self._apply(batch)
                break
            except _BrokenOperation:
                # Someone's operation failed half-way; its writes went with the batch's
                # transaction. Redo each operation alone so only that one fails.
                touched = self._apply_one_by_one(batch)
                break
            except lmdb.MapFullError:
                if self._env.grow():
                    continue
                if not advanced:
                    # LMDB reuses pages freed by transaction N only from N+2 on, and only
                    # once no reader is older than N: a journaling store's checkpoint holds
                    # one (checkpoint.py), so it takes a checkpoint now, and one tiny commit
                    # then makes what acks freed usable for this batch.
                    advanced = True
                    if self._journaling is not None:
                        self._checkpoint()
                    if self._advance():
                        continue
                # Full at the maximum size: let each operation try alone, so the ones
                # that free space or need none (acks, reads) still go through.
                touched = self._apply_one_by_one(batch)
                break
            except lmdb.Error as exc:
                self._fail_all(batch, exc)
                break
            except _TermEnded:
                self._fail_term_ended(batch)
                break
            except NotLeading as exc:
                # Nothing of the batch was logged or shipped (the check comes before the
                # offer): each operation fails, a follower's own (an apply, a truncation)
                # is sent again by its link, and a write is retried at the new leader.
                self._fail_all_with(batch, self._not_leading(exc))
                break
        self.operations += len(batch)
        return _Committed(batch, touched, self._post_commit, self._events, self._log.committed)

    def _settle_journaled(self, committed: _Committed) -> None:
        """A journaling store: the batch is durable once the journal is synced (one
        fdatasync; a standalone store's batch of receives only is answered without it, its
        entries synced by the next sync: a replica's log never loses its tail, so a replica
        syncs every batch), or, when a journal write failed, once a checkpoint is taken."""
        assert self._journaling is not None
        if self._log.keep or any(pending.durable for pending in committed.batch):
            try:
                self._journaling.sync()
            except OSError as exc:
                # After a failed fdatasync the kernel may have dropped the pages it could
                # not write, and the next one may still succeed: only a checkpoint will do.
                self._journal_failed = exc
            error = self._journal_failed
            if error is not None and not self._checkpoint():
                log.error("journal of %s failed: %s", self._env.path, error)
                failure = Unavailable("disk full" if _disk_full(error) else "store write failed")
                self._fail_all_with(committed.batch, failure)
                committed.post_commit.clear()
                committed.log_state = None
        self._resolve(committed)
        self._journaling.start_writeback()
        if self._room_gauge is not None and self._room_gauge.short and self._journaling.journal.written:
            self._checkpoint()  # now: the pages freed since the last one are room only then
        elif self._journaling.seconds_until_due() == 0:
            self._begin_checkpoint()

    def _settle(self, committed: _Committed) -> None:
        """Tell the batch's callers, once its commit is durable.

        An environment that syncs each commit whole (``sync_meta``, a backend node): at once.
        Otherwise a commit that wrote synced its data pages, then wrote its meta page
        unsynced; the next commit's data sync carries that page to disk too. So a batch that
        needs to be durable waits for the next batch that writes (or for an explicit sync
        when the writer runs out of work, or the next batch writes nothing): under load one
        fdatasync per commit instead of two, at the cost of a caller waiting for the next
        commit rather than a sync of its own. Callers are told in commit order: a later
        batch may have read what an earlier one wrote (a held receive of a message just sent).
        """
        if self._env.sync_meta:
            self._resolve(committed)
            return
        if self._wrote:
            # This commit's data sync carried every earlier meta page to disk.
            self._resolve_unsynced()
            if any(pending.durable for pending in committed.batch):
                self._unsynced.append(committed)
                return
        elif self._unsynced:
            self._sync_unsynced()
        self._resolve(committed)

    def _sync_unsynced(self) -> None:
        if not self._unsynced:
            return
        try:
            self._env.sync()
        except lmdb.Error as exc:
            # Committed, durable or not: the callers hear "store write failed" (outcome
            # unknown, as when a commit's own sync fails); deliveries are not made.
            for committed in self._unsynced:
                self._fail_all(committed.batch, exc)
                committed.post_commit.clear()
                committed.log_state = None
        self._resolve_unsynced()

    def _resolve_unsynced(self) -> None:
        unsynced, self._unsynced = self._unsynced, []
        for committed in unsynced:
            self._resolve(committed)

    def _advance(self) -> bool:
        txn = self._env.begin_write()
        try:
            txn.put(_HEARTBEAT, b"", db=self._env.dbs[Db.META])
            txn.commit()
        except lmdb.Error:
            txn.abort()
            return False
        return True

    def _apply(self, batch: list[_Pending[Any]], *, after_ops: bool = True) -> Touched:
        now = self._clock()
        txn = self._env.begin_write()
        journaling = self._journaling
        if journaling is not None:
            # Every change the batch makes is journaled, whoever makes it (recorded_txn.py).
            txn = RecordedTxn(txn, self._env.db_numbers)
        self._log.begin()
        writes = LoggedWrites(txn, self._env.dbs) if self._log.keep else Writes(txn, self._env.dbs)
        writes.index_listener = self._index_listener
        writes.room_gauge = self._room_gauge
        try:
            for pending in batch:
                pending.outcome = self._run_op(writes, pending.op, now)
            post: list[PostCommit] = []
            if after_ops and self._after_ops is not None and writes.touched:
                post = self._run_after_ops(writes, now)
            writes.flush_queues()
            lsn = self._log.append(writes) if writes.write_count else None
            appended = self._log.appended
            if appended is not None and self._lost_epoch is not None and appended.epoch <= self._lost_epoch:
                raise _TermEnded()
            self._offer_early(writes)
            if self._on_commit_start is not None and writes.touched:
                self._on_commit_start(writes.touched)
            seq = journaling.stamp(txn) if journaling is not None and txn.changes else None
            started = time.perf_counter()
            txn.commit()
            self._log.commit()
            if seq is not None:
                self._journal(seq, txn.changes)
            if writes.write_count:
                self._wrote = True
                self.commit_stats.record(len(batch), time.perf_counter() - started)
            if lsn is not None:
                self.batches += 1
            self._post_commit.extend(post)
            if writes.events:
                self._events.append(writes.events)
        except BaseException:
            txn.abort()
            for undo in reversed(writes.on_abort):
                undo()
            raise
        return writes.touched

    def _journal(self, seq: int, changes: list[Change]) -> None:
        """Append a committed transaction to the journal. Never raises: the commit stands;
        a failed write is remembered, and the batch is durable only once a checkpoint is."""
        assert self._journaling is not None
        try:
            self._journaling.record(seq, changes)
        except OSError as exc:
            self._journal_failed = exc

    def _offer_early(self, writes: Writes) -> None:
        """Hand the batch's entry to the leader's senders before the commit's fsync, so
        followers write it while we do (Raft lets a leader persist its entry in parallel
        with replicating it). Nothing after this point may change the entry; if the commit
        fails, the entry is reported lost and the leader must not reuse its LSN."""
        offer, lost, entry = self.offer, self.lost, self._log.appended
        if offer is None or entry is None:
            return
        try:
            offer(entry)
        except Exception:
            # Never the batch's problem: the entry ships from the log once committed.
            log.exception("offering entry %d early failed", entry.lsn)
            return
        writes.on_abort.append(functools.partial(self._shipped_entry_lost, entry, lost))

    def _shipped_entry_lost(self, entry: LogEntry, lost: Callable[[Lsn], None] | None) -> None:
        """An entry offered early did not commit: followers may hold it. Nothing else is
        logged in its term (a retry of the batch included); the leader is told, to end it."""
        if self._lost_epoch is None or entry.epoch > self._lost_epoch:
            self._lost_epoch = entry.epoch
        log.error(
            "entry %d of epoch %d was shipped but did not commit: no more writes in that epoch",
            entry.lsn,
            entry.epoch,
        )
        if lost is not None:
            lost(entry.lsn)

    @staticmethod
    def _run_op(writes: Writes, op: Operation[Any], now: float) -> tuple[bool, Any]:
        """Run one operation in the batch's transaction.

        The rule that makes this safe without a nested transaction per operation (which
        cost more than the operation itself): an operation raises :class:`PushgateError`
        only before its first write or queue-record change. Anything else aborts the
        batch (``_BrokenOperation``).
        """
        written, saves = writes.write_count, writes.queue_saves
        try:
            result = op(writes, now)
        except PushgateError as exc:
            if writes.write_count != written or writes.queue_saves != saves:
                raise _BrokenOperation(exc) from exc
            return (False, exc)
        except lmdb.BadValsizeError as exc:
            # A key past LMDB's limit: this operation's input, nobody else's problem.
            raise _BrokenOperation(InvalidRequest("a name or id is too long to store")) from exc
        except lmdb.Error:
            raise
        except Exception as exc:
            raise _BrokenOperation(exc) from exc
        return (True, result)

    def _run_after_ops(self, writes: Writes, now: float) -> list[PostCommit]:
        assert self._after_ops is not None
        try:
            return self._after_ops(writes, now)
        except PushgateError as exc:
            raise _BrokenOperation(exc) from exc
        except lmdb.Error:
            raise
        except Exception as exc:
            raise _BrokenOperation(exc) from exc

    def _apply_one_by_one(self, batch: list[_Pending[Any]]) -> Touched:
        touched: Touched = set()
        for pending in batch:
            try:
                # Without standing receives: a broken one must not fail the operations.
                touched |= self._apply([pending], after_ops=False)
            except _BrokenOperation as broken:
                error = broken.cause
                if not isinstance(error, PushgateError):
                    log.error("store operation failed", exc_info=error)
                    error = Unavailable("internal store error")  # the cause is in the log, never shown
                pending.outcome = (False, error)
            except lmdb.MapFullError:
                pending.outcome = (False, Unavailable("store is full"))
            except lmdb.Error as exc:
                pending.outcome = (False, self._unavailable(exc))
            except _TermEnded:
                pending.outcome = (False, self._term_ended())
            except NotLeading as exc:
                pending.outcome = (False, self._not_leading(exc))
        return touched

    def _fail_all(self, batch: list[_Pending[Any]], exc: lmdb.Error) -> None:
        error = self._unavailable(exc)
        for pending in batch:
            pending.outcome = (False, error)

    def _fail_term_ended(self, batch: list[_Pending[Any]]) -> None:
        self._fail_all_with(batch, self._term_ended())

    @staticmethod
    def _fail_all_with(batch: list[_Pending[Any]], error: PushgateError) -> None:
        for pending in batch:
            pending.outcome = (False, error)

    def _term_ended(self) -> Unavailable:
        # Outcome unknown, not "refused": an earlier attempt of this very batch may have
        # been shipped to followers, and one of them may be promoted with it.
        return Unavailable(
            f"a write of epoch {self._lost_epoch} was shipped but did not commit here; "
            "this term takes no more writes (the next leader's does)"
        )

    @staticmethod
    def _not_leading(exc: NotLeading) -> Unavailable:
        # Refused before anything was logged: the write is retried at the new leader.
        return Unavailable(f"not the leader any more: {exc}")

    def _unavailable(self, exc: lmdb.Error) -> Unavailable:
        if is_disk_full(exc, self._env.path):
            log.error("disk full: %s", exc)
            return Unavailable("disk full")
        log.error("LMDB write failed: %s", exc)
        return Unavailable("store write failed")

    def _resolve(self, committed: _Committed) -> None:
        if committed.log_state is not None:
            # Before any caller hears of it: what a follower acknowledges, or a leader counts
            # as its own copy, is only ever what is durable here.
            self._log.published = committed.log_state
        # One hop to each loop per batch (_hand_over), carrying everything that loop gets.
        hops: dict[asyncio.AbstractEventLoop, tuple[list[_Pending[Any]], list[Callable[[], None]]]] = {}
        for pending in committed.batch:
            hops.setdefault(pending.loop, ([], []))[0].append(pending)
        for loop, callback in committed.post_commit:
            hops.setdefault(loop, ([], []))[1].append(callback)
        for loop, (items, callbacks) in hops.items():
            # A closed loop means nobody is waiting any more; the writes stand.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_hand_over, items, callbacks, committed.touched, self._on_commit)
        if committed.events and self._on_events is not None:
            self._on_events(committed.events)


def _hand_over(
    items: list[_Pending[Any]],
    callbacks: list[Callable[[], None]],
    touched: Touched,
    on_commit: Callable[[Touched], None],
) -> None:
    """A committed batch, on one event loop, in the order that gets a message out soonest.

    Wake-ups first (a standing receive's delivery below then tells its dispatcher that this
    commit served it), then the deliveries, whose frames are written at the end of this loop
    round, and the callers' futures one loop turn later: the code awaiting them (an HTTP
    reply, with its usage records) resumes only after what the wake-ups and deliveries
    started, including a task they woke (the broadcaster that tells other gateways through
    Redis), so it never stands between a commit and its push.
    """
    if touched and items:
        on_commit(touched)
    for callback in callbacks:
        try:
            callback()
        except Exception:
            log.exception("post-commit callback failed")
    if items:
        # The items' loop is this one (asking for the running loop costs a getpid() call).
        items[0].loop.call_soon(_resolve_futures, items)


def _resolve_futures(items: list[_Pending[Any]]) -> None:
    for pending in items:
        if pending.future.done():
            continue  # The caller was cancelled; the write stands.
        ok, value = pending.outcome
        if ok:
            pending.future.set_result(value)
        else:
            pending.future.set_exception(value)
