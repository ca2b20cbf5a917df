"""A node's reconcile round over the replicas it hosts: judge etcd (node_identity.py),
decide what to serve, keep as a stray or delete (reconcile.py), then open, label, keep on
disk what serving needs, and hand each served replica to its leadership (leadership.py).
One partition's failing step costs that partition alone (``_partition_step``). A part of
:class:`~.node.Node`, which provides the attributes below and runs the round."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Collection, Iterable

from ...types import Epoch
from ..coordination.coordinator import Coordinator, CoordinatorUnavailable, Session
from ..coordination.identity import refusing_nodes
from ..coordination.layout import Layout, LeaderRecord, NodeRecord, PartitionRecord, Tombstone
from ..coordination.timeline import RecordMark, incarnation_floor
from .etcd_records import read_nodes, tombstone_stands
from .leadership import NodeLeadership
from .node_identity import pack_label, read_label
from .node_serving import NodeServing
from .partition_host import PartitionHost
from .pool_queues import QueueRecords
from .ports import NodeClock, NodeFiles, ReplicaStores
from .publication import Publication
from .receipts import KeptReceipt
from .reconcile import Decision, HostedReplica, IdentityVerdict, MapView, ReplicaLabel, decide
from .registrations import Registrations
from .remembered_records import worth_keeping
from .served_sets import ServedSets

log = logging.getLogger("pushgate.cluster")
# A replica this node could not serve (it would not open, or what serving it needs could not
# be kept on disk) is tried again this long after: a stray meanwhile.
_RETRY_AFTER_S = 30.0
_DELETING = "deleting its copy"  # the step's name, in its failures' reasons


class ReplicaRounds(NodeServing):
    coordinator: Coordinator
    layout: Layout
    files: NodeFiles
    replicas: ReplicaStores
    clock: NodeClock
    leadership: NodeLeadership
    publication: Publication
    # What etcd says, from the watches.
    _partitions: MapView | None
    _tombstones: dict[int, Tombstone]
    _leaders: dict[int, tuple[LeaderRecord, Epoch]]
    _nodes: dict[str, NodeRecord]
    _nodes_read: bool
    registrations: Registrations
    _queues: QueueRecords
    # What this node keeps of its replicas (Node.__init__ says what each is).
    _on_disk: set[int] | None
    _labels: dict[int, ReplicaLabel | None]
    strays: dict[int, str]
    _stray_ranks: dict[int, tuple[int, int]]
    _unservable: dict[int, tuple[str, float]]
    _failing: dict[tuple[int, str], str]
    _receipts: dict[int, KeptReceipt]
    _remembered: dict[int, PartitionRecord]
    _marks: dict[int, RecordMark]
    _served_sets: ServedSets

    async def _reconcile(self, session: Session) -> None:
        """One round under ``session`` (the node publishes its record after each)."""
        if self._on_disk is None and self._partitions is not None:
            # The first decision also sees the replicas left on disk from before this start.
            self._on_disk = await self.replicas.on_disk()
        known = self._on_disk or set()
        verdict = await self.identity.judge(
            holds_replicas=bool(known or self.hosts),
            etcd_has_map=bool(self._partitions is not None and self._partitions.records),
            refusing=self._others_refusing,
        )
        decision = self._decide(verdict, {})
        opened: dict[int, PartitionHost] = {}
        try:
            if decision.refused is None:
                # New replicas are opened aside and their labels read before anything serves
                # them: a replica of another cluster or queue is never served, not even once.
                tried = [p for p in decision.serve if p not in self.hosts]
                for pid in tried:
                    if (host := await self._try_open(pid)) is not None:
                        opened[pid] = host
                if tried:
                    decision = self._decide(verdict, opened)
                # Before a replica opened now is served (a leader's link routed to it): a
                # node that just started holds, in its marks, the evidence that etcd went
                # back, and must raise the incarnation (so that the replica follows no term
                # of the earlier one) before a leader on a restored designation reaches it.
                await self._settle_timeline(opened.values())
            for pid in [p for p in opened if p in decision.serve]:
                self.hosts[pid] = opened.pop(pid)
                known.add(pid)
        finally:
            # Not served (a stray now), or the round failed: never left open unrecorded (a
            # second open of it in this process would fail for good).
            for host in opened.values():
                await host.close()
        # A copy its tombstone could not delete yet is a stray meanwhile.
        undeleted = self._undeleted(decision.delete)
        await self._keep_strays({**decision.strays, **undeleted})
        await self._rank_strays()
        # Each tombstone read again directly, then the cluster record: never delete on what a
        # watch shows alone.
        deletions = {
            pid: why
            for pid, why in decision.delete.items()
            if await tombstone_stands(
                self.coordinator, self.layout, self.node_id, pid, self._tombstones.get(pid)
            )
        }
        refusal = await self.identity.refusal_now() if deletions else None
        if refusal is not None:
            log.warning("node %s: deleting nothing now: %s", self.node_id, refusal)
        else:
            for pid, why in deletions.items():
                if await self._partition_step(pid, _DELETING, self._delete_replica(pid, why)) is None:
                    known.discard(pid)
            if (now := self._undeleted(decision.delete)) != undeleted:
                self.strays = {p: w for p, w in self.strays.items() if p not in undeleted} | now
                self.publication.ask()
        self._on_disk = known
        if decision.refused is not None:
            return
        addresses = {n: rec.address for n, rec in self._nodes.items()}
        heard = self.registrations.heard()
        for pid, record in decision.serve.items():
            serving = self.hosts.get(pid)
            if serving is None:
                # Named by the map as it changed while other replicas were being opened (the
                # second decision above): opened on the next round, 0.2 s on.
                continue
            value = decision.serve_values.get(pid)
            kept = await self._partition_step(
                pid,
                "keeping on disk what serving it needs",
                self._keep_first(serving, record, value, verdict),
            )
            if kept is not None:
                await self._set_aside(pid, kept)
                continue
            await self._partition_step(
                pid,
                "serving it",
                self.leadership.reconcile(
                    session,
                    serving,
                    record,
                    addresses,
                    self._leaders,
                    self._nodes,
                    self._queues,
                    value,
                    heard=heard,
                ),
            )

    async def _settle_timeline(self, opened: Iterable[PartitionHost]) -> None:
        """Before any campaign, and before a replica opened now is served: settle whether
        etcd went back in time (coordination/timeline.py), raising the incarnation if it did."""
        for host in [*self.hosts.values(), *opened]:
            self.identity.timeline.remember(host.store.epoch)
        self._check_marks()
        await self.identity.settle_timeline()

    def _undeleted(self, delete: Collection[int]) -> dict[int, str]:
        """The copies of ``delete`` whose deletion failed at its last try, with why: strays
        meanwhile (not served, reported: the manager keeps a tombstone while a node reports
        the copy)."""
        return {pid: why for (pid, step), why in self._failing.items() if step == _DELETING and pid in delete}

    async def _partition_step(self, pid: int, what: str, step: Awaitable[None]) -> str | None:
        """Await one partition's ``step`` of a round: None once done, else why it failed.

        A failure costs that partition alone, this round: logged (once per reason, with its
        traceback) and tried again next round, while the node goes on with its other
        partitions and publishes its record. A round was all or nothing: one partition whose
        step kept failing (a small file that a full disk will not take) stopped the node's
        record and every other partition's role changes for good
        (tests/cluster/test_failing_partition_steps.py). etcd unavailable is no partition's
        failure: it ends the round (``_run``)."""
        try:
            await step
        except CoordinatorUnavailable:
            raise
        except Exception as exc:  # a store's or a file's error, or a bug: this partition's alone
            why = f"{what} failed: {exc}"
            if self._failing.get((pid, what)) != why:
                log.error("node %s: partition %d: %s", self.node_id, pid, why, exc_info=exc)
            self._failing[pid, what] = why
            return why
        if self._failing.pop((pid, what), None) is not None:
            log.warning("node %s: partition %d: %s works again", self.node_id, pid, what)
        return None

    async def _keep_first(
        self,
        host: PartitionHost,
        record: PartitionRecord,
        record_value: bytes | None,
        verdict: IdentityVerdict,
    ) -> None:
        """Keep what serving ``host`` on ``record`` needs on disk first: the replica's label,
        the record (remembered_records.py) and the voting set (served_sets.py)."""
        pid = host.partition
        await self._label(host, record, verdict)
        if record_value is None:
            return
        # Marked when it changes, or first seen by a version that marks. Not while etcd is
        # suspect: the record may be one a restore brought back, and its mark would bury the
        # evidence.
        mark = self._mark_now(pid)
        kept, kept_mark = self._remembered.get(pid), self._marks.get(pid)
        if worth_keeping(record, mark, kept, kept_mark) and not self.identity.timeline.suspect:
            await self.files.remember(pid, record, mark)
            self._remembered[pid] = record
            if mark is not None:
                self._marks[pid] = mark
        await self._keep_served_set(pid, record, host)

    async def _set_aside(self, pid: int, why: str) -> None:
        """Stop serving a replica whose needs could not be kept (a full disk): a stray with
        why, tried again after ``_RETRY_AFTER_S``. Left serving, it would hold a role it may
        not: as a designated leader that never campaigns, its partition had no leader."""
        self._unservable[pid] = (why, self.clock.now() + _RETRY_AFTER_S)
        await self._keep_strays({**self.strays, pid: why})

    def _check_marks(self) -> None:
        """Whether etcd holds a record this node marked at an older mod revision: it went
        back in time, even when its revision did not (coordination/timeline.py)."""
        if self._partitions is None or not self._marks:
            return
        incarnation, timeline = self.identity.incarnation, self.identity.timeline
        was_suspect, was_high = timeline.suspect, timeline.high_water
        rewound = timeline.check_marks(self._marks, self._partitions.mod_revisions, incarnation)
        # Once, not at every tick until the raise; but also when etcd was suspect already
        # for another reason (a state behind a remembered epoch, which logs nothing): this
        # evidence is new when it raised the high-water mark.
        if rewound and (not was_suspect or timeline.high_water > was_high):
            log.warning(
                "node %s: etcd holds the records of partitions %s older than this node saw them"
                " in incarnation %d: etcd went back in time (restored from a snapshot?)",
                self.node_id,
                rewound,
                incarnation,
            )

    def _mark_now(self, pid: int) -> RecordMark | None:
        """The mark of ``pid``'s record as this node holds it now (None: not read now)."""
        if self._partitions is None or pid not in self._partitions.mod_revisions:
            return None
        return RecordMark(self.identity.incarnation, self._partitions.mod_revisions[pid])

    async def _keep_served_set(self, pid: int, record: PartitionRecord, host: PartitionHost) -> None:
        """Keep the voting set ``host``'s copy is served on (served_sets.py)."""
        last_epoch, last_lsn = host.last_entry()
        served = self._served_sets.served(
            pid, record.replicas, self.identity.incarnation, last_epoch, last_lsn
        )
        if served is not None:
            await self.files.keep_served_set(pid, served)
            self._served_sets.keep(pid, served)

    def _decide(self, verdict: IdentityVerdict, opened: dict[int, PartitionHost]) -> Decision:
        hosted = {
            pid: HostedReplica(
                pid, open=False, last_lsn=rank[1] if (rank := self._stray_ranks.get(pid)) else None
            )
            for pid in self._on_disk or ()
        }
        now = self.clock.now()
        for pid, (why, retry_at) in self._unservable.items():
            if now < retry_at:
                hosted[pid] = HostedReplica(pid, open=False, unservable=why)
        for pid, host in [*self.hosts.items(), *opened.items()]:
            hosted[pid] = HostedReplica(pid, True, self._labels.get(pid), host.store.last_lsn)
        return decide(self.node_id, hosted, self._partitions, self._tombstones, verdict)

    async def _try_open(self, pid: int) -> PartitionHost | None:
        """Open a replica (to serve it, or to read a stray's position); None if it cannot be
        opened. Then it is kept as a stray, reported with why, and tried again after
        ``_RETRY_AFTER_S``: one damaged replica must not stop the node serving the others
        (it stopped every partition of the node, and kept its healthy replicas open
        unrecorded: tests/cluster/test_unopenable_replica.py)."""
        try:
            host = await self._open_host(pid)
        except Exception as exc:  # whatever a damaged or unreadable replica raises: its failure alone
            why = f"cannot be opened here: {exc}"
            if (before := self._unservable.get(pid)) is None or before[0] != why:
                log.error("node %s: partition %d %s", self.node_id, pid, why, exc_info=exc)
            self._unservable[pid] = (why, self.clock.now() + _RETRY_AFTER_S)
            return None
        if self._unservable.pop(pid, None) is not None:
            log.warning("node %s: partition %d opens again; serving it is tried again", self.node_id, pid)
        return host

    async def _open_host(self, pid: int) -> PartitionHost:
        host = await self.replicas.open(
            pid, self._notify, lambda: incarnation_floor(self.identity.incarnation)
        )
        try:
            self._labels[pid] = await read_label(host.store)
        except BaseException:
            await host.close()
            raise
        return host

    async def _label(self, host: PartitionHost, record: PartitionRecord, verdict: IdentityVerdict) -> None:
        """Label a served replica that carries no label yet (new, or from before labels)."""
        pid = host.partition
        if self._labels.get(pid) is not None or verdict.cluster_id is None:
            return
        label = ReplicaLabel(
            verdict.cluster_id, pid, record.tenant, record.queue, record.index, record.queue_revision
        )
        await host.store.set_replica_label(pack_label(label))
        self._labels[pid] = label

    async def _keep_strays(self, strays: dict[int, str]) -> None:
        """Stop serving replicas that became strays (their files stay), and report each once."""
        for pid, why in strays.items():
            host = self.hosts.pop(pid, None)
            if host is not None:
                self._stray_ranks[pid] = host.last_entry()
                self.events.forget_partition(pid)
                await self._partition_step(pid, "closing it", self._stop_serving(host))
            if self.strays.get(pid) != why:
                log.warning(
                    "node %s: keeping partition %d as a stray, not served: %s", self.node_id, pid, why
                )
                self.publication.ask()
        if strays.keys() != self.strays.keys():
            self.publication.ask()
        self.strays = dict(strays)

    async def _stop_serving(self, host: PartitionHost) -> None:
        await self.leadership.resign_key(host.partition)
        await host.close()

    async def _rank_strays(self) -> None:
        """Read the position of each stray this process never held open (found on disk at
        start): opened aside, read and closed, never served. Published, it lets a promotion
        after an etcd restore see a stray of a node restarted since it held the replica."""
        for pid in [p for p in self.strays if p not in self._stray_ranks and p not in self.hosts]:
            if not self.replicas.holds(pid) or pid in self._unservable:
                continue  # a re-seed's leftovers, or a copy that cannot be read: no position
            host = await self._try_open(pid)
            if host is None:
                continue
            try:
                self._stray_ranks[pid] = host.last_entry()
            finally:
                await host.close()
            self.publication.ask()

    async def _delete_replica(self, pid: int, why: str) -> None:
        tombstone, label = self._tombstones.get(pid), self._labels.get(pid)
        if tombstone is not None and tombstone.receipt is not None and label is not None:
            kept = KeptReceipt(label, tombstone.receipt)
            # Before the copy goes; and before anything else, so that a receipt that cannot
            # be written (a full disk) leaves the copy as it was, to be tried again.
            await self.files.keep_receipt(pid, kept)
            self._receipts[pid] = kept
        log.warning("node %s: deleting the replica of partition %d (%s)", self.node_id, pid, why)
        host = self.hosts.pop(pid, None)
        if host is not None:
            self.events.forget_partition(pid)
            await self.leadership.resign_key(host.partition)
            await host.close()
        await self.replicas.delete(pid, why)
        self._labels.pop(pid, None)
        self._stray_ranks.pop(pid, None)
        self._unservable.pop(pid, None)
        self._marks.pop(pid, None)
        if self._remembered.pop(pid, None) is not None:
            await self.files.forget(pid)
        if self._served_sets.forget(pid):
            await self.files.forget_served_set(pid)
        # Done: the tombstone has served (a failure here leaves it; deleting again is a no-op).
        with contextlib.suppress(CoordinatorUnavailable):
            await self.coordinator.delete(self.layout.tombstone(pid, self.node_id))

    async def _others_refusing(self) -> list[str]:
        """The other nodes registered in etcd as refusing it: from the watch, or read now
        if the watch has not delivered yet (asked only before founding a cluster)."""
        nodes = self._nodes
        if not self._nodes_read:
            nodes = read_nodes(await self.coordinator.read_prefix(self.layout.nodes))
        return refusing_nodes(nodes, self.node_id)
