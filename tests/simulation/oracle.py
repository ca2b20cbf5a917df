"""The invariants, checked as the run goes (every durable change is checked when it is made).

What the simulation promises to catch, in the words of issue 24:

- **acknowledged-write-lost**: an acknowledged write is never lost. Every replica that holds
  an acknowledged entry is known (the disks tell :class:`Oracle` of every append, truncation
  and deletion); the last copy going is a violation.
- **replica-set-overlap**: a replica holding an acknowledged entry is deleted only while a
  majority of the partition's current replica set (etcd's map, as it is at that moment) holds
  that entry too: the old and the new majority overlap (Raft, Kafka). Deleting on absence from
  the map, or before the replacement caught up, breaks it before anything is visibly lost.
- **log-matching**: two logs never hold different entries at the same (LSN, epoch).
- **one-leader-per-epoch**: a partition's term is led by one process.
- **leader-completeness**: a replica that starts leading at epoch E holds every entry
  acknowledged by the leader of an earlier term, and no leader acknowledges an entry once a
  leader of a later term started without it (Raft's leader completeness: an entry is
  committed in the term of the leader that acknowledged it, which may be later than the
  entry's own epoch).
- After healing (:mod:`.simulation`): every acknowledged send is readable with the body it
  was acknowledged with, each FIFO group in send order (**readable-after-heal**,
  **fifo-order**), and a new send to every group succeeds (**available-after-heal**).
- **minority-fault-availability** (the ``minority`` fault mix): no single fault of a minority
  stops a partition's sends for longer than the bound.
- **record-write-storm** (:mod:`.cluster`): no etcd key is written more than 30 times within
  a second (session 88: a manager designating a resigned leader anew at every plan wrote a
  partition record 175 times a second while the leader held off).

Facts (:meth:`Oracle.fact`) are what happened that a diagnosis can point at (an early-shipped
entry whose commit failed, etcd going back in time, leadership designated to a node that
cannot lead); :mod:`.diagnosis` reads them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from backend_store.cluster.coordination.layout import Layout, PartitionRecord
from backend_store.errors import PushgateError
from backend_store.types import LogEntry, Lsn

from .etcd_model import EtcdServer
from .kernel import Trace
from .sim_store import ReplicaData

EntryKey = tuple[int, int, int]  # (partition, LSN, epoch)


@dataclass(frozen=True, slots=True)
class Violation:
    invariant: str
    at: float
    detail: str


@dataclass(slots=True)
class Acked:
    """An acknowledged send and the log entry it is in."""

    partition: int
    lsn: int
    epoch: int  # the entry's
    record: bytes
    term: int  # the epoch of the leader that answered: the term the entry was committed in
    group: str
    seq: int
    body: bytes
    at: float


@dataclass(slots=True)
class LeaderTerm:
    node: str
    incarnation: int
    at: float
    log: list[LogEntry]  # the leader's log (appended in place: read up to ``length``)
    length: int  # its length when the term began


@dataclass(frozen=True, slots=True)
class Fact:
    at: float
    kind: str
    detail: str
    partition: int | None = None
    node: str | None = None


class InvariantViolated(Exception):
    def __init__(self, violation: Violation) -> None:
        super().__init__(f"{violation.invariant}: {violation.detail}")
        self.violation = violation


@dataclass(slots=True)
class Oracle:
    trace: Trace
    layout: Layout
    etcd: EtcdServer | None = None
    violation: Violation | None = None
    facts: list[Fact] = field(default_factory=list)
    acked: dict[EntryKey, list[Acked]] = field(default_factory=dict)
    acked_sends: dict[tuple[str, int], Acked] = field(default_factory=dict)  # (group, seq) -> ack
    _entries: dict[EntryKey, bytes] = field(default_factory=dict)
    _holders: dict[EntryKey, set[str]] = field(default_factory=dict)
    _terms: dict[tuple[int, int], LeaderTerm] = field(default_factory=dict)
    _replies: dict[tuple[int, str], tuple[int, int, bytes, int]] = field(default_factory=dict)
    _resigned_at: dict[tuple[str, int], float] = field(default_factory=dict)
    on_fact: list[Callable[[Fact], None]] = field(default_factory=list)
    # The value each corrupted key held before (``corrupted``): bytes garbled in etcd change
    # no replica set, so a deletion is judged against the set last written.
    _before_corruption: dict[str, bytes] = field(default_factory=dict)

    def now(self) -> float:
        return asyncio.get_running_loop().time()

    def fail(self, invariant: str, detail: str) -> None:
        if self.violation is None:
            self.violation = Violation(invariant, self.now(), detail)
            self.trace.add(self.now(), "oracle", f"VIOLATION {invariant}: {detail}")

    def fact(self, kind: str, detail: str, *, partition: int | None = None, node: str | None = None) -> None:
        fact = Fact(self.now(), kind, detail, partition, node)
        self.facts.append(fact)
        self.trace.add(fact.at, "fact", f"{kind}: {detail}")
        for listener in self.on_fact:
            listener(fact)

    # Disks (DiskObserver) -------------------------------------------------------------------

    def appended(self, node: str, partition: int, entries: Sequence[LogEntry]) -> None:
        for entry in entries:
            key = (partition, entry.lsn, entry.epoch)
            held = self._entries.setdefault(key, entry.record)
            if held != entry.record:
                self.fail(
                    "log-matching",
                    f"p{partition}: {node} wrote an entry at LSN {entry.lsn}, epoch {entry.epoch} that differs"
                    f" from the one {', '.join(sorted(self._holders.get(key, ()))) or 'another replica'} holds",
                )
            self._holders.setdefault(key, set()).add(node)

    def truncated(self, node: str, partition: int, after: Lsn, dropped: Sequence[LogEntry]) -> None:
        for entry in dropped:
            self._drop(node, (partition, entry.lsn, entry.epoch), f"{node} truncated after LSN {after}")

    def deleting(self, node: str, partition: int, data: ReplicaData, why: str) -> None:
        replicas = self._map_replicas(partition)
        for entry in data.entries:
            key = (partition, entry.lsn, entry.epoch)
            if key not in self.acked:
                continue
            holders = {n for n in self._holders.get(key, ()) if n != node and n in replicas}
            need = len(replicas) // 2 + 1
            if len(holders) < need:
                where = (
                    f"the map's replica set is {', '.join(replicas)}, {len(holders)} of which hold it"
                    if replicas
                    else "the map does not name the partition"
                )
                self.fail(
                    "replica-set-overlap",
                    f"{node} deleted its replica of p{partition} ({why}) holding acknowledged LSN {entry.lsn}"
                    f" (epoch {entry.epoch}); {where}",
                )
                break
        for entry in data.entries:
            self._drop(node, (partition, entry.lsn, entry.epoch), f"{node} deleted its replica ({why})")

    def commit_lost(self, node: str, partition: int, entry: LogEntry, why: str) -> None:
        self.fact(
            "commit-lost",
            f"{node}: the commit of p{partition} LSN {entry.lsn} (epoch {entry.epoch}), shipped early, failed ({why})",
            partition=partition,
            node=node,
        )

    def _drop(self, node: str, key: EntryKey, how: str) -> None:
        holders = self._holders.get(key)
        if holders is None:
            return
        holders.discard(node)
        if not holders and key in self.acked:
            first = self.acked[key][0]
            self.fail(
                "acknowledged-write-lost",
                f"p{key[0]}: the last copy of acknowledged LSN {key[1]} (epoch {key[2]}; group {first.group}"
                f" seq {first.seq}) is gone: {how}",
            )

    def corrupted(self, key: str, before: bytes | None) -> None:
        """``key``'s value is garbled now; ``before`` is what it held."""
        if before is not None:
            self._before_corruption[key] = before
        self.fact("corrupt-record", f"{key} cannot be read any more")

    def _map_replicas(self, partition: int) -> tuple[str, ...]:
        """The partition's replica set in etcd now; for a record garbled since it was
        written, the set it held (found with seed ``all`` 275876, session 37: a copy deleted
        on a tombstone 53 ms after its record was garbled was judged against no set at all)."""
        if self.etcd is None:
            return ()
        key = self.layout.partition(partition)
        found = self.etcd.state.kv.get(key)
        if found is None:
            return ()
        for value in (found.value, self._before_corruption.get(key)):
            if value is None:
                continue
            try:
                return PartitionRecord.unpack(value).replicas
            except PushgateError:
                continue
        return ()

    # Leaders ------------------------------------------------------------------------------------

    def leader_started(
        self, node: str, incarnation: int, partition: int, epoch: int, data: ReplicaData
    ) -> None:
        key = (partition, epoch)
        found = self._terms.get(key)
        if found is not None and (found.node, found.incarnation) != (node, incarnation):
            self.fail(
                "one-leader-per-epoch",
                f"p{partition}: {node} started leading epoch {epoch}, which {found.node}"
                f" (incarnation {found.incarnation}) led since t={found.at:.3f}",
            )
        self._terms[key] = LeaderTerm(node, incarnation, self.now(), data.entries, len(data.entries))
        self.trace.add(self.now(), node, f"p{partition}: leads epoch {epoch} from LSN {data.last_lsn}")
        for (pid, lsn, e), acks in self.acked.items():
            if (
                pid == partition
                and min(a.term for a in acks) < epoch
                and not data.holds(lsn, e, acks[0].record)
            ):
                self.fail(
                    "leader-completeness",
                    f"p{partition}: {node} started leading epoch {epoch} without acknowledged LSN {lsn}"
                    f" (epoch {e}, group {acks[0].group} seq {acks[0].seq}); its log ends at LSN {data.last_lsn}",
                )
                return

    def resigned(self, node: str, partition: int) -> None:
        self._resigned_at[(node, partition)] = self.now()
        self.fact(
            "resigned", f"{node} resigned p{partition} for lack of a quorum", partition=partition, node=node
        )

    def resigned_recently(self, node: str, partition: int, within_s: float) -> bool:
        at = self._resigned_at.get((node, partition))
        return at is not None and self.now() - at <= within_s

    # Writes answered and acknowledged ---------------------------------------------------------------

    def replied(self, node: str, partition: int, encoded: Any, data: ReplicaData, epoch: int) -> None:
        """The leader of term ``epoch`` answered a send: remember which entry holds each
        message it reports."""
        del node
        if not isinstance(encoded, list):
            return
        for item in encoded:
            if isinstance(item, list) and item and isinstance(item[0], str) and item[0].startswith("m"):
                lsn = int(item[0][1:].split(".")[0])
                if 1 <= lsn <= len(data.entries):
                    entry = data.entries[lsn - 1]
                    self._replies[(partition, item[0])] = (entry.lsn, entry.epoch, entry.record, epoch)

    def acknowledged(self, partition: int, message_id: str, group: str, seq: int, body: bytes) -> None:
        """A gateway got the answer to a send: it is acknowledged."""
        where = self._replies.get((partition, message_id))
        if where is None:
            self.fail("model", f"p{partition}: message {message_id} acknowledged but no leader answered it")
            return
        lsn, epoch, record, term = where
        ack = Acked(partition, lsn, epoch, record, term, group, seq, body, self.now())
        key = (partition, lsn, epoch)
        self.acked.setdefault(key, []).append(ack)
        self.acked_sends[(group, seq)] = ack
        if not self._holders.get(key):
            self.fail(
                "acknowledged-write-lost",
                f"p{partition}: LSN {lsn} (epoch {epoch}) acknowledged with no copy",
            )
            return
        for (pid, later), leader in self._terms.items():
            if (
                pid == partition
                and later > term
                and not (lsn <= leader.length and _holds(leader.log, lsn, epoch, record))
            ):
                self.fail(
                    "leader-completeness",
                    f"p{partition}: LSN {lsn} (epoch {epoch}) was acknowledged by the leader of epoch {term}"
                    f" after {leader.node} started leading epoch {later} without it",
                )
                return

    def holders(self, partition: int, lsn: int, epoch: int) -> set[str]:
        return set(self._holders.get((partition, lsn, epoch), ()))


def _holds(log: list[LogEntry], lsn: int, epoch: int, record: bytes) -> bool:
    return 1 <= lsn <= len(log) and log[lsn - 1].epoch == epoch and log[lsn - 1].record == record
