"""Equal documents held once: what a node keeps per queue at thousands of queues.

A node holds every queue's record from ``queues/`` (``QueueRecords``) and, for the partitions
it leads, the store attributes it applied per queue (``PoolQueues.applied``). Decoded, a record
is a dict of twenty-odd entries (about 750 bytes with its strings) and the applied attributes
another of fifteen (about 500), per queue, while most queues share their attributes and a pool
has a handful of partitions: at 10,000 queues a few distinct documents. So each document is
held once, shared by every queue whose document is equal, and dropped with its last holder
(issue 49: node memory per queue).

A shared document is read, never changed: a holder that wants another replaces it.
"""

from __future__ import annotations

import weakref
from collections.abc import Hashable, Mapping
from typing import Any

import msgpack


class SharedDoc(dict[str, Any]):
    """A document held by several queues (read only, by convention: see the module)."""

    __slots__ = ("__weakref__",)


def _key(doc: Mapping[str, Any]) -> Hashable:
    """A key equal only for equal documents: the document's msgpack bytes (~4 us a record
    where :func:`_frozen` took ~50: every node shares each record its watch brings, issue 49).
    A tuple packs as a list (alike to a reader); an equal document with its keys in another
    order gets another key, and is held twice (memory only). What msgpack cannot pack is
    frozen instead (TypeError: something cannot be)."""
    try:
        packed: bytes = msgpack.packb(doc)
        return packed
    except (TypeError, ValueError, OverflowError):
        return _frozen(doc)


def _frozen(value: Any) -> Hashable:
    """A hashable value equal for equal documents (TypeError: something cannot be)."""
    if isinstance(value, list | tuple):
        return (type(value).__name__, tuple(_frozen(v) for v in value))
    if isinstance(value, Mapping):
        return ("map", tuple(sorted((str(k), _frozen(v)) for k, v in value.items())))
    hash(value)
    return (type(value).__name__, value)


class SharedDocs:
    """Hands out one :class:`SharedDoc` per distinct content, while anything holds it."""

    def __init__(self) -> None:
        self._held: weakref.WeakValueDictionary[Hashable, SharedDoc] = weakref.WeakValueDictionary()

    def __len__(self) -> int:
        return len(self._held)

    def share(self, doc: Mapping[str, Any]) -> dict[str, Any]:
        """The shared document equal to ``doc`` (a copy of it, if none is held yet)."""
        try:
            key = _key(doc)
        except TypeError:  # an unhashable value: a private copy
            return dict(doc)
        found = self._held.get(key)
        if found is None:
            found = self._held[key] = SharedDoc(doc)
        return found
