"""The embedded backend: LMDB on local disk behind the :class:`Backend` interface.

Writes go through one :class:`GroupCommitWriter` thread; reads run in short read
transactions on worker threads. See ``backend_store/backend.py`` for the contract and
``ARCHITECTURE.md`` for the key layout.

:class:`LmdbBackend` is the store in every role it plays, each a class of its own module on
one core (``store_core.py`` says which): this module is its :class:`Backend` role (queues,
messages, dead letters, its life cycle and the checks it makes at start).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..attributes import check_number, check_receive
from ..backend import ChangeListener, EventListener, MessageEvent
from ..commit_stats import CommitStats
from ..encryption import Keyring
from ..errors import ConfigurationError, PushgateError, Unavailable
from ..limits import MAX_RECEIVE_PER_CALL, MAX_VISIBILITY_S
from ..options import StoreOptions
from ..types import (
    AckResult,
    NewMessage,
    PeekedMessage,
    QueueAttributes,
    QueueInfo,
    QueueName,
    QueueStats,
    ReceivedMessage,
    SendResult,
    StorageUsage,
    TenantId,
)
from . import checkpoint, dead_letter_ops, queue_ops
from .demands import StandingDemands
from .environment import Db, Environment, Touched, View, Writes
from .group_commit import GroupCommitWriter
from .hold_hand_over import HoldHandOver
from .keys import read_u64, u64
from .message_ops import next_visible_ms
from .metadata import MetadataRole
from .records import MessageRecord, pack, unpack
from .replica import ReplicaRole
from .room import RoomGauge, default_reserve
from .sweeper import Sweeper

log = logging.getLogger("pushgate.store")

_KEY_CHECKS = b"\0sys\0key_checks"
# The layout this version writes (docs/store.md, "How a message is stored"): 1, every message
# with a state record (no marker); 2, a state record only once the state changed. A store
# marked newer than this is refused at start, so a rollback cannot strand what a newer
# version wrote (versions before the marker cannot check it).
STORE_FORMAT = 2
FORMAT_KEY = b"\0sys\0format"  # the store format record (backup.py reads it too)
_HEARTBEAT = b"\0sys\0heartbeat"
_KEY_CHECK_PLAINTEXT = b"pushgate key check"


def _sealed_with(v: View, key_id: str) -> bool:
    """Whether any stored message body is sealed with ``key_id``."""
    for raw in v.cursor(Db.MSGS).iternext(keys=False, values=True):
        record = MessageRecord.decode(raw)
        if record.sealed and Keyring.key_id_of(record.body) == key_id:
            return True
    return False


class LmdbBackend(StandingDemands, MetadataRole, ReplicaRole, Sweeper, HoldHandOver):
    """The embedded store (``lmdb:///path``)."""

    # A partition store of a backend node raises these (one store is one partition replica).
    max_replication_factor = 1
    max_partitions = 1

    def __init__(self, path: Path, options: StoreOptions) -> None:
        super().__init__(path, options)
        self._listeners: list[ChangeListener] = []
        self._early_listeners: list[ChangeListener] = []
        self._event_listeners: list[EventListener] = []
        self._max_batch = options.max_batch

    # Life cycle -------------------------------------------------------------

    async def start(self) -> None:
        if self._env is not None:
            return
        # A store alone with its files journals: one sync per commit (checkpoint.py). A
        # standalone store is alone while it holds the hold lock (hold_lock.py); a node's
        # partition replica always is (its node's data directory is its node's alone).
        alone = await self._elect_holder() or self._replication_log.keep > 0
        journaled = alone and self._may_journal()
        open_env = functools.partial(
            Environment,
            map_size=self.options.map_size,
            max_map_size=self.options.max_map_size,
            sync_meta=self._replication_log.keep > 0,
        )
        try:
            node_journal = self._node_journal() if journaled else None
            if node_journal is not None:
                # Every replica beside it recovered from the node's journal before any opens.
                await asyncio.to_thread(node_journal.recover, functools.partial(open_env, journaled=False))
            saved = await asyncio.to_thread(checkpoint.restore_meta_pages, self.path) if journaled else None
            env = await asyncio.to_thread(open_env, self.path, journaled=journaled)
        except BaseException:
            self._release_hold_lock()
            raise
        reserve = self.options.disk_reserve_bytes
        if reserve is None:
            reserve = default_reserve(self.path, env.max_map_size)
        self._reserve = reserve
        try:
            if saved is not None:
                await asyncio.to_thread(checkpoint.replay, env, saved)
        except BaseException:
            self._release_hold_lock()
            await asyncio.to_thread(env.close)
            raise
        if not journaled:
            await self._share_unless_holder(env)
        await asyncio.to_thread(env.read, lambda txn: self._replication_log.load(txn, env.dbs))
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
            on_commit_start=self._commit_starts,
            room_gauge=RoomGauge(env, reserve) if reserve else None,
            thread=self.options.commit_thread,
        )
        self._writer.start()
        try:
            if journaled:
                # The checkpoint every commit of this run is journaled after, taken on the
                # commit thread (a node's replicas share it, and their journal).
                await asyncio.to_thread(self._writer.begin_journaling, lambda: self._journaling_of(env))
            await self._write(self._check_store)
        except BaseException:
            await self.close()
            raise
        self._start_sweeping()
        self._start_hold_watch()

    async def close(self) -> None:
        await self._stop_hold_watch()
        if self._writer is not None and len(self._ops.holds):
            # Write the counts of deliveries held in memory: only a crash loses them.
            with contextlib.suppress(PushgateError):
                await self._write(self._ops.write_held_counts)
        await self._stop_sweeping()
        if self._writer is not None:
            await asyncio.to_thread(self._writer.stop)
            self._writer = None
        if self._env is not None:
            env, self._env = self._env, None
            # Off the event loop: it waits for reads still running on worker threads.
            await asyncio.to_thread(env.close)
        self._release_hold_lock()

    async def check_writable(self) -> None:
        await self._write(lambda w, now: w.put(Db.META, _HEARTBEAT, pack(now)))

    def add_listener(self, listener: ChangeListener) -> None:
        self._listeners.append(listener)

    def add_early_listener(self, listener: ChangeListener) -> None:
        """backend.EarlyChanges: told as the commit begins, for other processes only."""
        self._early_listeners.append(listener)

    def _commit_starts(self, touched: Touched) -> None:
        # Writer thread: one hop to the loop, only when somebody listens.
        if self._early_listeners and self._loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody to tell
                self._loop.call_soon_threadsafe(_tell, self._early_listeners, frozenset(touched))

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

    async def queue_attributes(
        self,
        keys: Collection[tuple[str, str]],
        likely: Mapping[tuple[str, str], QueueAttributes] | None = None,
    ) -> dict[tuple[str, str], QueueAttributes | None]:
        """Several queues' attributes by (tenant, name), in one read transaction (None: no
        such queue). A pool partition's new term checks every queue it holds at once: a read
        per queue cost a thread hop each, 0.4-0.7 s of a failover at 125 queues a partition
        (docs/cluster.md, "Shared partitions"). ``likely``: what each probably holds; a
        queue holding exactly that is answered with that object (``attributes_by_key``)."""
        wanted = list(keys)
        return await self._read(lambda v: queue_ops.attributes_by_key(v, wanted, likely))

    async def list_queues(
        self, tenant: TenantId, *, after: str = "", limit: int | None = None, prefix: str = ""
    ) -> list[QueueInfo]:
        held = self._ops.holds.held_count
        return await self._read(
            lambda v: queue_ops.list_queues(
                v, tenant, self._clock(), held, after=after, limit=limit, name_prefix=prefix
            )
        )

    async def queue_stats(self, tenant: TenantId, names: Sequence[QueueName]) -> dict[QueueName, QueueStats]:
        """Several queues' stats in one read transaction (a shared partition answers a page
        of ``GET /v1/queues`` with one request: docs/cluster.md, "Shared partitions")."""
        held = self._ops.holds.held_count
        return await self._read(lambda v: queue_ops.stats_of(v, tenant, names, self._clock(), held))

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

    async def send_queues(
        self, tenant: TenantId, sends: Sequence[tuple[QueueName, Sequence[NewMessage]]]
    ) -> list[list[SendResult | PushgateError] | PushgateError]:
        """Sends to several queues as one writer operation (a pool partition's leader serving
        a gateway's ``send_queues``, cluster/protocol/ops.py): one hand-over to the writer
        thread instead of one a queue. A queue this store does not hold is that entry's
        ``QueueNotFound``."""
        return await self._write(lambda w, now: self._ops.send_queues(w, now, tenant, sends))

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
        # Not durable (docs/store.md, "Durability"): a receive a machine crash undoes only
        # delivers its messages again, which at-least-once allows.
        return await self._write(
            lambda w, now: self._ops.receive(w, now, tenant, queue, count, visibility_timeout_s, in_memory),
            durable=False,
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

    # Internals ------------------------------------------------------------------

    def _notify(self, touched: Touched) -> None:
        _tell(self._listeners, touched)

    def _check_store(self, w: Writes, now: float) -> None:
        """At start, one write for both checks: the store's format, then its keys."""
        self._check_format(w)
        self._check_keys(w)

    def _check_format(self, w: Writes) -> None:
        """Refuse a store a newer version wrote; mark an older (or new) one as this version's.
        The mark goes outside the logged writes: each replica keeps its own, and a re-seed
        copies the leader's."""
        meta = w.dbs[Db.META]
        raw = w.txn.get(FORMAT_KEY, db=meta)
        found = read_u64(raw) if raw else 1
        if found > STORE_FORMAT:
            raise ConfigurationError(
                f"store {self.path} was written by a newer Pushgate (store format {found}); this "
                f"version reads formats up to {STORE_FORMAT}: run the newer version"
            )
        if found < STORE_FORMAT:
            w.txn.put(FORMAT_KEY, u64(STORE_FORMAT), db=meta)

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


def _tell(listeners: Sequence[ChangeListener], touched: Collection[tuple[str, str]]) -> None:
    for tenant, queue in touched:
        for listener in listeners:
            try:
                listener(TenantId(tenant), QueueName(queue))
            except Exception:
                log.exception("store listener failed")
