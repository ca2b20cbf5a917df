"""The queues a pool partition's leader serves (docs/cluster.md, "Shared partitions"); no I/O.

A pool partition (``PartitionRecord.pool``) holds many queues. Its leader serves every queue
whose record's ``placement`` names the partition and that is not marked ``deleting``, and
keeps the copies of their dead-letter queues (a dead-letter queue's messages live in the
partitions of the queues feeding it, as on a queue's own partition). It deletes a queue
from its store when the queue's record is marked ``deleting``; never because a record is
absent (an etcd restored from a backup lacks the records of queues made since).

At ten thousand queues this must cost per change, not per queue: :class:`QueueRecords`
follows ``queues/`` by the keys that changed and keeps which partitions each record
concerns (its placement, and the placements of the queues feeding it), and
:class:`PoolQueues` (one per hosted replica) applies only the queues whose records changed;
a term applies every queue of its partition once, when it begins. ``PartitionHost`` and the
deterministic simulation's replica host both run this code.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import sys
from collections.abc import Awaitable, Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol

from ...errors import PushgateError
from ..coordination import pools
from ..coordination.coordinator import PrefixState
from ..coordination.layout import PartitionRecord, unpack
from ..coordination.queue_record import former_dead_letter_queues, store_attributes
from .shared_docs import SharedDocs

log = logging.getLogger("pushgate.cluster")

QueueKey = tuple[str, str]  # (tenant, queue)
# Ensure a queue with these store attributes (whether it was done); drop a queue (the same).
Ensure = Callable[[QueueKey, dict[str, Any]], Awaitable[bool]]
Drop = Callable[[QueueKey], Awaitable[bool]]
# Whether the store is known to hold a queue with these store attributes already, answered
# at once (what the pass read when it began): such a queue needs no ``Ensure``.
Held = Callable[[QueueKey, dict[str, Any]], bool]
# A request's queue names: a queue's own operations name it in "queue" or "name", a
# redrive its target in "to" too, a stats request several in "names".
_NAME_ARGS = ("queue", "name", "to")
# Queues a pass applies per turn of the event loop (PoolQueues.apply). 100 when each queue's
# check cost ~50 us; with its comparisons shared (session 58) a queue costs a few, and a turn of
# 500 holds the loop a few milliseconds. Under load every yield waits out a whole turn of a busy
# loop: three terms of 1,250 queues each begun at once on one node, yielding every 100, took
# 0.32-0.40 s to apply (issue 49, failover after SIGKILL).
_QUEUES_PER_TURN = 500
# Queues a pass settles per turn when their store holds them as their records say (``Held``:
# no write, no task, a few microseconds each, so a turn holds the loop under 10 ms). A new
# leader's first pass finds nearly every queue so: at 10,000 queues, 27-48 ms of CPU in
# process against 96-124 with a task each. Under a failover's load the pass took as long
# after as before (0.24-0.35 s against 0.28-0.36, session 76): there its time was the read of
# every queue's attributes, made cheap in session 77 (the pass 0.11-0.24 s since).
_SETTLED_PER_TURN = 2000
# How many of a request's queues a refusal names.
_NAMED_IN_REFUSAL = 5
# Idempotent, and asked by a deleting gateway whether or not the queue was ever applied.
_ALWAYS_READY = frozenset({"delete_queue"})
# What a record holds that a node never reads (and that differs from queue to queue).
_UNREAD = frozenset({"created_at"})


def _dead_letter_queue(doc: Mapping[str, Any]) -> str | None:
    dlq = doc.get("dead_letter_queue")
    return dlq if isinstance(dlq, str) and dlq else None


def _fed(doc: Mapping[str, Any]) -> set[str]:
    """The dead-letter queues a record feeds or fed (their copies live in its partitions)."""
    names = {str(name) for name, _ in former_dead_letter_queues(doc)}
    if (dlq := _dead_letter_queue(doc)) is not None:
        names.add(dlq)
    return names


def named(args: Mapping[str, Any]) -> list[str]:
    """The queue names a request's arguments give (``_NAME_ARGS``, ``names``, and the queues
    of ``sends``)."""
    names = [args[n] for n in _NAME_ARGS if isinstance(args.get(n), str)]
    many = args.get("names")
    if isinstance(many, list | tuple):
        names.extend(n for n in many if isinstance(n, str))
    sends = args.get("sends")  # send_queues: [[queue, messages], ...]
    if isinstance(sends, list | tuple):
        names.extend(e[0] for e in sends if isinstance(e, list | tuple) and e and isinstance(e[0], str))
    return names


class Want(Enum):
    """What a pool partition's store should hold of a queue."""

    ENSURE = "ensure"  # the queue (or a dead-letter copy) with its record's attributes
    DROP = "drop"  # nothing: the record is marked deleting
    KEEP = "keep"  # whatever it holds: nothing to do


class QueueRecords(Mapping[QueueKey, dict[str, Any]]):
    """``queues/{tenant}/{name}`` as the node holds it: each record's document, kept up to
    date by the keys a watch says changed, and which pool partitions each concerns.

    Documents are held without what the node never reads (``created_at``), equal ones once
    (``shared_docs.py``); a record's ``stamp`` tells a record put again from the one before,
    even when both documents are the same shared one."""

    def __init__(self) -> None:
        self._records: dict[QueueKey, dict[str, Any]] = {}
        self._stamps: dict[QueueKey, int] = {}
        self._puts = 0
        self.shared = SharedDocs()
        self._placed: dict[int, set[QueueKey]] = {}  # partition -> queues placed on it
        self._feeders: dict[QueueKey, set[QueueKey]] = {}  # dead-letter queue -> queues feeding it

    @classmethod
    def of(cls, records: Mapping[QueueKey, Mapping[str, Any]]) -> QueueRecords:
        out = cls()
        for key, doc in records.items():
            out.put(key, dict(doc))
        return out

    def __getitem__(self, key: QueueKey) -> dict[str, Any]:
        return self._records[key]

    def __iter__(self) -> Iterator[QueueKey]:
        return iter(self._records)

    def __len__(self) -> int:
        return len(self._records)

    def stamp(self, key: QueueKey) -> int:
        """Which put holds ``key``'s record now (0: none)."""
        return self._stamps.get(key, 0)

    def follow(self, state: PrefixState, keys: Collection[str]) -> dict[int, set[QueueKey]]:
        """Take the records of ``keys`` (full etcd keys, as a watch names them) from
        ``state``: the queues to apply again, by pool partition."""
        out: dict[int, set[QueueKey]] = {}
        for key in keys:
            tenant, _, queue = key[len(state.prefix) :].partition("/")
            if not queue:
                continue
            tenant = sys.intern(tenant)  # a few tenants, held by every queue's key
            entry = state.entries.get(key)
            doc: dict[str, Any] | None = None
            if entry is not None:
                with contextlib.suppress(PushgateError):
                    value = unpack(entry.value)
                    doc = value if isinstance(value, dict) else None
            for pid, queues in self.put((tenant, queue), doc).items():
                out.setdefault(pid, set()).update(queues)
        return out

    def put(self, key: QueueKey, doc: dict[str, Any] | None) -> dict[int, set[QueueKey]]:
        """Hold ``doc`` as ``key``'s record (None: it is gone, or unreadable): the queues to
        apply again, by pool partition (before and after the change)."""
        old = self._records.get(key)
        out = self._concerned(key, old)
        self._index(key, old, remove=True)
        if doc is None:
            self._records.pop(key, None)
            self._stamps.pop(key, None)
        else:
            doc = self.shared.share({k: v for k, v in doc.items() if k not in _UNREAD})
            self._records[key] = doc
            self._puts += 1
            self._stamps[key] = self._puts
            self._index(key, doc, remove=False)
        for pid, queues in self._concerned(key, doc).items():
            out.setdefault(pid, set()).update(queues)
        return out

    def _index(self, key: QueueKey, doc: Mapping[str, Any] | None, *, remove: bool) -> None:
        if doc is None:
            return
        tenant = key[0]
        for pid in pools.placement(doc) or ():
            placed = self._placed.setdefault(pid, set())
            if remove:
                placed.discard(key)
            else:
                placed.add(key)
        for name in _fed(doc):
            feeders = self._feeders.setdefault((tenant, name), set())
            if remove:
                feeders.discard(key)
            else:
                feeders.add(key)

    def _concerned(self, key: QueueKey, doc: Mapping[str, Any] | None) -> dict[int, set[QueueKey]]:
        """The pool partitions a record concerns, and which of their queues: its own
        placement (the queue and its dead-letter queues' copies there), and the placements
        of the queues feeding it (its copies there)."""
        out: dict[int, set[QueueKey]] = {}
        tenant = key[0]
        if doc is not None:
            copies = {(tenant, name) for name in _fed(doc)}
            for pid in pools.placement(doc) or ():
                out.setdefault(pid, set()).update({key, *copies})
        for feeder in self._feeders.get(key, ()):
            for pid in pools.placement(self._records.get(feeder, {})) or ():
                out.setdefault(pid, set()).add(key)
        return out

    def on_partition(self, pid: int) -> set[QueueKey]:
        """Every queue a pool partition's term applies when it begins: those placed on it
        and the dead-letter queues they feed or fed."""
        out: set[QueueKey] = set()
        for key in self._placed.get(pid, ()):
            out.add(key)
            out.update((key[0], name) for name in _fed(self._records.get(key, {})))
        return out

    def want(self, pid: int, key: QueueKey) -> Want:
        """What pool partition ``pid``'s store should hold of ``key``."""
        doc = self._records.get(key)
        if doc is None:
            return Want.KEEP  # never deleted because a record is absent
        here = pid in (pools.placement(doc) or ())
        if pools.deleting(doc):
            holds = here or any(
                pid in (pools.placement(self._records[f]) or ()) for f in self._feeders_of(key)
            )
            return Want.DROP if holds else Want.KEEP
        if here:
            return Want.ENSURE
        for feeder in self._feeders_of(key):
            fed_by = self._records[feeder]
            if (
                not pools.deleting(fed_by)
                and _dead_letter_queue(fed_by) == key[1]
                and pid in (pools.placement(fed_by) or ())
            ):
                return Want.ENSURE  # the copy a queue here dead-letters into
        # A former dead-letter queue's copy keeps what moved there (its queue reads it), and
        # any other queue is none of this partition's business.
        return Want.KEEP

    def _feeders_of(self, key: QueueKey) -> list[QueueKey]:
        return [f for f in self._feeders.get(key, ()) if f in self._records]


@dataclass(frozen=True, slots=True)
class CreateClaim:
    """A ``create_queue`` request making a queue it found unapplied (:meth:`PoolQueues.claim_create`)."""

    key: QueueKey
    attributes: dict[str, Any]  # the store attributes, as its record holds them
    stamp: int  # the record's put it was claimed on
    term: int


@dataclass(slots=True)
class PoolQueues:
    """One pool partition replica's queues while it leads: those applied (served) and those
    still to apply. A term begins with every queue of the partition to apply; a change to a
    record adds the queues it concerns (:meth:`QueueRecords.follow`)."""

    pending: set[QueueKey] = field(default_factory=set)
    # Queues served, with the store attributes applied (None: a copy kept as it is).
    applied: dict[QueueKey, dict[str, Any] | None] = field(default_factory=dict)
    # Whether the term's first pass over its queues is done (after its first entry).
    opened: bool = False
    # The node's records, as the term's last pass read them (what a request applies from).
    records: QueueRecords | None = None
    # Counts the terms begun: what a request applied during another term's start is not ours.
    terms: int = 0

    def begin_term(self, records: QueueRecords, pid: int) -> None:
        self.applied.clear()
        self.opened = False
        self.terms += 1
        self.records = records
        self.pending = records.on_partition(pid)

    def changed(self, queues: Collection[QueueKey]) -> None:
        self.pending.update(queues)

    async def apply(
        self, records: QueueRecords, pid: int, ensure: Ensure, drop: Drop, held: Held | None = None
    ) -> None:
        """Apply what is pending (leader only). A queue whose step fails stays pending, tried
        again at the next call (the node's tick); the others are served meanwhile. ``held``:
        which queues the store holds as wanted already (served without ``ensure``)."""
        self.records = records
        todo, self.pending = self.pending, set()
        failed: set[QueueKey] = set()
        done: set[QueueKey] = set()
        # Each record document's store attributes, shared, by the document's identity: most
        # queues share one document, and sharing one costs ~25 us (it hashes its content).
        # Holding the document keeps its identity its own for the pass.
        shared: dict[int, tuple[Mapping[str, Any], dict[str, Any]]] = {}

        def store_doc(doc: Mapping[str, Any]) -> dict[str, Any]:
            found = shared.get(id(doc))
            if found is None:
                found = shared[id(doc)] = (doc, records.shared.share(store_attributes(doc)))
            return found[1]

        async def one(key: QueueKey, depth: int = 0) -> None:
            if key in done or key in failed:
                return
            want = records.want(pid, key)
            doc = records.get(key)
            if want == Want.DROP:
                self.applied.pop(key, None)
                if not await drop(key):
                    failed.add(key)
                    return
            elif want == Want.ENSURE and doc is not None:
                dlq = _dead_letter_queue(doc)
                if dlq is not None and depth < 2 and (key[0], dlq) in todo:
                    await one((key[0], dlq), depth + 1)  # first: the queue's link needs it
                    if (key[0], dlq) in failed:
                        failed.add(key)
                        return
                plain = store_doc(doc)
                if self.applied.get(key) != plain:
                    if not await ensure(key, plain):
                        failed.add(key)
                        return
                    self.applied[key] = plain
            elif doc is not None and not pools.deleting(doc):
                self.applied.setdefault(key, None)  # a copy kept as it is: served
            done.add(key)

        def settled(key: QueueKey) -> bool:
            """Served at once: a queue of this partition without a dead-letter queue (one()
            orders those) that the store holds with its record's attributes."""
            if held is None or records.want(pid, key) != Want.ENSURE:
                return False
            doc = records.get(key)
            if doc is None or _dead_letter_queue(doc) is not None:
                return False
            plain = store_doc(doc)
            if self.applied.get(key) != plain and not held(key, plain):
                return False
            self.applied[key] = plain
            done.add(key)
            return True

        # Dead-letter queues first, one at a time (a queue's link needs its copy); then the
        # others a turn's worth at once, so that their writes share the store's group commits
        # and replication rounds: a create is a record write and this pass makes its queue,
        # and one write at a time (a replicated commit a queue) cost each node three times
        # the CPU a create of writes made together (issue 49, bench/README.md, "Session
        # 73"). Those the store holds as wanted (``held``) are served at once, without a
        # task. A turn's worth of either: a term's first pass goes over every queue of its
        # partition (all 10,000 at one partition a pool), and in one turn it held the node's
        # loop, heartbeats and lease renewals with it (issue 48, item 3).
        keys = sorted(todo)
        links = todo.intersection(
            (key[0], dlq)
            for key in keys
            if (doc := records.get(key)) is not None and (dlq := _dead_letter_queue(doc))
        )
        for key in sorted(links):
            await one(key)
        turn: list[QueueKey] = []
        walked = 0
        for key in keys:
            if key in links or settled(key):
                walked += 1
            else:
                turn.append(key)
            if len(turn) >= _QUEUES_PER_TURN or walked >= _SETTLED_PER_TURN:
                await (_together(one(k) for k in turn) if turn else asyncio.sleep(0))
                turn, walked = [], 0
        if turn:
            await _together(one(key) for key in turn)
        self.pending.update(failed)
        self.opened = True

    async def apply_named(self, pid: int, op: str, args: Mapping[str, Any], ensure: Ensure) -> None:
        """Apply now the queues a request names that this node's records say the partition
        serves (``Want.ENSURE``) but the term has not applied yet. A new queue's first request
        (its first send or read since session 73, when a create became a record write; the
        creating gateway's ``create_queue`` before) reaches its leader about when the leader's
        watch brings its record: it is answered at once, the queue made in the same group
        commit as the other requests' of the moment, where it waited for the node's next
        tick and the term's pass, one replicated write after another, and the gateway's
        backing-off retries (issue 49: 8 creates a second and 503s at 10,000 queues).

        Only once the term's first pass is done (its first entry written); a queue whose
        dead-letter queue's copy is not applied yet is left to that pass, which makes the copy
        first. A record that changed while its queue was made is not counted applied: it is
        pending again, and the pass applies what the record says now; nor is one made while a
        new term began (that term's pass applies it after its own first entry)."""
        records, term = self.records, self.terms
        tenant = args.get("tenant")
        if records is None or not self.opened or op in _ALWAYS_READY or not isinstance(tenant, str):
            return
        for name in named(args):
            key = (tenant, name)
            doc = records.get(key)
            if key in self.applied or doc is None or records.want(pid, key) != Want.ENSURE:
                continue
            dlq = _dead_letter_queue(doc)
            if dlq is not None and (tenant, dlq) not in self.applied:
                continue
            plain = records.shared.share(store_attributes(doc))
            stamp = records.stamp(key)
            if not await ensure(key, plain) or self.terms != term:
                continue
            if records.stamp(key) == stamp:
                self.applied[key] = plain
            else:
                self.pending.add(key)

    def claim_create(self, pid: int, args: Mapping[str, Any]) -> CreateClaim | None:
        """A gateway's ``create_queue`` (a gateway of session 72 or earlier: since, a create
        asks no node) of a queue this partition serves but has not applied, asking for the
        attributes its record holds: the request's own write makes the queue
        (:meth:`created` counts it applied after). Through :meth:`apply_named` it cost a
        read, a write and the request's write of nothing: three thread hops to the store's
        threads where one does (issue 49). None: the request goes as any other (a queue
        with a dead-letter queue, whose copy must come first, among them)."""
        records, tenant, name = self.records, args.get("tenant"), args.get("name")
        if records is None or not self.opened or not isinstance(tenant, str) or not isinstance(name, str):
            return None
        key = (tenant, name)
        doc = records.get(key)
        if (
            key in self.applied
            or doc is None
            or _dead_letter_queue(doc) is not None
            or records.want(pid, key) != Want.ENSURE
        ):
            return None
        plain = store_attributes(doc)
        if args.get("attributes") != plain:
            return None
        return CreateClaim(key, records.shared.share(plain), records.stamp(key), self.terms)

    def created(self, claim: CreateClaim) -> None:
        """A claimed create was written and replicated: the queue is applied, unless its
        record changed or a new term began meanwhile (that record, that term, apply it)."""
        if (
            self.terms == claim.term
            and self.records is not None
            and self.records.stamp(claim.key) == claim.stamp
        ):
            self.applied[claim.key] = claim.attributes
            self.pending.discard(claim.key)

    def served(self, op: str, args: Mapping[str, Any]) -> None:
        """After a request was served: a gateway's ``delete_queue`` took the queue out of the
        store, so it is applied no more, and applied again from its record at the next call
        (a gateway deleting an earlier queue of the name before making it again: the record
        is live, and the new queue must exist; a watch that showed the mark, the removal and
        the new record as one change left it counted applied, and the store without it)."""
        tenant, name = args.get("tenant"), args.get("name")
        if op == "delete_queue" and isinstance(tenant, str) and isinstance(name, str):
            self.applied.pop((tenant, name), None)
            self.pending.add((tenant, name))

    def not_ready(self, op: str, args: Mapping[str, Any]) -> str | None:
        """Why a request cannot be served yet (None: it can): a queue it names is not
        applied. Answered as not_leader (nothing applied; the gateway retries), while the
        partition's other queues are served."""
        if op in _ALWAYS_READY:
            return None
        tenant = args.get("tenant")
        if not isinstance(tenant, str):
            return None if self.opened else "the term's queues are not applied yet"
        names = named(args)
        missing = [n for n in names if (tenant, n) not in self.applied]
        if missing:
            # A few by name: a request naming a partition's 10,000 queues (a page of counts)
            # is refused again and again while a new term applies them.
            shown = ", ".join(heapq.nsmallest(_NAMED_IN_REFUSAL, missing))
            more = len(missing) - _NAMED_IN_REFUSAL
            return f"{shown}{f' and {more:,} more' if more > 0 else ''} not applied yet"
        if not names and not self.opened:
            return "the term's queues are not applied yet"
        return None


async def _together(steps: Iterable[Awaitable[None]]) -> None:
    """Run ``steps`` concurrently and wait for all of them; then raise the first error, as
    one at a time would have (after the others, so that none is left running)."""
    errors = [r for r in await asyncio.gather(*steps, return_exceptions=True) if r is not None]
    if errors:
        raise errors[0]


class PoolHost(Protocol):
    """A hosted replica, as the node's queue watch reaches it."""

    pool_queues: PoolQueues


def note_changes(
    records: QueueRecords, state: PrefixState, keys: Collection[str], hosts: Mapping[int, PoolHost]
) -> list[int]:
    """Take a watch's changed ``keys`` of ``queues/`` into ``records``, and tell each hosted
    replica the queues of its own to apply again (a replica not leading forgets them when
    its term begins, which applies every queue of its partition): the partitions told."""
    told: list[int] = []
    for pid, queues in records.follow(state, keys).items():
        host = hosts.get(pid)
        if host is not None:
            host.pool_queues.changed(queues)
            told.append(pid)
    return told


def not_ready(
    record: PartitionRecord | None,
    applied: Collection[QueueKey],
    pool: PoolQueues,
    op: str,
    args: Mapping[str, Any],
) -> str | None:
    """Why a leader does not serve a request yet (None: it does). A queue's own partition:
    until its queue's attributes are applied (``applied``); a pool partition: until those of
    the queues the request names are (:meth:`PoolQueues.not_ready`)."""
    if record is None:
        return "no partition record"
    if record.pool is not None:
        return pool.not_ready(op, args)
    if (record.tenant, record.queue) not in applied:
        return "the queue's attributes are not applied yet"
    return None


async def ready_or_applied(
    record: PartitionRecord | None,
    applied: Collection[QueueKey],
    pool: PoolQueues,
    pid: int,
    op: str,
    args: Mapping[str, Any],
    ensure: Ensure,
) -> str | None:
    """:func:`not_ready`, after a pool partition applied the queues the request names that
    its records hold (:meth:`PoolQueues.apply_named`); the leader checks it is still leading
    after the await."""
    why = not_ready(record, applied, pool, op, args)
    if why is None or record is None or record.pool is None:
        return why
    await pool.apply_named(pid, op, args, ensure)
    return not_ready(record, applied, pool, op, args)
