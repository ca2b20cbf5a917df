"""The embedded backend: LMDB on local disk behind the :class:`Backend` interface.

Writes go through one :class:`GroupCommitWriter` thread; reads run in short read
transactions on worker threads. See ``backend_store/backend.py`` for the contract and
``ARCHITECTURE.md`` for the key layout.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from ..attributes import check_number, check_receive
from ..backend import ChangeListener, DeliverCallback, EventListener, MessageEvent
from ..commit_stats import CommitStats
from ..encryption import Keyring
from ..errors import ConfigurationError, InvalidRequest, PushgateError, Unavailable
from ..limits import MAX_RECEIVE_PER_CALL, MAX_VISIBILITY_S
from ..options import StoreOptions
from ..types import (
    AckResult,
    Epoch,
    LogEntry,
    Lsn,
    NewMessage,
    PeekedMessage,
    QueueInfo,
    QueueName,
    ReceivedMessage,
    SendResult,
    StorageUsage,
    TenantId,
)
from . import dead_letter_ops, queue_ops
from .environment import Db, Environment, Touched, View, Writes
from .group_commit import GroupCommitWriter, PostCommit
from .hold_lock import HoldLock
from .keys import read_u64, u64
from .message_ops import MessageOps, next_visible_ms
from .records import MessageRecord, pack, unpack
from .replication_log import ReplicationLog

log = logging.getLogger("pushgate.store")
T = TypeVar("T")

_KEY_CHECKS = b"\0sys\0key_checks"
# The layout this version writes (docs/store.md, "How a message is stored"): 1, every message
# with a state record (no marker); 2, a state record only once the state changed. A store
# marked newer than this is refused at start, so a rollback cannot strand what a newer
# version wrote (versions before the marker cannot check it).
STORE_FORMAT = 2
_FORMAT = b"\0sys\0format"
_HEARTBEAT = b"\0sys\0heartbeat"
# A cluster replica's label (its cluster id and partition, docs/cluster.md "Cluster identity"):
# outside the logged writes, like the format mark.
_REPLICA_LABEL = b"\0sys\0replica_label"
_KEY_CHECK_PLAINTEXT = b"pushgate key check"
_SWEEP_BUDGET = 1000
# How often the holder looks for another process opening the store (that one's start waits
# for it, at most _HAND_OVER_WAIT_S), and how many looks between a sharer's tries to hold.
_HOLD_PROBE_S = 0.25
_REELECT_EVERY = 4
_HAND_OVER_WAIT_S = 30.0
_MAX_KEY_BYTES = 400


def _meta_key(namespace: str, key: str) -> bytes:
    if not namespace or "\0" in namespace or "\0" in key:
        raise InvalidRequest("metadata namespace must be non-empty and names free of NUL")
    try:
        raw = namespace.encode() + b"\0" + key.encode()
    except UnicodeEncodeError:
        raise InvalidRequest("metadata names must be valid Unicode") from None
    if len(raw) > _MAX_KEY_BYTES:
        raise InvalidRequest(f"metadata names must fit in {_MAX_KEY_BYTES} bytes")
    return raw


@dataclass(frozen=True, slots=True)
class _Demand:
    max_messages: int
    visibility_timeout_s: float | None
    deliver: DeliverCallback
    loop: asyncio.AbstractEventLoop
    in_memory: bool


def _sealed_with(v: View, key_id: str) -> bool:
    """Whether any stored message body is sealed with ``key_id``."""
    for raw in v.cursor(Db.MSGS).iternext(keys=False, values=True):
        record = MessageRecord.decode(raw)
        if record.sealed and Keyring.key_id_of(record.body) == key_id:
            return True
    return False


class LmdbBackend:
    """The embedded store (``lmdb:///path``)."""

    # A partition store of a backend node raises these (one store is one partition replica).
    max_replication_factor = 1
    max_partitions = 1

    def __init__(self, path: Path, options: StoreOptions) -> None:
        self.path = path
        self.options = options
        self._clock: Callable[[], float] = options.clock or time.time
        self._ops = MessageOps(options.keyring, options.max_held)
        self._listeners: list[ChangeListener] = []
        self._event_listeners: list[EventListener] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._env: Environment | None = None
        self._writer: GroupCommitWriter | None = None
        self._replication_log = ReplicationLog(options.replication_log_keep)
        self._sweeper: asyncio.Task[None] | None = None
        self._hold_lock: HoldLock | None = None
        self._hold_watch: asyncio.Task[None] | None = None
        self._max_batch = options.max_batch
        # Standing receives by (tenant, queue); set and cleared on the event loop, taken by
        # the writer thread (single dict operations, atomic under the GIL).
        self._demands: dict[tuple[str, str], _Demand] = {}

    # Life cycle -------------------------------------------------------------

    async def start(self) -> None:
        if self._env is not None:
            return
        env = await asyncio.to_thread(
            Environment, self.path, self.options.map_size, self.options.max_map_size
        )
        await asyncio.to_thread(env.read, lambda txn: self._replication_log.load(txn, env.dbs))
        # Hold in memory only while no other process has this store open (hold_lock.py). A
        # store that keeps a replication log is a node's partition replica: it never holds.
        self._ops.allow_holds = False
        if not self._replication_log.keep:
            lock = HoldLock(self.path)
            try:
                self._ops.allow_holds = await asyncio.to_thread(lock.elect)
                if not self._ops.allow_holds:
                    await asyncio.to_thread(lock.share, _HAND_OVER_WAIT_S)
            except BaseException:
                lock.close()
                await asyncio.to_thread(env.close)
                raise
            self._hold_lock = lock
        self._env = env
        self._loop = asyncio.get_running_loop()
        self._writer = GroupCommitWriter(
            env,
            self._replication_log,
            self._clock,
            self._notify,
            max_batch=self._max_batch,
            after_ops=self._serve_demands,
            on_events=self._committed_events,
            index_listener=self._ops.holds.indexed,
        )
        self._writer.start()
        try:
            await self._write(self._check_store)
        except PushgateError:
            await self.close()
            raise
        if self.options.sweep_interval_s > 0:
            self._sweeper = asyncio.create_task(self._sweep_forever(), name="pushgate-sweeper")
        if self._hold_lock is not None:
            self._hold_watch = asyncio.create_task(self._watch_hold_lock(), name="pushgate-hold-lock")

    async def close(self) -> None:
        if self._hold_watch is not None:
            self._hold_watch.cancel()
            await asyncio.wait([self._hold_watch])
            self._hold_watch = None
        if self._writer is not None and len(self._ops.holds):
            # Write the counts of deliveries held in memory: only a crash loses them.
            with contextlib.suppress(PushgateError):
                await self._write(self._ops.write_held_counts)
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.wait([self._sweeper])
            self._sweeper = None
        if self._writer is not None:
            await asyncio.to_thread(self._writer.stop)
            self._writer = None
        if self._env is not None:
            env, self._env = self._env, None
            # Off the event loop: it waits for reads still running on worker threads.
            await asyncio.to_thread(env.close)
        if self._hold_lock is not None:
            self._hold_lock.close()
            self._hold_lock = None

    async def check_writable(self) -> None:
        await self._write(lambda w, now: w.put(Db.META, _HEARTBEAT, pack(now)))

    def add_listener(self, listener: ChangeListener) -> None:
        self._listeners.append(listener)

    # Message events (backend_store.backend.MessageEvents) ---------------------------

    def add_event_listener(self, listener: EventListener) -> None:
        self._event_listeners.append(listener)

    def _committed_events(self, batches: list[dict[tuple[str, str, str], int]]) -> None:
        """In the writer thread, after a batch committed: hand its events to the loop."""
        if not self._event_listeners or self._loop is None:
            return
        events = [
            MessageEvent(TenantId(tenant), QueueName(queue), kind, count)
            for batch in batches
            for (tenant, queue, kind), count in batch.items()
        ]
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody listens any more
            self._loop.call_soon_threadsafe(self._emit, events)

    def _emit(self, events: list[MessageEvent]) -> None:
        for listener in self._event_listeners:
            try:
                listener(events)
            except Exception:
                log.exception("store event listener failed")

    # Standing receives (backend_store.backend.StandingReceive) ------------------

    def set_demand(
        self,
        tenant: TenantId,
        queue: QueueName,
        max_messages: int,
        visibility_timeout_s: float | None,
        deliver: DeliverCallback,
        in_memory: bool = False,
    ) -> None:
        check_receive(max_messages, visibility_timeout_s)
        loop = asyncio.get_running_loop()
        self._demands[(tenant, queue)] = _Demand(
            int(max_messages), visibility_timeout_s, deliver, loop, in_memory
        )

    def clear_demand(self, tenant: TenantId, queue: QueueName, deliver: DeliverCallback) -> None:
        key = (tenant, queue)
        demand = self._demands.get(key)
        if demand is not None and demand.deliver == deliver:
            self._demands.pop(key, None)

    def demand_waiting(self, tenant: TenantId, queue: QueueName, deliver: DeliverCallback) -> bool:
        """Whether the demand registered with ``deliver`` is still waiting (not served, not
        replaced, not withdrawn). Called on the event loop after a commit's wake-up, it tells a
        backend node whether that commit served it (its delivery callback comes next)."""
        demand = self._demands.get((tenant, queue))
        return demand is not None and demand.deliver == deliver

    def _serve_demands(self, w: Writes, now: float) -> list[PostCommit]:
        """In the writer, inside a batch's transaction: receive for demands on touched queues.

        One commit, one signal: a demand that took everything the queue had visible (its
        receive came back short) is the queue's only news of this commit; its delivery is the
        wake-up, and the listeners hear nothing of the queue (a dispatcher, long-poll or
        other gateway woken now would find nothing). A full delivery leaves the queue's
        wake-up in place: more may be visible, for whoever looks."""
        post: list[PostCommit] = []
        for key in list(w.touched):
            demand = self._demands.pop(key, None)
            if demand is None:
                continue
            # A batch that aborts (and is redone) must not lose the demand it took; a newer
            # registration made meanwhile wins.
            w.on_abort.append(functools.partial(self._demands.setdefault, key, demand))
            messages = self._ops.receive(
                w, now, key[0], key[1], demand.max_messages, demand.visibility_timeout_s, demand.in_memory
            )
            if messages:
                post.append((demand.loop, functools.partial(demand.deliver, messages)))
                if len(messages) < demand.max_messages:
                    w.touched.discard(key)
            else:
                self._demands.setdefault(key, demand)  # still waiting
        return post

    # Queues -----------------------------------------------------------------

    async def create_queue(
        self, tenant: TenantId, name: QueueName, attributes: Mapping[str, Any]
    ) -> tuple[QueueInfo, bool]:
        return await self._write(
            lambda w, now: queue_ops.create_queue(
                w,
                now,
                tenant,
                name,
                attributes,
                self.max_replication_factor,
                self.max_partitions,
                self._ops.holds.held_count,
            )
        )

    async def get_queue(self, tenant: TenantId, name: QueueName) -> QueueInfo:
        def read(v: View) -> QueueInfo:
            record = queue_ops.find_queue(v, tenant, name)
            held = self._ops.holds.held_count
            return queue_ops.info(tenant, name, record, queue_ops.stats(v, record, self._clock(), held))

        return await self._read(read)

    async def list_queues(self, tenant: TenantId) -> list[QueueInfo]:
        held = self._ops.holds.held_count
        return await self._read(lambda v: queue_ops.list_queues(v, tenant, self._clock(), held))

    async def update_queue(self, tenant: TenantId, name: QueueName, changes: Mapping[str, Any]) -> QueueInfo:
        return await self._write(
            lambda w, now: queue_ops.update_queue(
                w,
                now,
                tenant,
                name,
                changes,
                self.max_replication_factor,
                self.max_partitions,
                self._ops.holds.held_count,
            )
        )

    async def delete_queue(self, tenant: TenantId, name: QueueName) -> None:
        await self._write(lambda w, now: self._ops.delete_queue(w, tenant, name))

    async def purge_queue(self, tenant: TenantId, name: QueueName) -> int:
        return await self._write(lambda w, now: self._ops.purge_queue(w, tenant, name))

    # Messages -----------------------------------------------------------------

    async def send(
        self, tenant: TenantId, queue: QueueName, messages: Sequence[NewMessage]
    ) -> list[SendResult | PushgateError]:
        return await self._write(lambda w, now: self._ops.send(w, now, tenant, queue, messages))

    async def receive(
        self,
        tenant: TenantId,
        queue: QueueName,
        max_messages: int,
        visibility_timeout_s: float | None = None,
    ) -> list[ReceivedMessage]:
        return await self._receive(tenant, queue, max_messages, visibility_timeout_s, in_memory=False)

    async def receive_in_memory(
        self,
        tenant: TenantId,
        queue: QueueName,
        max_messages: int,
        visibility_timeout_s: float | None = None,
    ) -> list[ReceivedMessage]:
        return await self._receive(tenant, queue, max_messages, visibility_timeout_s, in_memory=True)

    async def _receive(
        self,
        tenant: TenantId,
        queue: QueueName,
        max_messages: int,
        visibility_timeout_s: float | None,
        *,
        in_memory: bool,
    ) -> list[ReceivedMessage]:
        check_receive(max_messages, visibility_timeout_s)
        count = int(max_messages)
        return await self._write(
            lambda w, now: self._ops.receive(w, now, tenant, queue, count, visibility_timeout_s, in_memory)
        )

    async def ack(
        self, tenant: TenantId, receipts: Sequence[str], queue: QueueName | None = None
    ) -> AckResult:
        return await self._write(lambda w, now: self._ops.settle(w, now, tenant, receipts, queue, None))

    async def nack(
        self,
        tenant: TenantId,
        receipts: Sequence[str],
        delay_s: float = 0,
        queue: QueueName | None = None,
    ) -> AckResult:
        check_number("delay_s", delay_s, 0, MAX_VISIBILITY_S)
        return await self._write(lambda w, now: self._ops.settle(w, now, tenant, receipts, queue, delay_s))

    async def change_visibility(
        self, tenant: TenantId, queue: QueueName, receipt: str, timeout_s: float
    ) -> None:
        check_number("timeout_s", timeout_s, 0, MAX_VISIBILITY_S)
        await self._write(
            lambda w, now: self._ops.change_visibility(w, now, tenant, queue, receipt, timeout_s)
        )

    async def next_visible_at(self, tenant: TenantId, queue: QueueName) -> float | None:
        def read(v: View) -> float | None:
            record = queue_ops.find_queue(v, tenant, queue)
            ms = next_visible_ms(v, record.qid, int(self._clock() * 1000))
            # A message held in memory is visible again when its hold ends.
            held_ms = self._ops.holds.next_expiry_ms(record.qid)
            if held_ms is not None and (ms is None or held_ms < ms):
                ms = held_ms
            return None if ms is None else ms / 1000

        return await self._read(read)

    # Dead letters (backend_store.backend.DeadLetters) and storage use --------------

    async def peek(self, tenant: TenantId, queue: QueueName, max_messages: int) -> list[PeekedMessage]:
        check_number("max", max_messages, 1, MAX_RECEIVE_PER_CALL, integer=True)
        return await self._read(
            lambda v: dead_letter_ops.peek(
                v, tenant, queue, int(max_messages), self._clock(), self._ops.open_body
            )
        )

    async def redrive(self, tenant: TenantId, queue: QueueName, to: QueueName, max_messages: int) -> int:
        check_number("max", max_messages, 1, 100_000, integer=True)
        return await self._write(
            lambda w, now: dead_letter_ops.redrive(
                w, now, tenant, queue, to, int(max_messages), self._ops.held_now
            )
        )

    async def storage_usage(self) -> StorageUsage:
        env = self._require_env()
        return await asyncio.to_thread(env.usage)

    def commit_stats(self) -> CommitStats | None:
        return self._writer.commit_stats if self._writer is not None else None

    # Metadata -------------------------------------------------------------------

    async def meta_get(self, namespace: str, key: str) -> bytes | None:
        meta_key = _meta_key(namespace, key)
        return await self._read(lambda v: v.get(Db.META, meta_key))

    async def meta_put(self, namespace: str, key: str, value: bytes, *, only_if_absent: bool = False) -> bool:
        meta_key = _meta_key(namespace, key)

        def put(w: Writes, now: float) -> bool:
            if only_if_absent and w.get(Db.META, meta_key) is not None:
                return False
            w.put(Db.META, meta_key, value)
            return True

        return await self._write(put)

    async def meta_delete(self, namespace: str, key: str) -> bool:
        meta_key = _meta_key(namespace, key)
        return await self._write(lambda w, now: w.delete(Db.META, meta_key))

    async def meta_list(self, namespace: str, prefix: str = "") -> list[tuple[str, bytes]]:
        start = _meta_key(namespace, prefix)
        skip = len(namespace.encode()) + 1

        def read(v: View) -> list[tuple[str, bytes]]:
            out: list[tuple[str, bytes]] = []
            cursor = v.cursor(Db.META)
            if cursor.set_range(start):
                for key, value in cursor:
                    if not key.startswith(start):
                        break
                    out.append((key[skip:].decode(), value))
            return out

        return await self._read(read)

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

    # Replication: the ReplicaStore surface (backend_store/backend.py). Used by backend
    # nodes; the store itself knows no peers.

    @property
    def last_lsn(self) -> Lsn:
        return self._replication_log.last_lsn

    @property
    def epoch(self) -> Epoch:
        return self._replication_log.epoch

    @property
    def last_entry(self) -> tuple[Lsn, Epoch | None]:
        last, _, entry_epoch = self._replication_log.committed
        return last, entry_epoch

    async def read_replication_log(self, after: Lsn, limit: int = 1000) -> list[LogEntry]:
        """Committed entries after ``after``, oldest first."""
        return await self._read(lambda v: ReplicationLog.read(v.txn, v.dbs, after, limit))

    async def first_retained_lsn(self) -> Lsn | None:
        return await self._read(lambda v: ReplicationLog.first_lsn(v.txn, v.dbs))

    async def apply_replicated(self, entries: Sequence[LogEntry], epoch: Epoch | None = None) -> Lsn:
        """Apply a leader's entries in one commit (followers only); return the new last LSN."""
        return await self._write(lambda w, now: self._replication_log.apply(w, entries, epoch))

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

    # Internals ------------------------------------------------------------------

    def _require_env(self) -> Environment:
        if self._env is None:
            raise Unavailable("store is not started")
        return self._env

    async def _write(self, op: Callable[[Writes, float], T]) -> T:
        if self._writer is None:
            raise Unavailable("store is not started")
        return await self._writer.submit(op)

    async def _read(self, fn: Callable[[View], T]) -> T:
        env = self._require_env()
        return await asyncio.to_thread(env.read, lambda txn: fn(View(txn, env.dbs)))

    def _notify(self, touched: Touched) -> None:
        for tenant, queue in touched:
            for listener in self._listeners:
                try:
                    listener(TenantId(tenant), QueueName(queue))
                except Exception:
                    log.exception("store listener failed")

    def _check_store(self, w: Writes, now: float) -> None:
        """At start, one write for both checks: the store's format, then its keys."""
        self._check_format(w)
        self._check_keys(w)

    def _check_format(self, w: Writes) -> None:
        """Refuse a store a newer version wrote; mark an older (or new) one as this version's.
        The mark goes outside the logged writes: each replica keeps its own, and a re-seed
        copies the leader's."""
        meta = w.dbs[Db.META]
        raw = w.txn.get(_FORMAT, db=meta)
        found = read_u64(raw) if raw else 1
        if found > STORE_FORMAT:
            raise ConfigurationError(
                f"store {self.path} was written by a newer Pushgate (store format {found}); this "
                f"version reads formats up to {STORE_FORMAT}: run the newer version"
            )
        if found < STORE_FORMAT:
            w.txn.put(_FORMAT, u64(STORE_FORMAT), db=meta)

    def _check_keys(self, w: Writes) -> None:
        """Refuse to start without every key that sealed data here, or with a wrong one."""
        raw = w.get(Db.META, _KEY_CHECKS)
        checks: dict[str, bytes] = unpack(raw) if raw else {}
        keyring = self.options.keyring
        if keyring is None:
            if checks:
                raise ConfigurationError(
                    "this store holds encrypted data; start it with its encryption keys "
                    f"({', '.join(sorted(checks))})"
                )
            return
        for key_id in [k for k in checks if k not in keyring.key_ids]:
            if _sealed_with(w, key_id):
                raise ConfigurationError(f"encryption key {key_id!r} is needed to read this store")
            # Nothing sealed with it is left: the key is retired (a scan, but only on the
            # start-up that drops a key).
            del checks[key_id]
            w.put(Db.META, _KEY_CHECKS, pack(checks))
        for key_id, sealed in checks.items():
            try:
                ok = keyring.open(sealed) == _KEY_CHECK_PLAINTEXT
            except Unavailable:
                ok = False
            if not ok:
                raise ConfigurationError(
                    f"encryption key {key_id!r} is not the key this store was sealed with"
                )
        missing = keyring.key_ids - set(checks)
        if missing:
            for key_id in missing:
                checks[key_id] = keyring.seal_with(key_id, _KEY_CHECK_PLAINTEXT)
            w.put(Db.META, _KEY_CHECKS, pack(checks))

    async def sweep(self) -> int:
        """Drop messages past retention and expired dedupe entries now; return how many.

        What the sweeper runs every ``sweep_interval_s``. A backend node sets the interval
        to 0 and calls this on partitions it leads only: a follower's store changes only
        through the leader's log.
        """
        done = 0
        # Small transactions: keep going only while a sweep hits its budget.
        while (count := await self._write(lambda w, now: self._ops.sweep(w, now, _SWEEP_BUDGET))) > 0:
            done += count
            if count < _SWEEP_BUDGET:
                break
        return done

    async def _watch_hold_lock(self) -> None:
        """Hand the right to hold over when another process opens the store (its start waits
        for it), and take it back once this process is alone again (hold_lock.py)."""
        lock = self._hold_lock
        assert lock is not None
        ticks = 0
        while True:
            await asyncio.sleep(_HOLD_PROBE_S)
            ticks += 1
            try:
                if lock.holding:
                    if lock.others_present():  # two non-blocking flock calls
                        self._ops.allow_holds = False  # no receive holds from here on
                        written = await self._write(self._ops.write_held_as_received)
                        await asyncio.to_thread(lock.hand_over)
                        log.info("another process opened the store: %d held messages written", written)
                elif ticks % _REELECT_EVERY == 0 and await asyncio.to_thread(lock.reelect):
                    self._ops.allow_holds = True
            except PushgateError as exc:
                log.warning("hold lock: %s", exc.detail)
            except Exception:
                # Keep watching: a holder that stops looking would keep a newcomer waiting.
                log.exception("hold lock watch failed")

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(self.options.sweep_interval_s)
            try:
                await self.sweep()
            except PushgateError as exc:
                log.warning("sweep failed: %s", exc.detail)
