"""Disks and partition replica stores: a model of the LMDB store as replication sees it.

A node's disk (:class:`NodeDisk`) holds one :class:`ReplicaData` per partition directory:
the replica's log of ``(LSN, epoch, record)`` entries and its fence (the highest epoch it
has seen). Only what a commit made durable is there: a process killed mid-commit leaves the
disk as the last commit left it. Faults: a full disk (every commit fails), failed fsyncs
(the next N commits fail), a map that fills once (the commit fails and is retried at once
after the map grows, as ``group_commit.py`` does) and a slow disk.

:class:`SimReplicaStore` is one open replica in a node process. It is the
:class:`~backend_store.backend.ReplicaStore` the production replication code
(``log_shipping.py``) drives, the :class:`~backend_store.cluster.node.hosted_store.HostedStore`
a production ``PartitionHost`` holds (queues with their attributes, the replica's label,
wake-ups), and the two Backend operations the simulated gateways use (``send`` and
``peek``), with the group-commit writer's rules:

- operations queued while a commit runs go together in the next one, which appends one log
  entry for all their writes (the next LSN, the store's fence as its epoch), only while the
  fence is the term this store last started (``raise_epoch``; the fence as opened before
  that): once a newer leader's entries or truncation raised it, its own writes fail
  (``replication_log.py``'s ``NotLeading``);
- with early shipping on, that entry is offered to the leader **before** the commit
  (``ship_early``); if the commit then fails, ``lost(lsn)`` is called and the term ends in
  the writer: no entry of that epoch is committed after it, the retry of the batch
  included; writes answer ``unavailable`` until the next term's higher epoch
  (``group_commit.py``'s ``_lost_epoch``, the fix of issue 24's defect 4);
- ``apply_replicated`` / ``raise_epoch`` / ``truncate_after`` follow
  ``replication_log.py``: the fence only rises, an older sender is refused with
  ``StaleEpoch``, a gap with ``ReplicationGap``.

A log record is msgpack of ``[stamp, ops]``: the store clock when the commit was made and
the operations (a send carries its group, dedupe id and body), so the same operations
committed at another moment are another record, as with LMDB's bytes. Message state is the
replay of the log (sends deduplicated by dedupe id), which is what ``peek`` shows.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import msgpack

from backend_store.attributes import parse_attributes
from backend_store.backend import ChangeListener
from backend_store.cluster.coordination.layout import PartitionRecord, ServedSet
from backend_store.cluster.coordination.timeline import RecordMark
from backend_store.cluster.node.node_identity import pack_label, unpack_label
from backend_store.cluster.node.receipts import KeptReceipt
from backend_store.cluster.node.reconcile import ReplicaLabel
from backend_store.errors import (
    PushgateError,
    QueueExists,
    QueueNotFound,
    ReplicationGap,
    StaleEpoch,
    Unavailable,
)
from backend_store.types import (
    Epoch,
    LogEntry,
    Lsn,
    MessageId,
    NewMessage,
    PeekedMessage,
    QueueAttributes,
    QueueInfo,
    QueueName,
    SendResult,
    TenantId,
)

from .kernel import Process


class DiskObserver(Protocol):
    """Told of every durable change (the invariants)."""

    def appended(self, node: str, partition: int, entries: Sequence[LogEntry]) -> None: ...

    def truncated(self, node: str, partition: int, after: Lsn, dropped: Sequence[LogEntry]) -> None: ...

    def deleting(self, node: str, partition: int, data: ReplicaData, why: str) -> None: ...

    def commit_lost(self, node: str, partition: int, entry: LogEntry, why: str) -> None: ...


@dataclass(slots=True)
class ReplicaData:
    """What one partition directory holds durably."""

    partition: int
    entries: list[LogEntry] = field(default_factory=list)  # LSN n at index n-1
    fence: int = 0
    label: ReplicaLabel | None = None  # kept in the store, outside the log (node_identity.py)

    @property
    def last_lsn(self) -> Lsn:
        return Lsn(len(self.entries))

    def holds(self, lsn: int, epoch: int, record: bytes) -> bool:
        if lsn < 1 or lsn > len(self.entries):
            return False
        entry = self.entries[lsn - 1]
        return entry.epoch == epoch and entry.record == record


class NodeDisk:
    """A node's data directory; it outlives the node's processes."""

    def __init__(self, node: str, rng: random.Random, observer: DiskObserver) -> None:
        self.node = node
        self.rng = rng
        self.observer = observer
        self.partitions: dict[int, ReplicaData] = {}
        # DATA/cluster-id (node/node_identity.py): written once, when the node adopts or
        # creates its cluster's id; gone only with the whole directory (a replaced node).
        self.cluster_id: str | None = None
        self.full = False  # every commit fails (ENOSPC)
        self.failing_fsyncs = 0  # the next N commits fail (EIO)
        self.map_full_once = False  # the next commit fails with MapFullError, then is retried
        self.slow_s = 0.0
        # DATA/receipts/ (node/receipts.py): what was deleted on moves' tombstones.
        self.receipts: dict[int, KeptReceipt] = {}
        # DATA/records/ (node/remembered_records.py): the record each replica was served on.
        self.remembered: dict[int, PartitionRecord] = {}
        self.marks: dict[int, RecordMark] = {}  # DATA/records/<id>.mark, beside each record
        # DATA/sets/ (node/served_sets.py): the voting set each replica was served on.
        self.served_sets: dict[int, ServedSet] = {}

    def open(self, partition: int) -> ReplicaData:
        found = self.partitions.get(partition)
        if found is None:
            found = self.partitions[partition] = ReplicaData(partition)
        return found

    def delete(self, partition: int, why: str) -> None:
        found = self.partitions.get(partition)
        if found is not None:
            self.observer.deleting(self.node, partition, found, why)
            del self.partitions[partition]

    def fsync_time(self) -> float:
        return 0.001 + self.rng.random() * 0.003 + self.slow_s

    def commit_fault(self) -> str | None:
        """Why the commit being made now fails (None: it does not)."""
        if self.full:
            return "disk full"
        if self.failing_fsyncs > 0:
            self.failing_fsyncs -= 1
            return "fsync failed"
        if self.map_full_once:
            self.map_full_once = False
            return "map full"
        return None


_Op = Callable[["_Batch"], Any]


@dataclass(slots=True)
class _Batch:
    """One commit being made: the changes of its operations, staged over the durable log
    (``base[:keep]`` then ``added``; nothing is copied)."""

    base: list[LogEntry]
    now: float
    fence: int
    term: int  # the term this store's own writes are logged in (replication_log.py)
    keep: int = 0
    added: list[LogEntry] = field(default_factory=list)
    ops: list[list[Any]] = field(default_factory=list)  # logged writes: one entry at the end
    pending_sends: dict[tuple[str, str, str | None], tuple[str, int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.keep = len(self.base)

    def length(self) -> int:
        return self.keep + len(self.added)

    def changes(self) -> tuple[int, int, int, int]:
        return (len(self.ops), len(self.added), self.keep, self.fence)

    def truncate(self, lsn: int) -> int:
        """Drop the entries after ``lsn``; return how many."""
        count = self.length() - lsn
        if lsn >= self.keep:
            del self.added[lsn - self.keep :]
        else:
            self.keep, self.added = lsn, []
        return count

    def count_sends(self, tenant: str, queue: str) -> int:
        return sum(1 for op in self.ops if op[0] == "s" and op[1] == tenant and op[2] == queue)


class SimReplicaStore:
    """One open partition replica (a node process's handle on a :class:`ReplicaData`)."""

    def __init__(self, proc: Process, disk: NodeDisk, partition: int, clock: Callable[[], float]) -> None:
        self.proc = proc
        self.disk = disk
        self.partition = partition
        self.data = disk.open(partition)
        self._clock = clock
        self._queue: list[tuple[_Op, asyncio.Future[Any]]] = []
        self._wake = asyncio.Event()
        self._offer: Callable[[LogEntry], None] | None = None
        self._lost: Callable[[Lsn], None] | None = None
        # The newest epoch whose early-shipped entry failed to commit (group_commit.py).
        self._lost_epoch: Epoch | None = None
        # ``ReplicationLog.term``: the last term started here, or the fence as opened.
        self._term = self.data.fence
        self._writer = proc.spawn(self._write_loop(), f"writer p{partition}")
        self.closed = False
        self._cache: tuple[int, MessageState, LogEntry | None] = (0, MessageState(), None)
        self._listeners: list[ChangeListener] = []

    # ReplicaStore: reads ---------------------------------------------------------------

    @property
    def last_lsn(self) -> Lsn:
        return self.data.last_lsn

    @property
    def epoch(self) -> Epoch:
        return Epoch(self.data.fence)

    @property
    def last_entry(self) -> tuple[Lsn, Epoch | None]:
        entries = self.data.entries
        return (Lsn(len(entries)), entries[-1].epoch) if entries else (Lsn(0), None)

    async def read_replication_log(self, after: Lsn, limit: int = 1000) -> list[LogEntry]:
        return list(self.data.entries[max(0, after) : max(0, after) + limit])

    async def first_retained_lsn(self) -> Lsn | None:
        return Lsn(1) if self.data.entries else None

    def hold_log_from(self, lsn: Lsn | None) -> None:
        pass  # the model never trims its log

    async def snapshot(self, target: Path) -> None:
        raise Unavailable("the simulation never re-seeds (its logs are never trimmed)")

    def ship_early(
        self, offer: Callable[[LogEntry], None] | None, lost: Callable[[Lsn], None] | None
    ) -> None:
        self._offer, self._lost = offer, lost

    # ReplicaStore: writes (through the writer) ---------------------------------------------

    async def apply_replicated(self, entries: Sequence[LogEntry], epoch: Epoch | None = None) -> Lsn:
        def op(b: _Batch) -> Lsn:
            last = Lsn(b.length())
            sender = epoch if epoch is not None else (entries[-1].epoch if entries else b.fence)
            if sender < b.fence:
                raise StaleEpoch(f"a leader of epoch {sender} is older than {b.fence}")
            previous = 0
            for entry in entries:
                if entry.epoch < previous or entry.epoch > sender:
                    raise StaleEpoch(f"entry {entry.lsn} has epoch {entry.epoch}, out of order for {sender}")
                if entry.lsn != last + 1:
                    raise ReplicationGap(f"replication gap: have {last}, got {entry.lsn}")
                last, previous = entry.lsn, entry.epoch
            b.added.extend(entries)
            b.fence = max(b.fence, sender)
            return last

        result: Lsn = await self._submit(op)
        return result

    async def raise_epoch(self, epoch: Epoch) -> Epoch:
        def op(b: _Batch) -> Epoch:
            if epoch < b.fence:
                raise StaleEpoch(f"epoch {epoch} is older than {b.fence}")
            b.fence = b.term = epoch
            return epoch

        result: Epoch = await self._submit(op)
        return result

    async def truncate_after(self, lsn: Lsn, epoch: Epoch | None = None) -> int:
        def op(b: _Batch) -> int:
            if epoch is not None and epoch < b.fence:
                raise StaleEpoch(f"a leader of epoch {epoch} is older than {b.fence}")
            if lsn >= b.length():
                return 0
            if lsn < 0:
                raise ReplicationGap("cannot truncate below LSN 0")
            b.fence = max(b.fence, epoch or b.fence)
            return b.truncate(lsn)

        result: int = await self._submit(op)
        return result

    # Backend operations the gateways use ------------------------------------------------

    async def check_writable(self) -> None:
        """A leader's no-op entry in its new term (a heartbeat write, logged)."""
        await self._submit(lambda b: b.ops.append(["h"]))

    async def create_queue(
        self, tenant: TenantId, name: QueueName, attributes: Mapping[str, Any]
    ) -> tuple[QueueInfo, bool]:
        """A queue with its attributes, logged; as the store's: one with the same attributes
        is answered as it is (created False), ``QueueExists`` if they differ."""
        attrs = dict(attributes)
        created = True

        def op(b: _Batch) -> None:
            nonlocal created
            held = self._state_of(b.base).created.get((tenant, name))
            if held is not None:
                if parse_attributes(held) != parse_attributes(attrs):
                    raise QueueExists(f"queue {name!r} exists with different attributes")
                created = False
                return
            b.ops.append(["q", tenant, name, attrs])

        await self._submit(op)
        return QueueInfo(tenant, name, 0.0, parse_attributes(attrs)), created

    async def get_queue(self, tenant: TenantId, name: QueueName) -> QueueInfo:
        attrs = self._state_of(self.data.entries).created.get((tenant, name))
        if attrs is None:
            raise QueueNotFound(f"queue {name!r} does not exist")
        return QueueInfo(tenant, name, 0.0, parse_attributes(attrs))

    async def queue_attributes(
        self,
        keys: Collection[tuple[str, str]],
        likely: Mapping[tuple[str, str], QueueAttributes] | None = None,
    ) -> dict[tuple[str, str], QueueAttributes | None]:
        """Several queues' attributes, as of one state of the log (production's one read);
        one holding what ``likely`` gives for it answered with that object, as production."""
        created = self._state_of(self.data.entries).created
        guesses = likely or {}
        out: dict[tuple[str, str], QueueAttributes | None] = {}
        for key in keys:
            attrs = created.get(key)
            held = None if attrs is None else parse_attributes(attrs)
            out[key] = guesses[key] if held is not None and guesses.get(key) == held else held
        return out

    async def update_queue(self, tenant: TenantId, name: QueueName, changes: Mapping[str, Any]) -> QueueInfo:
        """The queue's attributes changed, logged."""
        patch = dict(changes)

        def op(b: _Batch) -> dict[str, Any]:
            attrs = self._state_of(b.base).created.get((tenant, name))
            if attrs is None:
                raise QueueNotFound(f"queue {name!r} does not exist")
            b.ops.append(["u", tenant, name, patch])
            return {**attrs, **patch}

        attrs: dict[str, Any] = await self._submit(op)
        return QueueInfo(tenant, name, 0.0, parse_attributes(attrs))

    async def delete_queue(self, tenant: TenantId, name: QueueName) -> None:
        """The queue and its messages go (a pool partition's queue marked deleting)."""

        def op(b: _Batch) -> None:
            if (tenant, name) not in self._state_of(b.base).created:
                raise QueueNotFound(f"queue {name!r} does not exist")
            b.ops.append(["d", tenant, name])

        await self._submit(op)

    async def send(
        self, tenant: TenantId, queue: QueueName, messages: Sequence[NewMessage]
    ) -> list[SendResult | PushgateError]:
        def op(b: _Batch) -> list[SendResult | PushgateError]:
            assert b.keep == len(b.base) and not b.added, "a leader's batch neither applies nor truncates"
            state = self._state_of(b.base)
            if (tenant, queue) not in state.created:
                # As the LMDB store: a queue a leader serves was made in an earlier commit.
                raise QueueNotFound(f"queue {queue!r} does not exist")
            pending = b.pending_sends
            out: list[SendResult | PushgateError] = []
            lsn = b.length() + 1
            for m in messages:
                key = (tenant, queue, m.dedupe_id)
                held = state.dedupe.get(key) if m.dedupe_id else None
                if held is not None:
                    out.append(SendResult(MessageId(held.id), held.seq, duplicate=True))
                    continue
                if m.dedupe_id and key in pending:
                    mid, seq = pending[key]
                    out.append(SendResult(MessageId(mid), seq, duplicate=True))
                    continue
                b.ops.append(["s", tenant, queue, m.group_id, m.dedupe_id, m.body, b.now])
                seq = len(state.queues.get((tenant, queue), ())) + b.count_sends(tenant, queue)
                mid = f"m{lsn}.{seq}"
                if m.dedupe_id:
                    pending[key] = (mid, seq)
                out.append(SendResult(MessageId(mid), seq))
            return out

        result: list[SendResult | PushgateError] = await self._submit(op)
        return result

    async def peek(self, tenant: TenantId, queue: QueueName, max_messages: int) -> list[PeekedMessage]:
        state = self._state_of(self.data.entries)
        return [
            PeekedMessage(queue, MessageId(m.id), m.seq, m.body, True, {}, m.group, m.sent_at, 0, "visible")
            for m in state.queues.get((tenant, queue), [])[:max_messages]
        ]

    def _state_of(self, entries: list[LogEntry]) -> MessageState:
        """The message state of ``entries`` (kept up to date as the log grows)."""
        count, state, tail = self._cache
        if count > len(entries) or (count and entries[count - 1] is not tail):
            count, state = 0, MessageState()  # truncated or replaced: replay from the start
        for entry in entries[count:]:
            _, ops = msgpack.unpackb(entry.record, raw=False)
            _apply_ops(state, ops, entry.lsn)
        self._cache = (len(entries), state, entries[-1] if entries else None)
        return state

    # What the node asks of a store besides its queues ------------------------------------

    def add_listener(self, listener: ChangeListener) -> None:
        """Wake-ups after a commit that sent (to the leader's gateways, as ``Notify``)."""
        self._listeners.append(listener)

    async def sweep(self) -> int:
        return 0  # nothing expires in the model (no retention, no dedupe window)

    async def replica_label(self) -> bytes | None:
        return pack_label(self.data.label) if self.data.label is not None else None

    async def set_replica_label(self, value: bytes) -> None:
        """Kept outside the log, as the LMDB store does (node_identity.py)."""
        await self.proc.awake()
        if self.closed or not self.proc.alive:
            raise Unavailable("store is closed")
        self.data.label = unpack_label(value)

    # The writer ------------------------------------------------------------------------------

    async def _submit(self, op: _Op) -> Any:
        if self.closed or not self.proc.alive:
            raise Unavailable("store is closed")
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue.append((op, future))
        self._wake.set()
        return await future

    async def _write_loop(self) -> None:
        while True:
            while not self._queue:
                self._wake.clear()
                await self._wake.wait()
            await self.proc.awake()
            batch, self._queue = self._queue, []
            await self._commit(batch)

    async def _commit(self, batch: list[tuple[_Op, asyncio.Future[Any]]]) -> None:
        disk, data = self.disk, self.data
        while True:
            staged = _Batch(data.entries, self._clock(), data.fence, self._term)
            outcomes: list[tuple[bool, Any]] = []
            for op, _ in batch:
                before = staged.changes()
                try:
                    outcomes.append((True, op(staged)))
                except PushgateError as exc:
                    # Refused before it wrote anything (the group-commit rule).
                    assert before == staged.changes()
                    outcomes.append((False, exc))
            appended: LogEntry | None = None
            if staged.ops and not self._logs_own_writes(staged):
                # ``NotLeading``: a newer leader's entries raised the fence past this
                # store's term; nothing of the batch is logged (replication_log.py).
                error = Unavailable(
                    f"not the leader any more: term {staged.term} is over (fence {staged.fence})"
                )
                outcomes = [(False, error)] * len(batch)
                break
            if staged.ops:
                lsn = Lsn(staged.length() + 1)
                record = msgpack.packb([staged.now, staged.ops], use_bin_type=True)
                appended = LogEntry(lsn, Epoch(staged.fence), record)
                if self._lost_epoch is not None and appended.epoch <= self._lost_epoch:
                    # Outcome unknown, not refused: an earlier attempt of this very batch
                    # may have been shipped to followers.
                    error = Unavailable(
                        f"a write of epoch {self._lost_epoch} was shipped but did not commit here;"
                        " this term takes no more writes (the next leader's does)"
                    )
                    outcomes = [(False, error)] * len(batch)
                    break
                staged.added.append(appended)
                if self._offer is not None:
                    self._offer(appended)  # before the commit: followers write it meanwhile
            await asyncio.sleep(disk.fsync_time())
            if not self.proc.alive or self.closed:
                return  # killed mid-commit: nothing of it is on the disk
            fault = disk.commit_fault()
            if fault is None:
                self._make_durable(staged)
                self._woken(staged.ops)
                break
            shipped = appended is not None and self._offer is not None
            if (
                appended is not None
                and shipped
                and (self._lost_epoch is None or appended.epoch > self._lost_epoch)
            ):
                self._lost_epoch = appended.epoch
            if appended is not None and self._lost is not None:
                self.disk.observer.commit_lost(self.disk.node, self.partition, appended, fault)
                self._lost(appended.lsn)
            if fault == "map full":
                continue  # the map grows and the whole batch runs again (group_commit.py)
            error = Unavailable(fault)
            outcomes = [(False, error)] * len(batch)
            break
        for (_, future), (ok, value) in zip(batch, outcomes, strict=True):
            if future.done():
                continue
            if ok:
                future.set_result(value)
            else:
                future.set_exception(value)

    def _woken(self, ops: list[list[Any]]) -> None:
        for tenant, queue in dict.fromkeys((op[1], op[2]) for op in ops if op[0] == "s"):
            for listener in self._listeners:
                listener(TenantId(tenant), QueueName(queue))

    @staticmethod
    def _logs_own_writes(staged: _Batch) -> bool:
        """Whether the batch may log this store's own writes: its fence is still the term it
        started last (``ReplicationLog.append``)."""
        return staged.fence == staged.term

    def _make_durable(self, staged: _Batch) -> None:
        """Appends extend the log in place; a truncation makes a new list (so a copy of
        the list taken earlier, the oracle's record of a leader's log, stays as it was)."""
        data = self.data
        assert staged.base is data.entries, "one writer per replica"
        if staged.keep < len(data.entries):
            dropped = data.entries[staged.keep :]
            data.entries = data.entries[: staged.keep]
            self.disk.observer.truncated(self.disk.node, self.partition, Lsn(staged.keep), dropped)
        data.fence = staged.fence
        self._term = staged.term
        if staged.added:
            data.entries.extend(staged.added)
            self.disk.observer.appended(self.disk.node, self.partition, staged.added)

    async def close(self) -> None:
        self.closed = True
        self._writer.cancel()
        for _, future in self._queue:
            if not future.done():
                future.set_exception(Unavailable("store is closed"))
        self._queue = []


# Message state: the replay of the log ----------------------------------------------------


@dataclass(slots=True)
class StoredMessage:
    id: str
    seq: int
    group: str | None
    dedupe: str | None
    body: bytes
    sent_at: float


@dataclass(slots=True)
class MessageState:
    queues: dict[tuple[str, str], list[StoredMessage]] = field(default_factory=dict)
    dedupe: dict[tuple[str, str, str | None], StoredMessage] = field(default_factory=dict)
    created: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)  # with attributes


def _apply_ops(state: MessageState, ops: list[list[Any]], lsn: int) -> None:
    for op in ops:
        if op[0] == "q":
            state.created[(op[1], op[2])] = op[3]
        elif op[0] == "u":
            key = (op[1], op[2])
            state.created[key] = {**state.created[key], **op[3]}
        elif op[0] == "d":
            key = (op[1], op[2])
            state.created.pop(key, None)
            state.queues.pop(key, None)
            for dedupe in [k for k in state.dedupe if k[:2] == key]:
                del state.dedupe[dedupe]
        elif op[0] == "s":
            _, tenant, queue, group, dedupe, body, sent_at = op
            if dedupe is not None and (tenant, queue, dedupe) in state.dedupe:
                continue
            messages = state.queues.setdefault((tenant, queue), [])
            message = StoredMessage(
                f"m{lsn}.{len(messages) + 1}", len(messages) + 1, group, dedupe, body, sent_at
            )
            messages.append(message)
            if dedupe is not None:
                state.dedupe[(tenant, queue, dedupe)] = message


def replay(entries: Sequence[LogEntry]) -> MessageState:
    """The message state a replica's log stands for."""
    state = MessageState()
    for entry in entries:
        _, ops = msgpack.unpackb(entry.record, raw=False)
        _apply_ops(state, ops, entry.lsn)
    return state
