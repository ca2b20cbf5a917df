"""Indexes over the gateway's watched queue records, kept as the watch changes them.

With queues on shared partitions (docs/cluster.md, "Shared partitions") three questions come
up on hot paths that a scan of every record would answer in O(queues):

- **Which queues feed a dead-letter queue** (its messages live in their partitions): asked
  by every receive, peek and stats of a dead-letter queue, and when checking a receipt of one.
- **Which queues sit on a partition**: a new leader there may hold messages nobody was told
  about, so each of its queues is woken; a receipt of a partition is one of the tenant's only
  if one of its queues is placed there.
- **A tenant's queue names in order**: ``GET /v1/queues`` and ``ListQueues`` page through them.

Each record contributes what its document says (``dead_letter_queue``, the names in
``former_dead_letter_queues``, ``placement``); a changed or deleted record first takes back
what it contributed. Records marked ``deleting`` stay indexed (their deletion still needs
their partitions); readers skip them where a deleted queue must look absent.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import msgpack

from ...types import QueueName, TenantId
from ..coordination import pools
from ..coordination.queue_record import former_dead_letter_queues

_Key = tuple[TenantId, QueueName]


@dataclass(frozen=True, slots=True)
class _Contribution:
    feeds: frozenset[QueueName]  # dead-letter queues (current and former) it holds messages of
    placement: tuple[int, ...]


def _contribution(value: bytes) -> _Contribution:
    try:
        doc = msgpack.unpackb(value)
        if not isinstance(doc, Mapping):
            return _Contribution(frozenset(), ())
        feeds = {name for name, _ in former_dead_letter_queues(doc)}
        dlq = doc.get("dead_letter_queue")
        if isinstance(dlq, str):
            feeds.add(QueueName(dlq))
        return _Contribution(frozenset(feeds), pools.placement(doc) or ())
    except (ValueError, TypeError, msgpack.UnpackException):
        return _Contribution(frozenset(), ())  # unreadable: contributes nothing (reads fail on it)


class QueueIndex:
    """Dead-letter sources, queues by partition and sorted names, per watched record."""

    def __init__(self) -> None:
        self._by_key: dict[_Key, _Contribution] = {}
        self._sources: dict[_Key, set[QueueName]] = {}  # (tenant, dlq) -> queues feeding it
        self._on_partition: dict[int, set[_Key]] = {}
        self._names: dict[TenantId, list[QueueName]] = {}

    def update(self, tenant: TenantId, name: QueueName, value: bytes | None) -> None:
        """The record of ``tenant/name`` is now ``value`` (None: deleted)."""
        key = (tenant, name)
        old = self._by_key.pop(key, None)
        if old is not None:
            self._take_back(key, old)
        elif value is not None:
            bisect.insort(self._names.setdefault(tenant, []), name)
        if value is None:
            if old is not None:
                names = self._names.get(tenant, [])
                at = bisect.bisect_left(names, name)
                if at < len(names) and names[at] == name:
                    del names[at]
                if not names:
                    self._names.pop(tenant, None)
            return
        new = _contribution(value)
        self._by_key[key] = new
        for dlq in new.feeds:
            self._sources.setdefault((tenant, dlq), set()).add(name)
        for pid in new.placement:
            self._on_partition.setdefault(pid, set()).add(key)

    def _take_back(self, key: _Key, old: _Contribution) -> None:
        tenant, name = key
        for dlq in old.feeds:
            sources = self._sources.get((tenant, dlq))
            if sources is not None:
                sources.discard(name)
                if not sources:
                    del self._sources[(tenant, dlq)]
        for pid in old.placement:
            queues = self._on_partition.get(pid)
            if queues is not None:
                queues.discard(key)
                if not queues:
                    del self._on_partition[pid]

    def sources(self, tenant: TenantId, dlq: QueueName) -> list[QueueName]:
        """The queues whose records name ``dlq`` as their dead-letter queue, now or before
        (callers check the incarnation: ``QueueRecord.holds_dead_letters_of``)."""
        return sorted(self._sources.get((tenant, dlq), ()))

    def on_partition(self, pid: int) -> list[_Key]:
        """The queues placed on partition ``pid`` (a pool's), any tenant."""
        return sorted(self._on_partition.get(pid, ()))

    def tenant_on_partition(self, tenant: TenantId, pid: int) -> bool:
        """Whether one of the tenant's queues is placed on partition ``pid``."""
        return any(t == tenant for t, _ in self._on_partition.get(pid, ()))

    def names_after(self, tenant: TenantId, after: str, prefix: str = "") -> Iterator[QueueName]:
        """The tenant's queue names past ``after`` (and from ``prefix`` on, while they start
        with it), in order: a seek, then one step per name. Consume it before the index
        changes (the watch's listener runs between awaits, never during a loop without one)."""
        names = self._names.get(tenant, [])
        at = bisect.bisect_right(names, after) if after >= prefix else bisect.bisect_left(names, prefix)
        while at < len(names) and names[at].startswith(prefix):
            yield names[at]
            at += 1
