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

Marks on disk miss one more: a bumped restore to a snapshot taken after the last change of
every record a node marked (the restored map is the current one) while leader keys and node
records went back to the snapshot's. Keys a process watches show it the same way
(:class:`KeysSeen`, :meth:`Timeline.check_keys`, session 41): a node remembers the newest
mod revision it saw each leader key and its own node record at, and etcd showing one older
in the same incarnation went back. No simulation seed lost anything to that restore
(``late``, docs/testing.md), but unnoticed it leaves the snapshot's node records, positions
and all, standing as current, and every rule that counts only records written since a
restore needs the raise to know there was one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from ...types import EPOCH_REVISION_BITS, Epoch, epoch_incarnation, make_epoch
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


def incarnation_floor(incarnation: int) -> Epoch:
    """The oldest epoch a term of ``incarnation`` can have: a term older than that began before
    etcd was found to have gone back in time, and is over. Its designation may be one the
    restore brought back (the node it names campaigned before any other node saw the
    restore), so its leader may lack what a majority acknowledged; a replica follows no such
    leader, and such a leader steps down (issue 48: n0, designated by a snapshot taken before
    n2 led, won its campaign 0.15 s before n1 raised the incarnation, and n1 and n2 dropped
    the ten entries they had acknowledged under n2)."""
    return make_epoch(incarnation, 0)


class KeysSeen:
    """The newest mod revision a process saw each of some etcd keys at, with the cluster's
    incarnation then, in memory (the keys a node watches this way live under leases: a
    restarted node starts afresh, and its record marks on disk cover what outlives it).

    Within one etcd history a key's mod revision only grows: a write raises it, and a key
    deleted and made again gets a newer one. A watch hands out states in revision order (an
    older one only after a fresh read showed etcd went back), so a key a state shows at an
    older mod revision than seen before, in the same incarnation, is one etcd lost: it
    went back in time. A key absent is no evidence (its lease expired, it was deleted)."""

    def __init__(self) -> None:
        self.marks: dict[str, RecordMark] = {}

    def older(self, mod_revisions: Mapping[str, int], incarnation: int) -> list[str]:
        """The keys held at an older mod revision than seen in ``incarnation``."""
        return sorted(
            key
            for key, revision in mod_revisions.items()
            if (mark := self.marks.get(key)) is not None
            and mark.incarnation == incarnation
            and revision < mark.mod_revision
        )

    def see(self, mod_revisions: Mapping[str, int], incarnation: int) -> None:
        """Remember these keys as seen now (a mark of an earlier incarnation is replaced)."""
        for key, revision in mod_revisions.items():
            mark = self.marks.get(key)
            if mark is None or mark.incarnation != incarnation or revision > mark.mod_revision:
                self.marks[key] = RecordMark(incarnation, revision)


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

    def check_keys(self, seen: KeysSeen, mod_revisions: Mapping[str, int], incarnation: int) -> list[str]:
        """A watch state's keys (``mod_revisions``, seen in ``incarnation``) against what
        ``seen`` remembers: any held older makes etcd suspect until the incarnation is raised
        past it, as :meth:`check_marks` does. Remembered only while etcd is not suspect: a
        state a restore brought back would otherwise become the mark and bury the evidence."""
        rewound = seen.older(mod_revisions, incarnation)
        if rewound:
            self.remember(last_epoch_of(incarnation))
            self.suspect = True
        elif not self.suspect:
            seen.see(mod_revisions, incarnation)
        return rewound

    def check_write(self, before: RecordMark | None, held: int | None, incarnation: int) -> bool:
        """What etcd held a key at just before a write of ours (``held``, its answer) against
        the mark ``before`` the write was sent: older in the same incarnation means etcd went
        back, as in :meth:`check_keys`. The mark must be taken before the write: the watch
        may show the write's own result before its answer is read. Never remembered: the
        watch may still be behind the write, and hands out what it shows in order."""
        if before is None or held is None or before.incarnation != incarnation or held >= before.mod_revision:
            return False
        self.remember(last_epoch_of(incarnation))
        self.suspect = True
        return True

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
