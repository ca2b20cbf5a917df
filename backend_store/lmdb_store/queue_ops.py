"""Queue records: create, look up, change, delete, purge, and stats.

Functions of a :class:`View` (reads) or :class:`Writes` (the writer thread) and a
clock reading; the engine wires them to the Backend interface.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from ..attributes import apply_patch, attributes_from_record, check_queue_name, parse_attributes
from ..errors import InvalidRequest, QueueExists, QueueNotFound
from ..types import QueueAttributes, QueueInfo, QueueName, QueueStats, TenantId
from .environment import Db, View, Writes
from .keys import message_key, queue_key, read_u64, split_visibility_key, tenant_prefix, u64, visibility_key
from .records import DeliveryState, MessageRecord, QueueRecord, pack
from .visibility import to_ms

_NEXT_QID = b"\0sys\0next_qid"


def find_queue(v: View, tenant: str, name: str) -> QueueRecord:
    """A queue's record; in the writer, the batch's cached copy (change it, then :func:`save_queue`)."""
    key = queue_key(tenant, name)
    if isinstance(v, Writes):
        record = v.queue_cache.get(key)
        if record is not None:
            return record
    raw = v.get(Db.QUEUES, key)
    if raw is None:
        raise QueueNotFound(f"queue {name!r} does not exist")
    record = QueueRecord.decode(raw)
    if isinstance(v, Writes):
        v.queue_cache[key] = record
    return record


def save_queue(w: Writes, tenant: str, name: str, record: QueueRecord) -> None:
    """Mark a record changed; the writer stores it once when the batch ends."""
    key = queue_key(tenant, name)
    w.queue_cache[key] = record
    w.dirty_queues[key] = record
    w.queue_saves += 1


def queue_by_qid(v: View, qid: int) -> tuple[str, str, QueueRecord] | None:
    """Find a queue by its internal id (receipts carry it); None if it was deleted."""
    raw = v.get(Db.QIDS, u64(qid))
    if raw is None:
        return None
    tenant, _, name = raw.decode().partition("\0")
    try:
        record = find_queue(v, tenant, name)
    except QueueNotFound:
        return None
    return (tenant, name, record) if record.qid == qid else None


def stored_record_at(w: Writes, key: bytes) -> bytes | None:
    """The bytes of the queue record at ``key`` as the last commit wrote them (None: no such
    queue, or this batch changed its record and has not written it yet)."""
    return None if key in w.dirty_queues else w.get(Db.QUEUES, key)


def attributes_of(record: QueueRecord) -> QueueAttributes:
    # Every operation needs the attributes; parsing them each time showed in profiles.
    if record.parsed is None:
        record.parsed = attributes_from_record(record.attributes)
    return record.parsed


def _check_links(
    v: View, tenant: str, name: str, attrs: QueueAttributes, max_replication: int, max_partitions: int
) -> None:
    if attrs.replication_factor > max_replication:
        raise InvalidRequest(f"replication_factor must be at most {max_replication} on this store")
    if attrs.partitions > max_partitions:
        raise InvalidRequest(f"partitions must be at most {max_partitions} on this store")
    if attrs.dead_letter_queue is not None:
        if attrs.dead_letter_queue == name:
            raise InvalidRequest("a queue cannot be its own dead_letter_queue")
        if v.get(Db.QUEUES, queue_key(tenant, attrs.dead_letter_queue)) is None:
            raise InvalidRequest(f"dead_letter_queue {attrs.dead_letter_queue!r} does not exist")


def create_queue(
    w: Writes,
    now: float,
    tenant: str,
    name: str,
    raw_attributes: Mapping[str, Any],
    max_replication: int,
    max_partitions: int = 1,
    held: Callable[[int, int], int] | None = None,
) -> tuple[QueueInfo, bool]:
    check_queue_name(name)
    attrs = parse_attributes(raw_attributes)
    try:
        record = find_queue(w, tenant, name)
    except QueueNotFound:
        pass
    else:
        if attributes_of(record) != attrs:
            raise QueueExists(f"queue {name!r} exists with different attributes")
        return info(tenant, name, record, stats(w, record, now, held)), False
    _check_links(w, tenant, name, attrs, max_replication, max_partitions)
    raw_next = w.get(Db.META, _NEXT_QID)
    qid = read_u64(raw_next) if raw_next else 1
    w.put(Db.META, _NEXT_QID, u64(qid + 1))
    record = QueueRecord(qid=qid, created_at=now, attributes=attrs.to_dict())
    save_queue(w, tenant, name, record)
    w.put(Db.QIDS, u64(qid), f"{tenant}\0{name}".encode())
    return info(tenant, name, record, QueueStats()), True


def update_queue(
    w: Writes,
    now: float,
    tenant: str,
    name: str,
    changes: Mapping[str, Any],
    max_replication: int,
    max_partitions: int = 1,
    held: Callable[[int, int], int] | None = None,
) -> QueueInfo:
    record = find_queue(w, tenant, name)
    attrs = apply_patch(attributes_of(record), changes)
    _check_links(w, tenant, name, attrs, max_replication, max_partitions)
    record.attributes = attrs.to_dict()
    record.parsed = attrs
    save_queue(w, tenant, name, record)
    # New limits or delays may make messages receivable: wake consumers to look again.
    w.touched.add((tenant, name))
    return info(tenant, name, record, stats(w, record, now, held))


def _delete_prefix(w: Writes, db: Db, prefix: bytes) -> int:
    cursor = w.cursor(db)
    keys: list[bytes] = []
    if cursor.set_range(prefix):
        for key in cursor.iternext(keys=True, values=False):
            if not key.startswith(prefix):
                break
            keys.append(key)
    for key in keys:
        w.delete(db, key)
    return len(keys)


def _delete_messages(w: Writes, qid: int) -> int:
    prefix = u64(qid)
    for db in (Db.VIS, Db.GROUPS, Db.DEDUPE, Db.STATE, Db.EXPIRY):
        _delete_prefix(w, db, prefix)
    return _delete_prefix(w, Db.MSGS, prefix)


def delete_queue(w: Writes, tenant: str, name: str) -> None:
    record = find_queue(w, tenant, name)
    _delete_messages(w, record.qid)
    key = queue_key(tenant, name)
    w.queue_cache.pop(key, None)
    w.dirty_queues.pop(key, None)
    w.delete(Db.QUEUES, key)
    w.delete(Db.QIDS, u64(record.qid))


def purge_queue(w: Writes, tenant: str, name: str) -> int:
    record = find_queue(w, tenant, name)
    purged = _delete_messages(w, record.qid)
    record.count = 0
    save_queue(w, tenant, name, record)
    return purged


def stats(
    v: View, record: QueueRecord, now: float, held: Callable[[int, int], int] | None = None
) -> QueueStats:
    """One queue's counts (:class:`StatsReader`)."""
    return StatsReader(v, now, held).stats(record)


class StatsReader:
    """Queues' counts over one read, from each queue's stored total and the future part of
    its visibility index.

    Only not-yet-visible entries are scanned (in flight and delayed, usually few), so
    stats stay cheap on a deep backlog. ``held``: how many messages of a queue (by qid) are
    in flight in memory at a time in ms (holds.py), visible on disk. A queue that holds no
    message (``count`` covers every stored one, held, delayed or dead-lettered into it) is
    answered from its record alone: at 10,000 queues most are empty, and the monitor asks for
    every queue's stats every few seconds.

    One reader serves every queue of a page or of a partition's counts: its two cursors are
    opened once, not twice a queue (session 81: 10,000 queues each holding a message read in
    7.6-9.1 us a queue against 8.7-10.7, in process, bench/README.md; a new partition leader
    answers those counts as a failover's first read, and the console's monitor asks for them
    every few seconds)."""

    __slots__ = ("_held", "_msgs", "_now", "_now_ms", "_state", "_txn", "_vis")

    def __init__(self, v: View, now: float, held: Callable[[int, int], int] | None = None) -> None:
        self._txn = v.txn
        self._state = v.dbs[Db.STATE]
        self._vis = v.cursor(Db.VIS)
        self._msgs = v.cursor(Db.MSGS)
        self._now = now
        self._now_ms = to_ms(now)
        self._held = held

    def stats(self, record: QueueRecord) -> QueueStats:
        if record.count <= 0:
            return QueueStats(
                visible=0,
                in_flight=0,
                delayed=0,
                oldest_age_s=None,
                sent_total=record.sent_total,
                acked_total=record.acked_total,
                dead_lettered_total=record.dead_lettered_total,
            )
        qid = record.qid
        in_flight = delayed = 0
        cursor = self._vis
        if cursor.set_range(visibility_key(qid, self._now_ms + 1, 0)):
            for key in cursor.iternext(keys=True, values=False):
                key_qid, _, seq = split_visibility_key(key)
                if key_qid != qid:
                    break
                raw = self._txn.get(message_key(qid, seq), db=self._state)
                if raw is not None and DeliveryState.decode(raw).kind == "i":
                    in_flight += 1
                else:
                    delayed += 1
        oldest: float | None = None
        sent_at = self._first_sent_at(qid)
        if sent_at is not None:
            oldest = max(0.0, self._now - sent_at)
        if self._held is not None:
            in_flight += self._held(qid, self._now_ms)
        return QueueStats(
            visible=max(0, record.count - in_flight - delayed),
            in_flight=in_flight,
            delayed=delayed,
            oldest_age_s=oldest,
            sent_total=record.sent_total,
            acked_total=record.acked_total,
            dead_lettered_total=record.dead_lettered_total,
        )

    def _first_sent_at(self, qid: int) -> float | None:
        """When the queue's first stored message (in seq order) was sent; None: no message (a
        damaged record is passed over: it is left for an operator)."""
        prefix = u64(qid)
        cursor = self._msgs
        if not cursor.set_range(message_key(qid, 0)):
            return None
        for key, raw in cursor:
            if key[:8] != prefix:
                return None
            raw_state = self._txn.get(key, db=self._state)
            if raw_state is not None:
                return DeliveryState.decode(raw_state).sent_at
            sent_at = MessageRecord.sent_at_of(raw)
            if sent_at is not None:
                return sent_at
        return None


def info(tenant: str, name: str, record: QueueRecord, queue_stats: QueueStats) -> QueueInfo:
    return QueueInfo(
        tenant=TenantId(tenant),
        name=QueueName(name),
        created_at=record.created_at,
        attributes=attributes_of(record),
        stats=queue_stats,
    )


def list_queues(
    v: View,
    tenant: str,
    now: float,
    held: Callable[[int, int], int] | None = None,
    *,
    after: str = "",
    limit: int | None = None,
    name_prefix: str = "",
) -> list[QueueInfo]:
    """The tenant's queues by name: up to ``limit`` past ``after`` that start with
    ``name_prefix`` (a page: a cursor seek, not a scan of the tenant's queues)."""
    prefix = tenant_prefix(tenant)
    within = prefix + name_prefix.encode()
    # Names never hold NUL: the first key past ``after`` is at or beyond after + NUL.
    start = prefix + after.encode() + b"\0" if after.encode() >= name_prefix.encode() else within
    out: list[QueueInfo] = []
    cursor = v.cursor(Db.QUEUES)
    if not cursor.set_range(start):
        return out
    counts = StatsReader(v, now, held)
    for key, value in cursor:
        if not key.startswith(within) or (limit is not None and len(out) >= limit):
            break
        record = QueueRecord.decode(value)
        out.append(info(tenant, key[len(prefix) :].decode(), record, counts.stats(record)))
    return out


def stats_of(
    v: View, tenant: str, names: Sequence[str], now: float, held: Callable[[int, int], int] | None = None
) -> dict[QueueName, QueueStats]:
    """The stats of each of ``names`` the store holds, in one read (missing ones left out)."""
    out: dict[QueueName, QueueStats] = {}
    prefix = tenant_prefix(tenant)
    counts = StatsReader(v, now, held)
    for name in names:
        raw = v.get(Db.QUEUES, _queue_key(prefix, name))
        if raw is not None:
            out[QueueName(name)] = counts.stats(QueueRecord.decode(raw))
    return out


def attributes_by_key(
    v: View,
    keys: Iterable[tuple[str, str]],
    likely: Mapping[tuple[str, str], QueueAttributes] | None = None,
) -> dict[tuple[str, str], QueueAttributes | None]:
    """Several queues' attributes by (tenant, name) (None: no such queue).

    A pool term's new leader reads every queue of its partition with this (10,000 at one
    partition a pool), so it is made cheap: a queue whose record stores the attributes
    ``likely`` gives for it (etcd's, which most queues hold) is answered with that very
    object without decoding its record; the others' are decoded, each distinct set parsed
    once (most queues share one). docs/cluster.md, "Shared partitions"."""
    out: dict[tuple[str, str], QueueAttributes | None] = {}
    parsed: dict[tuple[Any, ...], QueueAttributes] = {}
    encoded: dict[int, tuple[QueueAttributes, bytes]] = {}  # by the likely object's identity
    prefixes: dict[str, bytes] = {}
    for tenant, name in keys:
        prefix = prefixes.get(tenant)
        if prefix is None:
            prefix = prefixes[tenant] = tenant_prefix(tenant)
        raw = v.get(Db.QUEUES, _queue_key(prefix, name))
        if raw is None:
            out[(tenant, name)] = None
            continue
        guess = likely.get((tenant, name)) if likely else None
        if guess is not None:
            known = encoded.get(id(guess))
            if known is None:
                known = encoded[id(guess)] = (guess, pack(guess.to_dict()))
            if QueueRecord.holds_attributes(raw, known[1]):
                out[(tenant, name)] = guess
                continue
        stored = QueueRecord.decode(raw).attributes
        # The types too: 1 == True and 30 == 30.0, but a document says which it holds.
        try:
            content = (tuple(stored.items()), tuple(map(type, stored.values())))
            attributes = parsed.get(content)
            if attributes is None:
                attributes = parsed[content] = attributes_from_record(stored)
        except TypeError:  # a value that does not hash (none of today's attributes)
            attributes = attributes_from_record(stored)
        out[(tenant, name)] = attributes
    return out


def _queue_key(prefix: bytes, name: str) -> bytes:
    """:func:`keys.queue_key` with the tenant's prefix made once: a read of many queues
    names more than that function's memo holds."""
    check_queue_name(name)
    return prefix + name.encode()
