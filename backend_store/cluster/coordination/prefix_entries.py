"""The keys under a prefix as a watch's successive states hold them, each state derived from
the one before in O(changes).

A watch hands out a whole state for each response of etcd's events, and listeners may keep
any of them (``WatchedPrefix`` compares the one it held with the new one; the manager keeps
the last it planned on). Copying the previous state's entries for each response cost every
watcher of ``queues/`` 37 us an event at 10,000 queues, and creating a queue is one event
for each of them: five watchers in a dev cluster (three nodes, the leading manager, the
gateway), about a sixth of the servers' CPU a create (issue 49).

:class:`LayeredEntries` shares a base dict, never changed once made, with the states it was
derived from, over which lie the changes made since (an entry, or None for a removed key).
Deriving a state copies only those changes; once they number more than ``sqrt(2 * base)``
they are merged into a new base. An event then costs a copy of at most that many changes
plus a whole copy's share (one every ``sqrt(2 * base)`` events): about 140 entries at
10,000 keys where the whole copy was 10,000. A lookup is two dict probes at most.
"""

from __future__ import annotations

import math
from collections.abc import ItemsView, Iterable, Iterator, Mapping, ValuesView

from .coordinator import Entry

# Changes over a base are merged into a new base once they pass ``sqrt(2 * base)`` and
# this: copying k changes an event and a base of n every k events costs least at k = sqrt(2n).
MERGE_AT_LEAST = 64


class LayeredEntries(Mapping[str, Entry]):
    """An immutable mapping of key to :class:`Entry`: ``base`` with ``over`` laid on it."""

    __slots__ = ("_base", "_over", "_size")

    def __init__(self, base: Mapping[str, Entry], over: dict[str, Entry | None], size: int) -> None:
        self._base = base
        self._over = over
        self._size = size

    def changed(self, changes: Iterable[tuple[str, Entry | None]]) -> LayeredEntries:
        """A new mapping with ``changes`` applied in order (an entry put, or None for a key
        removed); this one is left as it is."""
        base, size = self._base, self._size
        over = dict(self._over)
        for key, entry in changes:
            before = over[key] if key in over else base.get(key)
            if entry is None:
                size -= before is not None
                if key in base:
                    over[key] = None
                else:
                    over.pop(key, None)
            else:
                size += before is None
                over[key] = entry
        if len(over) > max(MERGE_AT_LEAST, math.isqrt(2 * len(base))):
            merged = {key: entry for key, entry in base.items() if key not in over}
            merged.update((key, entry) for key, entry in over.items() if entry is not None)
            return LayeredEntries(merged, {}, size)
        return LayeredEntries(base, over, size)

    def __getitem__(self, key: str) -> Entry:
        over = self._over
        if key in over:
            entry = over[key]
            if entry is None:
                raise KeyError(key)
            return entry
        return self._base[key]

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, str):
            return False
        over = self._over
        if key in over:
            return over[key] is not None
        return key in self._base

    def __iter__(self) -> Iterator[str]:
        over = self._over
        for key in self._base:
            if key not in over:
                yield key
        for key, entry in over.items():
            if entry is not None:
                yield key

    def __len__(self) -> int:
        return self._size

    def items(self) -> ItemsView[str, Entry]:
        return _Items(self)

    def values(self) -> ValuesView[Entry]:
        return _Values(self)

    def _pairs(self) -> Iterator[tuple[str, Entry]]:
        over = self._over
        for key, entry in self._base.items():
            if key not in over:
                yield key, entry
        for key, found in over.items():
            if found is not None:
                yield key, found


class _Items(ItemsView[str, Entry]):
    _mapping: LayeredEntries

    def __iter__(self) -> Iterator[tuple[str, Entry]]:
        return self._mapping._pairs()


class _Values(ValuesView[Entry]):
    _mapping: LayeredEntries

    def __iter__(self) -> Iterator[Entry]:
        return (entry for _, entry in self._mapping._pairs())


def layered(entries: Mapping[str, Entry]) -> LayeredEntries:
    """``entries`` as a :class:`LayeredEntries` (a whole read's dict becomes its base, shared
    and never changed: the state read keeps it as it is)."""
    if isinstance(entries, LayeredEntries):
        return entries
    return LayeredEntries(entries, {}, len(entries))
