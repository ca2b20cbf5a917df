"""Tenants, keys, limits and queue metadata in etcd, with the embedded store's semantics.

Layout (docs/cluster.md, all under ``/pushgate/``; values of ``queues/`` are msgpack maps):

- ``meta/{namespace}/{key}``: raw bytes (tenants, API keys, JWT keys, limits, alert rules);
- ``queues/{tenant}/{queue}``: the queue's attributes and ``created_at`` (float); the
  manager watches this prefix and gives each queue its partitions, each partition's leader
  applies the attributes to its store. ``former_dead_letter_queues`` (``[[name,
  create_revision], ...]``, only when not empty): dead-letter queues the queue moved
  messages to before its ``dead_letter_queue`` changed. Its partitions keep those messages
  (a dead-letter queue's messages live in the partitions of the queues feeding it), so the
  old dead-letter queue still reads them there. ``placement`` (``[partition id, ...]``) and
  ``deleting`` (``true`` while being deleted; such a record reads as absent here): a queue on
  shared partitions (docs/cluster.md, "Shared partitions"; ``coordination/pools.py``).

Queue writes go to etcd and, when they succeed, return once the watched copy holds them (the
watch's own delivery of the write's revision, never the whole prefix read; a change reads its
key back for its revisions, a create has them from its transaction, which it shares with the
other creates of the moment: :mod:`.record_creates`), so this gateway's router and listing
see its own changes; a placed queue's deletion leaves the copy at once. Other gateways' writes arrive through
the watch (``on_meta_change`` and ``on_queue_change`` listeners, which the gateway uses to
forget cached credentials and queue records at once). Reads of single values go to etcd
(linearizable): the gateway caches what it reads hot (the authenticator, the queue cache) and
drops those caches on the listeners' word. The router reads queue attributes from the watched
copy, and listing pages through it (:class:`~.queue_index.QueueIndex`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import msgpack

from ...attributes import apply_patch, attributes_from_record, check_queue_name, parse_attributes
from ...errors import InvalidRequest, QueueExists, QueueNotFound, Unavailable
from ...types import QueueAttributes, QueueName, TenantId
from ..coordination import pools
from ..coordination.coordinator import Coordinator, Entry, PrefixState
from ..coordination.layout import Layout
from ..coordination.queue_record import FORMER_DLQS, former_dead_letter_queues
from ..coordination.watched_prefix import WatchedPrefix
from .queue_index import QueueIndex
from .record_creates import RecordCreates

# Read-modify-write of a queue record is retried this often when another writer got in first.
_CAS_ATTEMPTS = 20

MetaListener = Callable[[str, str], None]
QueueListener = Callable[[TenantId, QueueName], None]


@dataclass(frozen=True, slots=True)
class QueueRecord:
    """A queue as etcd holds it (no stats: those live on the partitions' leaders)."""

    tenant: TenantId
    name: QueueName
    attributes: QueueAttributes
    created_at: float
    mod_revision: int = 0
    # Tells a queue from one deleted and re-created under its name (partitions name it).
    create_revision: int = 0
    # (name, create_revision) of each dead-letter queue this one fed before its
    # ``dead_letter_queue`` changed: their messages moved so far stay in our partitions.
    former_dead_letter_queues: tuple[tuple[QueueName, int], ...] = ()
    # Its partitions in its pool, by index (docs/cluster.md, "Shared partitions"); None: a
    # queue made before pools, on partitions of its own.
    placement: tuple[int, ...] | None = None
    # Being deleted: its partitions delete it on this mark, and it reads as absent.
    deleting: bool = False

    def to_bytes(self) -> bytes:
        # Flat: nodes and the manager read the attributes straight from the map (they
        # ignore ``created_at``, which is not an attribute).
        doc: dict[str, Any] = {**self.attributes.to_dict(), "created_at": self.created_at}
        if self.former_dead_letter_queues:
            doc[FORMER_DLQS] = [list(pair) for pair in self.former_dead_letter_queues]
        if self.placement is not None:
            doc[pools.PLACEMENT] = list(self.placement)
        if self.deleting:
            doc[pools.DELETING] = True
        packed: bytes = msgpack.packb(doc)
        return packed

    @classmethod
    def from_entry(cls, tenant: str, name: str, entry: Entry) -> QueueRecord:
        doc = msgpack.unpackb(entry.value)
        return cls(
            TenantId(tenant),
            QueueName(name),
            attributes_from_record(doc),
            float(doc.get("created_at") or 0.0),
            entry.mod_revision,
            entry.create_revision,
            former_dead_letter_queues(doc),
            pools.placement(doc),
            pools.deleting(doc),
        )

    def holds_dead_letters_of(self, dlq: QueueRecord) -> bool:
        """Whether this queue's partitions keep messages of dead-letter queue ``dlq``."""
        if dlq.name == self.name:
            return False
        if self.attributes.dead_letter_queue == dlq.name:
            return True
        return (dlq.name, dlq.create_revision) in self.former_dead_letter_queues


class ClusterMetadata:
    """Metadata and queue records in etcd, with watched copies of ``meta/`` and ``queues/``."""

    def __init__(
        self,
        coordinator: Coordinator,
        paths: Layout,
        *,
        clock: Callable[[], float] = time.time,
        reread_every_s: float = 5.0,
    ) -> None:
        self.coordinator = coordinator
        self.paths = paths
        self._clock = clock
        self._reread_every_s = reread_every_s
        self.meta = WatchedPrefix(coordinator, paths.meta, reread_every_s=reread_every_s)
        self.queues = WatchedPrefix(coordinator, paths.queues, reread_every_s=reread_every_s)
        self._meta_listeners: list[MetaListener] = []
        self._queue_listeners: list[QueueListener] = []
        # Watched queue records, decoded: every request looks its queue up here.
        self._decoded: dict[str, QueueRecord] = {}
        self.index = QueueIndex()
        # New records, those of the moment in one transaction (record_creates.py).
        self.creates = RecordCreates(coordinator)
        self.meta.add_listener(self._meta_changed)
        self.queues.add_listener(self._queues_changed)

    async def start(self) -> None:
        await self.meta.start()
        await self.queues.start()

    async def close(self) -> None:
        await self.queues.close()
        await self.meta.close()

    def add_meta_listener(self, listener: MetaListener) -> None:
        """``listener(namespace, key)`` after a metadata value changed, here or elsewhere."""
        self._meta_listeners.append(listener)

    def add_queue_listener(self, listener: QueueListener) -> None:
        """``listener(tenant, queue)`` after a queue record changed, here or elsewhere."""
        self._queue_listeners.append(listener)

    # Metadata values --------------------------------------------------------------

    async def meta_get(self, namespace: str, key: str) -> bytes | None:
        entry = await self.coordinator.get(self.paths.meta_key(namespace, key))
        return None if entry is None else entry.value

    async def meta_put(self, namespace: str, key: str, value: bytes, *, only_if_absent: bool = False) -> bool:
        full = self.paths.meta_key(namespace, key)
        if only_if_absent:
            stored = await self.coordinator.create(full, value)
        else:
            await self.coordinator.put(full, value)
            stored = True
        return stored

    async def meta_delete(self, namespace: str, key: str) -> bool:
        return await self.coordinator.delete(self.paths.meta_key(namespace, key))

    async def meta_list(self, namespace: str, prefix: str = "") -> list[tuple[str, bytes]]:
        start = self.paths.meta_key(namespace, prefix)
        skip = len(self.paths.meta_key(namespace, ""))
        state = await self.coordinator.read_prefix(start)
        return sorted((key[skip:], entry.value) for key, entry in state.entries.items())

    # Queue records ----------------------------------------------------------------

    def cached_record(self, tenant: TenantId, name: QueueName) -> QueueRecord | None:
        """The watched copy of a queue record, one marked ``deleting`` too (may lag another
        gateway's change briefly)."""
        key = f"{tenant}/{name}"
        entry = self.queues.get(key)
        if entry is None:
            self._decoded.pop(key, None)
            return None
        record = self._decoded.get(key)
        if (
            record is None
            or record.mod_revision != entry.mod_revision
            or record.create_revision != entry.create_revision
        ):
            record = self._decoded[key] = QueueRecord.from_entry(tenant, name, entry)
        return record

    def cached_queue(self, tenant: TenantId, name: QueueName) -> QueueRecord | None:
        """The watched copy of a queue that exists (one being deleted reads as absent)."""
        record = self.cached_record(tenant, name)
        return None if record is None or record.deleting else record

    def dead_letter_sources(self, dlq: QueueRecord) -> list[QueueRecord]:
        """The queues whose partitions keep messages of dead-letter queue ``dlq`` (it is
        their ``dead_letter_queue``, or was before it changed), from the watched copy."""
        out: list[QueueRecord] = []
        for name in self.index.sources(dlq.tenant, dlq.name):
            source = self.cached_queue(dlq.tenant, name)
            if source is not None and source.holds_dead_letters_of(dlq):
                out.append(source)
        return out

    async def record(self, tenant: TenantId, name: QueueName) -> QueueRecord | None:
        """A queue record read from etcd, one marked ``deleting`` too; None if there is none."""
        entry = await self.coordinator.get(self.paths.queue(tenant, name))
        return None if entry is None else QueueRecord.from_entry(tenant, name, entry)

    async def queue(self, tenant: TenantId, name: QueueName) -> QueueRecord:
        """A queue record read from etcd; ``QueueNotFound`` if there is none (or it is being
        deleted)."""
        record = await self.record(tenant, name)
        if record is None or record.deleting:
            raise QueueNotFound(f"queue {name!r} does not exist")
        return record

    def page(
        self, tenant: TenantId, *, after: str = "", limit: int | None = None, prefix: str = ""
    ) -> list[QueueRecord]:
        """Up to ``limit`` of the tenant's queues by name, past ``after`` and starting with
        ``prefix``, from the watched copy (this gateway's own changes are in it at once,
        another gateway's within the watch's delay); queues being deleted are left out."""
        out: list[QueueRecord] = []
        for name in self.index.names_after(tenant, after, prefix):
            if limit is not None and len(out) >= limit:
                break
            record = self.cached_queue(tenant, name)
            if record is not None:
                out.append(record)
        return out

    async def create_queue(
        self,
        tenant: TenantId,
        name: QueueName,
        raw_attributes: Mapping[str, Any],
        *,
        placement: tuple[int, ...] | None = None,
    ) -> tuple[QueueRecord, bool]:
        """Create a queue record (on ``placement``: its pool partitions), or return the
        existing one if its attributes are the same. An existing record marked ``deleting``
        is returned as it is (``created`` False): the caller finishes its deletion first."""
        check_queue_name(name)
        attrs = parse_attributes(raw_attributes)
        await self._check_dead_letter_queue(tenant, name, attrs)
        key = self.paths.queue(tenant, name)
        for _ in range(_CAS_ATTEMPTS):
            record = QueueRecord(tenant, name, attrs, self._clock(), placement=placement)
            revision = await self.creates.create(key, record.to_bytes())
            if revision:
                # Its revisions are the transaction's (the create revision names this
                # incarnation): nothing to read back, only the watch to wait for.
                await self._caught_up(revision)
                return replace(record, mod_revision=revision, create_revision=revision), True
            existing = await self.record(tenant, name)
            if existing is None:
                continue  # deleted between the two calls: try to create it again
            if existing.deleting:
                return existing, False
            if existing.attributes != attrs:
                raise QueueExists(f"queue {name!r} exists with different attributes")
            return existing, False
        raise Unavailable("queue metadata changed too often to create the queue; retry")

    async def update_queue(
        self, tenant: TenantId, name: QueueName, changes: Mapping[str, Any]
    ) -> QueueRecord:
        for _ in range(_CAS_ATTEMPTS):
            current = await self.queue(tenant, name)
            attrs = apply_patch(current.attributes, changes)
            _check_class_kept(current, attrs)
            await self._check_dead_letter_queue(tenant, name, attrs)
            former = await self._former_dead_letter_queues(current, attrs)
            record = replace(current, attributes=attrs, former_dead_letter_queues=former)
            key = self.paths.queue(tenant, name)
            if await self.coordinator.compare_and_put(key, record.to_bytes(), current.mod_revision):
                stored = await self._read_back(tenant, name)
                if stored is None or stored.deleting:
                    raise QueueNotFound(f"queue {name!r} does not exist")
                return stored
        raise Unavailable("queue metadata changed too often to update the queue; retry")

    async def mark_deleting(self, record: QueueRecord) -> QueueRecord | None:
        """Mark a placed queue's record ``deleting`` (its partitions delete it on that mark);
        the marked record, or None if the record changed meanwhile (read it again)."""
        marked = replace(record, deleting=True)
        key = self.paths.queue(record.tenant, record.name)
        if not await self.coordinator.compare_and_put(key, marked.to_bytes(), record.mod_revision):
            return None
        return await self._read_back(record.tenant, record.name)

    async def delete_queue(self, tenant: TenantId, name: QueueName, mod_revision: int | None = None) -> None:
        """Delete the record; ``QueueNotFound`` if there was none. With ``mod_revision``
        (a record marked ``deleting``, as of that revision): only if it did not change."""
        key = self.paths.queue(tenant, name)
        if not await self.coordinator.delete(key, mod_revision):
            raise QueueNotFound(f"queue {name!r} does not exist")
        if mod_revision is None:
            await self._settle(self.queues)
            return
        # Out of the watched copy at once, without re-reading the prefix: a state of the watch
        # older than the deletion can only show the record marked, which reads as absent.
        # Named as the one key changed: a state that named none was compared with the one
        # held key by key, 10 ms of the gateway's loop a deletion at 10,000 queues.
        held = self.queues.state
        if key in held.entries:
            entries = dict(held.entries)
            del entries[key]
            self.queues.apply(
                PrefixState(held.prefix, held.revision, entries, frozenset({key}), held.revision)
            )

    async def _former_dead_letter_queues(
        self, current: QueueRecord, attrs: QueueAttributes
    ) -> tuple[tuple[QueueName, int], ...]:
        """The record's former dead-letter queues after ``attrs`` replace its attributes: the
        one it leaves is added, the one it (re)joins dropped, and those deleted since (or
        deleted and made again: another queue) forgotten."""
        old, new = current.attributes.dead_letter_queue, attrs.dead_letter_queue
        pairs = list(current.former_dead_letter_queues)
        if old is not None and old != new:
            with contextlib.suppress(QueueNotFound):
                left = await self.queue(current.tenant, QueueName(old))
                pairs.append((left.name, left.create_revision))
        kept: list[tuple[QueueName, int]] = []
        for pair in pairs:
            if pair[0] == new or pair in kept:
                continue
            entry = await self.coordinator.get(self.paths.queue(current.tenant, pair[0]))
            if entry is not None and entry.create_revision == pair[1]:
                kept.append(pair)
        return tuple(kept)

    async def _check_dead_letter_queue(
        self, tenant: TenantId, name: QueueName, attrs: QueueAttributes
    ) -> None:
        dlq = attrs.dead_letter_queue
        if dlq is None:
            return
        if dlq == name:
            raise InvalidRequest("a queue cannot be its own dead_letter_queue")
        target = await self.record(tenant, QueueName(dlq))
        if target is None or target.deleting:
            raise InvalidRequest(f"dead_letter_queue {dlq!r} does not exist")

    # Watch ------------------------------------------------------------------------

    async def _settle(self, watched: WatchedPrefix) -> None:
        # Our own deletion is out of the local copy before the call returns (read your
        # writes), and its listeners have run, without waiting for the watch.
        await watched.refresh()

    async def _read_back(self, tenant: TenantId, name: QueueName) -> QueueRecord | None:
        """Read a record this gateway just wrote, once the watched copy holds it (read your
        writes: routing, listing and the listeners see it before this call returns). One
        key read, then the watch's own delivery of the write; a watch that does not bring
        it within its re-read interval (broken, or etcd went back) is replaced by a read."""
        entry = await self.coordinator.get(self.paths.queue(tenant, name))
        if entry is None:
            return None
        await self._caught_up(entry.mod_revision)
        return QueueRecord.from_entry(tenant, name, entry)

    async def _caught_up(self, revision: int) -> None:
        """Until the watched copy of ``queues/`` is as of ``revision``; a watch that does
        not bring it within its re-read interval (broken, or etcd went back) is replaced by
        a read."""
        if not await self.queues.caught_up(revision, self._reread_every_s):
            await self.queues.refresh()

    def _meta_changed(self, state: PrefixState, keys: set[str]) -> None:
        for key in sorted(keys):
            namespace, name = self.paths.split_meta_key(key)
            for listener in list(self._meta_listeners):
                listener(namespace, name)

    def _queues_changed(self, state: PrefixState, keys: set[str]) -> None:
        for key in sorted(keys):
            split = self.paths.split_queue_key(key)
            if split is not None:
                self._decoded.pop(f"{split[0]}/{split[1]}", None)
                entry = state.entries.get(key)
                self.index.update(*split, None if entry is None else entry.value)
                for listener in list(self._queue_listeners):
                    listener(*split)


def _check_class_kept(current: QueueRecord, attrs: QueueAttributes) -> None:
    """A queue on shared partitions keeps the replication class it was created with: its
    messages are in its pool's partitions, replicated as that pool is, and nothing moves a
    queue to another pool. Accepting the change would answer a factor the data does not
    have (docs/cluster.md, "The class of a pooled queue"). A queue made before pools has
    partitions of its own, which the manager re-places for a new factor."""
    if current.placement is None:
        return
    before = current.attributes
    for attribute in ("replication_factor", "replication_mode"):
        if getattr(attrs, attribute) != getattr(before, attribute):
            raise InvalidRequest(
                f"{attribute} of queue {current.name!r} is fixed at creation on shared partitions "
                f"(it is {getattr(before, attribute)!r}); create another queue to change it"
            )
