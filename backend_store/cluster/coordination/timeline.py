"""Whether etcd went back in time, and raising the cluster's incarnation when it did.

Epochs are ``(incarnation, etcd revision)`` (:func:`~backend_store.types.make_epoch`). An etcd
restored from an older snapshot starts again from the snapshot's revision (and incarnation,
the ``cluster`` record being restored too), so without care the epochs it makes repeat ones
already used: two leaders of one epoch, and designations made before the snapshot's time
obeyed as if current (the simulation, ``restore`` seeds 2301, 2493, 2645 and ``all`` 2095).

A process that remembers a newer epoch than etcd can make now knows etcd went back. A node
remembers (:class:`Timeline`) its replicas' fences (on disk: they survive restarts), the
leader keys' epochs it saw, and every state its watches delivered; a watch state that is
behind that memory makes it *suspect*, and before it campaigns or serves a new term the node
settles the suspicion with :func:`raise_incarnation_past` on a fresh read: etcd really
behind, the incarnation is raised past the memory (so every epoch made from now on is newer
than any ever made, and every designation of the earlier incarnation is stale:
``node/leadership.py`` rule 8); a read that shows etcd is not behind (a watch state that
was merely older than another watch's) clears it.

A process restarted while etcd was away remembers only its fences; the others, which
remember more, settle it for everyone (the raise is a compare-and-put, and a raise that is
not needed is harmless).

Revisions alone miss two restores (session 40): one with every node down, whose revisions
passed the fences before a node started, and one with ``etcdutl snapshot restore
--bump-revision`` (etcd's own guide for restores), whose revisions jump past everything at
once while its keys go back. Keys show both: within one incarnation a key's mod revision
only grows, so a record etcd holds at an older mod revision than a node saw it at (a
:class:`RecordMark`, kept on the node's disk with the record) means etcd went back, and the
incarnation is over: :meth:`Timeline.check_marks` makes the node suspect the whole of it
(simulation seeds ``bumped`` 23, 25, 31: a designation undone by the restore was obeyed
as current, and a replica without acknowledged entries led).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from ...types import EPOCH_REVISION_BITS, epoch_incarnation, make_epoch
from .coordinator import Coordinator
from .identity import ClusterRecord
from .layout import Layout


@dataclass(frozen=True, slots=True)
class RecordMark:
    """A record as a process saw it change: the cluster's incarnation then and the record's
    mod revision in etcd."""

    incarnation: int
    mod_revision: int

    def pack(self) -> bytes:
        return f"{self.incarnation} {self.mod_revision}".encode()

    @classmethod
    def unpack(cls, data: bytes) -> RecordMark:
        incarnation, mod_revision = (int(part) for part in data.split())
        return cls(incarnation, mod_revision)


def last_epoch_of(incarnation: int) -> int:
    return make_epoch(incarnation, (1 << EPOCH_REVISION_BITS) - 1)


class Timeline:
    """The newest epoch a process knows etcd had made, and whether etcd seems behind it."""

    def __init__(self) -> None:
        self.high_water = 0
        self.suspect = False

    def remember(self, epoch: int) -> None:
        """An epoch etcd made (a replica's fence, a leader key's epoch)."""
        if epoch > self.high_water:
            self.high_water = epoch

    def observe(self, incarnation: int, revision: int) -> None:
        """etcd as a state shows it: at ``revision``, its record at ``incarnation``."""
        now = make_epoch(incarnation, revision)
        if now < self.high_water:
            self.suspect = True
        else:
            self.high_water = now

    def check_marks(
        self, marks: Mapping[int, RecordMark], mod_revisions: Mapping[int, int], incarnation: int
    ) -> list[int]:
        """The records (by id) etcd holds, in the ``incarnation`` they were marked in, at an
        older mod revision than their mark: etcd went back in time, whatever its revision.
        Any makes etcd suspect until the incarnation is raised past it."""
        rewound = [
            key
            for key, mark in marks.items()
            if mark.incarnation == incarnation
            and mod_revisions.get(key, mark.mod_revision) < mark.mod_revision
        ]
        if rewound:
            self.remember(last_epoch_of(incarnation))
            self.suspect = True
        return rewound

    def settle(self, incarnation: int, revision: int) -> bool:
        """A fresh read showed etcd at (``incarnation``, ``revision``): whether that settles
        the suspicion (etcd not behind any epoch remembered)."""
        now = make_epoch(incarnation, revision)
        if now < self.high_water:
            return False
        self.suspect = False
        self.high_water = now
        return True


@dataclass(frozen=True, slots=True)
class RaiseOutcome:
    record: ClusterRecord  # the cluster record as read afterwards
    revision: int  # etcd's revision at that read
    raised_to: int | None = None  # the incarnation this call wrote (None: none)
    behind: bool = False  # etcd was behind the epoch asked about


async def raise_incarnation_past(
    coordinator: Coordinator, layout: Layout, cluster_id: str | None, epoch: int
) -> RaiseOutcome | None:
    """If etcd cannot make an epoch newer than ``epoch`` now (it went back in time), raise
    the cluster's incarnation past it (a compare-and-put: racing raisers are safe, and a
    higher incarnation is never wrong, only needed). ``None``: etcd holds no record of
    ``cluster_id`` (nothing to raise; the identity rules refuse such an etcd anyway)."""
    state = await coordinator.read_prefix(layout.cluster)
    entry = state.entries.get(layout.cluster)
    record = ClusterRecord.parse(entry.value if entry is not None else None)
    found = record.identity
    if entry is None or found is None or found.cluster_id != cluster_id:
        return None
    if make_epoch(found.incarnation, state.revision) >= epoch:
        return RaiseOutcome(record, state.revision)
    raised = replace(found, incarnation=max(found.incarnation, epoch_incarnation(epoch)) + 1)
    wrote = await coordinator.compare_and_put(layout.cluster, raised.pack(), entry.mod_revision)
    fresh = await coordinator.get(layout.cluster)
    return RaiseOutcome(
        ClusterRecord.parse(fresh.value if fresh is not None else None),
        fresh.mod_revision if fresh is not None else state.revision,
        raised.incarnation if wrote else None,
        behind=True,
    )
