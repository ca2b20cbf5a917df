"""The cluster manager (``pushgate manager``): keeps the partition map in etcd true.

Run two or more; they campaign for ``/pushgate/manager`` and one leads, the others stand by
(a standby takes over when the leader's lease expires). The leader watches queues, nodes,
partitions, leader keys, drain requests and tombstones and, on every change (and every
``tick_s``), computes the map's next state (:func:`.plan.plan`, pure: placement, promotion
and hand-overs in :mod:`.election`, replica-set changes one step at a time in
:mod:`.membership`) and writes it in one transaction fenced on its own epoch, so a deposed
manager's writes are refused by etcd.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Collection, Mapping

from ...errors import PushgateError
from ...types import Epoch
from ..coordination.coordinator import Coordinator, CoordinatorUnavailable, Entry, PrefixState, Session
from ..coordination.etcd_tls import EtcdTls
from ..coordination.identity import ClusterRecord, judge_stateless
from ..coordination.layout import (
    Layout,
    LeaderRecord,
    NodeRecord,
    PartitionRecord,
    Tombstone,
    pack,
    parse_ids,
    read_partition_map,
    unpack,
)
from ..coordination.pools import PoolRequest, placement
from .plan import ClusterView, Memory, Plan, PlanSettings, bounded, plan

log = logging.getLogger("pushgate.cluster")

# The prefixes the manager watches (start): it plans only once it has read every one.
_WATCHED = 8
# Operations in one of the manager's transactions at most: etcd's default --max-txn-ops
# (a larger change is committed over several ticks, plan.bounded). etcd applies the limit to
# the compares too, and a commit compares up to two records a partition it changes (its own,
# and a deleted one's queue) beside three others (the fence's two, the cluster record): a
# plan is bounded to half as many operations, less those three.
_TXN_OPS = 128
_PLAN_OPS = (_TXN_OPS - 3) // 2


class Manager:
    def __init__(
        self,
        coordinator: Coordinator,
        *,
        manager_id: str | None = None,
        ttl_s: float = 2.0,
        tick_s: float = 0.25,
        layout: Layout | None = None,
        rebalance: bool = True,
        replace_after_s: float = 300.0,
        settings: PlanSettings | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``replace_after_s``: replace the replicas of a node gone this long (0: never);
        ``settings`` (tests): every planning knob, in place of ``rebalance`` and it;
        ``clock``: the monotonic clock the plan's timers read (a simulation's virtual one)."""
        self.layout = layout or Layout()
        self.settings = settings or PlanSettings(rebalance=rebalance, replace_after_s=replace_after_s)
        self.memory = Memory()
        self.coordinator = coordinator
        self.manager_id = manager_id or f"manager-{uuid.uuid4().hex[:8]}"
        self.ttl_s = ttl_s
        self.clock = clock
        self.tick_s = tick_s
        self.view = ClusterView()
        # Every partition record read here, kept when it leaves etcd: one that comes back
        # unreadable (etcd restored from a backup that holds it corrupted, after a restore
        # that held no map) is repaired from it, not left unknown for good (simulation seed
        # `etcd` 6980, session 31: three restores and a corrupted record left a partition
        # unserved after healing).
        self._ever_read: dict[int, PartitionRecord] = {}
        # States of ``partitions/`` the watch delivered: a commit that saw none arrive while it
        # was under way clears the garbled-record marks of what it wrote (``cleared_marks``).
        self._partition_states = 0
        # Each partition record's bytes as etcd held them in the state the view was given (or
        # as this manager wrote them): a commit that writes or deletes a record expects them,
        # so that a plan made on a view etcd no longer holds changes nothing (below, _term).
        self._partition_values: dict[int, bytes] = {}
        self.epoch: Epoch | None = None  # set while leading
        self.leading = asyncio.Event()
        self._changed = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._held: dict[str, PrefixState] = {}  # per prefix, the state the view was last given
        self._queue_state = PrefixState(self.layout.queues, 0)  # the last one _on_queues took

    def _handlers(self) -> tuple[tuple[str, Callable[[PrefixState], bool]], ...]:
        """What the manager plans on, but the queue records (``_lead``): each prefix and the
        handler that takes it into the view, watched whether leading or standing by."""
        return (
            (self.layout.pools, self._on_pools),
            (self.layout.nodes, self._on_nodes),
            (self.layout.partitions, self._on_partitions),
            (self.layout.leaders, self._on_leaders),
            (self.layout.drain, self._on_drain),
            (self.layout.cluster, self._on_cluster),
            (self.layout.tombstones, self._on_tombstones),
        )

    async def start(self) -> None:
        for prefix, handler in self._handlers():
            self._tasks.append(asyncio.create_task(self._watch(prefix, handler), name=f"watch {prefix}"))
        self._tasks.append(asyncio.create_task(self._run(), name=self.manager_id))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks)

    async def _watch(self, prefix: str, handler: Callable[[PrefixState], bool]) -> None:
        # The watch compares its re-reads with what the view holds, not with what it last
        # yielded: a state dropped below is then not taken for the view's.
        def held() -> PrefixState:
            return self._held.get(prefix) or PrefixState(prefix, 0)

        while True:
            try:
                async for state in self.coordinator.watch_prefix(prefix, reread_every_s=2.0, held=held):
                    if self.epoch is not None and state.revision < self.epoch:
                        continue  # read before this manager led: _read_everything read it since
                    self._held[prefix] = state
                    if handler(state):
                        self._changed.set()
            except (CoordinatorUnavailable, PushgateError) as exc:
                log.warning("watch on %s failed: %s", prefix, exc)
                await asyncio.sleep(0.5)
            except Exception:
                log.exception("watch on %s failed", prefix)
                await asyncio.sleep(0.5)

    def _on_queues(self, state: PrefixState) -> bool:
        """Only the records that changed since the last state are read again (at ten
        thousand queues, reading every record at every create made creates cost O(N) each),
        and those of queues in a pool are left out of the view's ``queues``: the plan makes
        partitions for none of them (coordination/pools.py). Whether the plan may change: only
        if a queue with partitions of its own, or named by a partition record, changed (a
        pool's queues come and go without a plan; the tick plans anyway)."""
        before, self._queue_state = self._queue_state, state
        view = self.view
        named = {(r.tenant, r.queue) for r in view.partitions.values() if r.pool is None}
        moved = False
        for key in _changed(before, state):
            tenant, _, queue = key[len(state.prefix) :].partition("/")
            name = (tenant, queue)
            moved = moved or name in named or name in view.queues
            view.queues.pop(name, None)
            view.queue_revisions.pop(name, None)
            entry = state.entries.get(key)
            if entry is None or not queue:
                continue
            with contextlib.suppress(PushgateError):
                attributes = unpack(entry.value)
                if isinstance(attributes, dict):
                    view.queue_revisions[(tenant, queue)] = entry.create_revision
                    if not placement(attributes):  # a readable placement: a pool's queue
                        view.queues[(tenant, queue)] = attributes
                        moved = True
        return moved

    def _on_pools(self, state: PrefixState) -> bool:
        out: dict[str, PoolRequest] = {}
        for name, value in state.values().items():
            with contextlib.suppress(PushgateError):
                out[name] = PoolRequest.unpack(value)
        self.view.pools = out
        return True

    def _on_nodes(self, state: PrefixState) -> bool:
        out: dict[str, NodeRecord] = {}
        revisions: dict[str, int] = {}
        for key, entry in state.entries.items():
            node_id = key[len(state.prefix) :]
            with contextlib.suppress(PushgateError):
                out[node_id] = NodeRecord.unpack(entry.value)
                revisions[node_id] = entry.mod_revision
        self.view.nodes = out
        self.view.node_revisions = revisions
        return True

    def _on_partitions(self, state: PrefixState) -> bool:
        self._partition_states += 1
        read = read_partition_map(state.values(), self._ever_read)
        self._ever_read.update((pid, r) for pid, r in read.records.items() if pid not in read.stale)
        if read.unknown - self.view.unknown:
            log.warning(
                "%s: partition records %s cannot be read and were never read here: placing no"
                " new partition until they can (docs/cluster.md, 'Never delete on absence')",
                self.manager_id,
                sorted(read.unknown),
            )
        self.view.partitions, self.view.stale, self.view.unknown = read.records, read.stale, read.unknown
        self._partition_values = parse_ids(state.values())
        return True

    def _on_leaders(self, state: PrefixState) -> bool:
        out: dict[int, str] = {}
        for pid, value in parse_ids(state.values()).items():
            self.view.leader_seen[pid] = state.revision
            with contextlib.suppress(PushgateError):
                out[pid] = LeaderRecord.unpack(value).node
        self.view.leaders = out
        return True

    def _on_tombstones(self, state: PrefixState) -> bool:
        out: dict[tuple[int, str], Tombstone] = {}
        for key, value in state.values().items():
            pid, _, node_id = key.partition("/")
            if pid.isdigit() and node_id:
                with contextlib.suppress(PushgateError):
                    out[(int(pid), node_id)] = Tombstone.unpack(value)
        self.view.tombstones = out
        return True

    def _on_drain(self, state: PrefixState) -> bool:
        self.view.drained = set(state.values())
        return True

    def _on_cluster(self, state: PrefixState) -> bool:
        entry = state.entries.get(self.layout.cluster)
        record = ClusterRecord.parse(entry.value if entry else None)
        # Any readable cluster id is planned for, not only the first this manager saw: one
        # that first saw an id a new node made in a wiped etcd planned nothing for good once
        # the real cluster was restored (simulation seeds ``all`` 130314, 130698, 131073,
        # 131174, session 34). A plan on a foreign cluster's etcd cannot delete this
        # cluster's data: a node deletes only on a tombstone and a cluster record both read
        # directly (``node/etcd_records.tombstone_stands``, ``NodeIdentity.refusal_now``).
        verdict = judge_stateless(record, None, self.layout)
        if record.identity is not None and entry is not None:
            if record.identity.incarnation != self.view.incarnation:
                self.view.leader_seen.clear()  # a restore: revisions start over
            self.view.incarnation = record.identity.incarnation
            self.view.incarnation_revision = entry.mod_revision
        if verdict.refusal is not None and verdict.refusal != self.view.distrust:
            log.warning("%s: planning nothing: %s", self.manager_id, verdict.refusal)
        self.view.distrust = verdict.refusal
        return True

    async def _run(self) -> None:
        while True:
            try:
                session = await self.coordinator.open_session(self.ttl_s)
            except CoordinatorUnavailable:
                await asyncio.sleep(0.5)
                continue
            try:
                await self._campaign(session)
                await self._lead(session)
            except CoordinatorUnavailable as exc:
                log.warning("%s: etcd unavailable: %s", self.manager_id, exc)
            except Exception:  # a bug: log it, give up the lead, campaign again
                log.exception("%s: planning failed", self.manager_id)
                await asyncio.sleep(self.tick_s)
            finally:
                self.epoch = None
                self.leading.clear()
                with contextlib.suppress(CoordinatorUnavailable):
                    await session.close()

    async def _campaign(self, session: Session) -> None:
        while session.valid():
            claim = await self.coordinator.campaign(session, self.layout.manager, self.manager_id.encode())
            if claim.won:
                self.epoch = claim.epoch
                self.leading.set()
                log.warning("%s: leading the cluster at epoch %d", self.manager_id, claim.epoch)
                return
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.tick_s * 2):
                    await session.lost.wait()

    async def _lead(self, session: Session) -> None:
        epoch = self.epoch
        assert epoch is not None
        # Queue records are watched only while leading, from a whole read made after winning:
        # at 10,000 queues a standby's copy cost it as much CPU a create as the leader's, and
        # the plan needs only those of queues with partitions of their own (pools.py). The
        # other prefixes a standby keeps, for what they remember across states (leader_seen).
        queues = asyncio.create_task(self._watch(self.layout.queues, self._on_queues), name="watch queues")
        try:
            await self._term(session, epoch)
        finally:
            queues.cancel()
            await asyncio.wait([queues])
            self._held.pop(self.layout.queues, None)

    async def _term(self, session: Session, epoch: Epoch) -> None:
        await self._read_everything()
        # The counter is read once a term, not before every plan (a Range each watch response,
        # ~45 a second while queues are created: issue 49). Only the leader writes it, fenced
        # by its epoch, so what it read after winning plus its own commits is etcd's value, or
        # above it after a restore from an older backup: an id skipped, never one reused.
        counter = await self.coordinator.get(self.layout.partition_counter)
        self.view.counter = int(unpack(counter.value)) if counter is not None else 0
        while not session.lost.is_set():  # in doubt (not valid): plans nothing until renewed
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.tick_s):
                    await self._changed.wait()
            self._changed.clear()
            if len(self._held) < _WATCHED or not session.valid() or self.view.distrust is not None:
                continue  # never plan on a partial picture, nor on an etcd without the cluster
            change = plan(self.view, self.memory, now=self.clock(), settings=self.settings)
            change = bounded(change, _PLAN_OPS)
            if change.empty:
                continue
            states_seen = self._partition_states
            # What etcd, read directly, must hold for the change to stand: the commit holds
            # only while it still does (a read and its commit can straddle a restore).
            expect = self._records_expected(change)
            if change.deletes or change.tombstones:
                cluster = await self._cluster_confirmed()
                if cluster is None:
                    continue  # the cluster's watch is behind the others: plan again after it
                expect.update(cluster)
            if change.deletes:
                confirmed = await self._deletions_confirmed(change.deletes)
                if confirmed is None:
                    continue  # a watch is behind another: plan again once it has caught up
                expect.update(confirmed)
            created = {
                pid: rec
                for pid, rec in change.puts.items()
                if pid not in self.view.partitions and pid not in self.view.unknown  # unknown: rebuilt
            }
            if created and not await self._creations_confirmed(list(created.values())):
                continue  # the same: a partition is never placed twice
            layout = self.layout
            puts = {layout.partition(pid): rec.pack() for pid, rec in change.puts.items()}
            puts.update({layout.tombstone(p, n): rec.pack() for (p, n), rec in change.tombstones.items()})
            if change.counter != self.view.counter:
                puts[layout.partition_counter] = pack(change.counter)
            deletes = [layout.partition(pid) for pid in change.deletes]
            deletes += [layout.tombstone(p, n) for p, n in change.tombstone_deletes]
            holder = self.manager_id.encode()
            ok = await self.coordinator.fenced_commit(
                layout.manager, epoch, puts, deletes, holder=holder, expect=expect
            )
            if not ok and expect and await self._fence_holds(epoch, holder):
                log.info(
                    "%s: etcd no longer holds what a plan was made on (a watch behind, etcd restored):"
                    " reading the partitions again, then planning again",
                    self.manager_id,
                )
                await self._read_written()
                continue
            if not ok:
                log.warning("%s: fenced out (epoch %d is no longer the manager's)", self.manager_id, epoch)
                return
            for pid in change.deletes:
                log.info("%s: deleted partition %d (its queue is gone)", self.manager_id, pid)
            for (pid, node_id), stone in change.tombstones.items():
                log.info(
                    "%s: tombstone for %s's copy of partition %d (%s)",
                    self.manager_id,
                    node_id,
                    pid,
                    stone.reason,
                )
            # Our own write: apply it to the view now, so the next tick does not repeat it.
            self.view.counter = change.counter
            self.view.partitions.update(change.puts)
            self._partition_values.update((pid, puts[layout.partition(pid)]) for pid in change.puts)
            self._ever_read.update(change.puts)
            cleared = cleared_marks(change.puts, states_seen, self._partition_states)
            self.view.stale -= cleared
            self.view.unknown -= cleared
            for pid in change.deletes:
                self.view.partitions.pop(pid, None)
                self._partition_values.pop(pid, None)
            self.view.tombstones.update(change.tombstones)
            for key in change.tombstone_deletes:
                self.view.tombstones.pop(key, None)
            self._hold_written(puts, deletes)

    def _hold_written(self, puts: Mapping[str, bytes], deletes: Collection[str]) -> None:
        """Make the states the watches compare with hold this manager's own commit, as the
        view does. Its entries have revision 0, which etcd never gives: whatever etcd holds
        next is taken, the write as the watch brings it, or an etcd restored from a snapshot
        taken before it. Compared with the state before the write, that restored etcd looked
        unchanged, and a tombstone it lost stayed in the view: nothing wrote it again, and
        the node kept the copy as a stray for good (noticed in session 86; a lost record
        shows sooner, at the next commit's expectations, ``_read_written``)."""
        for prefix in (self.layout.partitions, self.layout.tombstones):
            held = self._held.get(prefix)
            written = {k: v for k, v in puts.items() if k.startswith(prefix)}
            gone = [k for k in deletes if k.startswith(prefix)]
            if held is None or (
                all(k in held.entries and held.entries[k].value == v for k, v in written.items())
                and not any(k in held.entries for k in gone)
            ):
                continue  # the watch brought the write already (or it changed nothing here)
            entries = dict(held.entries)
            entries.update((k, Entry(k, v, 0, 0)) for k, v in written.items())
            for key in gone:
                entries.pop(key, None)
            self._held[prefix] = PrefixState(prefix, held.revision, entries)

    async def _read_everything(self) -> None:
        """Read every prefix afresh, after winning: a plan stands only on what etcd held
        once this manager led. A watch can be seconds behind (this manager was cut off, etcd
        was down), and the last manager's plans since are not in it (simulation seed ``all``
        101788, session 35: m2 led on an etcd back from an outage with a view of the nodes
        from before it was cut off, took n3's old record, serving p3 as leader, for a key n3
        held, designated n3, and n3 led without entries n5 had since committed with n4)."""
        for prefix, handler in self._handlers():
            self._held[prefix] = state = await self.coordinator.read_prefix(prefix)
            handler(state)
        self._changed.set()

    async def _read_written(self) -> None:
        """Read afresh the prefixes this manager writes, after a commit found etcd holding
        other records than the view. The view holds this manager's own writes as soon as they
        commit, ahead of its watches; an etcd restored from a snapshot taken before one of
        them can hold exactly the state the watch last brought, so the watch brings nothing
        new and the view kept the lost write forever: every plan expected it and failed, four
        times a second, and partitions waiting on a promotion took no send (simulation seed
        ``restore`` 1758509 at the 1 s lease, session 86)."""
        for prefix, handler in (
            (self.layout.partitions, self._on_partitions),
            (self.layout.tombstones, self._on_tombstones),
        ):
            self._held[prefix] = state = await self.coordinator.read_prefix(prefix)
            handler(state)

    def _records_expected(self, change: Plan) -> dict[str, bytes | None]:
        """What a commit of ``change`` expects etcd to hold under each partition record it
        writes, deletes or tombstones copies of: the bytes the view was made from (None: no
        record, a creation).

        A plan made on a view etcd no longer holds must change nothing. After a restore from
        an older snapshot the partitions' watch can still show a partition made since, whose
        queue the snapshot does not hold either: a plan that wrote that record back into the
        restored etcd (a promotion, a repair) was followed, once the queues' watch caught up,
        by the deletion of the partition and tombstones for its copies, and the nodes deleted
        a queue's acknowledged messages (session 62's CI run,
        ``test_a_restore_from_an_older_snapshot_keeps_what_was_made_since``)."""
        pids = {*change.puts, *change.deletes, *(pid for pid, _ in change.tombstones)}
        return {self.layout.partition(pid): self._partition_values.get(pid) for pid in pids}

    async def _fence_holds(self, epoch: Epoch, holder: bytes) -> bool:
        entry = await self.coordinator.get(self.layout.manager)
        return entry is not None and entry.create_revision == epoch and entry.value == holder

    async def _cluster_confirmed(self) -> dict[str, bytes | None] | None:
        """Whether etcd itself, read now, holds a cluster this manager may plan for. Asked
        before a plan that deletes partitions or writes tombstones: the prefixes are watched
        apart, and after etcd is wiped the queues' watch can show the empty etcd before the
        cluster's does; a plan on that picture deletes every partition, and its queue's key,
        read directly, is gone indeed (a CI run of session 32: a replica deleted 50 ms after
        this manager led the emptied etcd, 28 ms before it logged "planning nothing").
        Returns the record read, for the commit to expect, or None."""
        entry = await self.coordinator.get(self.layout.cluster)
        record = ClusterRecord.parse(entry.value if entry else None)
        verdict = judge_stateless(record, None, self.layout)
        if verdict.refusal is not None or entry is None:
            log.warning("%s: deleting nothing: %s", self.manager_id, verdict.refusal or "no cluster record")
            return None
        return {self.layout.cluster: entry.value}

    async def _creations_confirmed(self, created: list[PartitionRecord]) -> bool:
        """Whether etcd itself, read now, holds no partition for the queue slots a plan
        would place anew: never create on the absence a watch shows either.

        After a restore the queues' watch can show the restored queue while the partitions'
        watch still shows the emptied etcd; a plan on that picture places a second partition
        for a slot whose replicas hold the queue's messages (simulation seed `etcd` 7539,
        session 32: the queue was served, empty, from the new partition)."""
        state = await self.coordinator.read_prefix(self.layout.partitions)
        read = read_partition_map(state.values(), self._ever_read)
        for record in created:
            slot = (record.tenant, record.queue, record.index)
            if read.unknown or any(_same_slot(record, held) for held in read.records.values()):
                log.warning(
                    "%s: not placing %s/%s partition index %d: etcd holds a partition for it"
                    " or one it cannot read (a watch is behind)",
                    self.manager_id,
                    *slot,
                )
                return False
        return True

    async def _deletions_confirmed(self, deletes: list[int]) -> dict[str, bytes | None] | None:
        """Whether etcd itself, read now, says each partition's queue is gone (or is another
        incarnation, or has fewer partitions): never delete on the absence a watch shows.

        The prefixes are watched apart, so after etcd is restored one watch can show the
        restored partitions while another still shows the queues of the etcd before (empty):
        a plan on that picture deletes every partition, tombstones included (simulation seed
        `etcd` 6242, session 31: a replica holding acknowledged entries deleted 17 ms after a
        restore).

        Returns the queue records read (None for an absent one), for the commit to expect, or
        None when a deletion is not confirmed."""
        read: dict[str, bytes | None] = {}
        for pid in deletes:
            record = self.view.partitions.get(pid)
            if record is None:
                continue
            queue_key = self.layout.queue(record.tenant, record.queue)
            entry = await self.coordinator.get(queue_key)
            read[queue_key] = None if entry is None else entry.value
            if entry is None or _not_its_queue(record, entry):
                continue
            log.warning(
                "%s: not deleting partition %d: its queue %s/%s is in etcd (a watch is behind)",
                self.manager_id,
                pid,
                record.tenant,
                record.queue,
            )
            return None
        return read


def _changed(before: PrefixState, after: PrefixState) -> set[str]:
    """Keys added, removed or holding another entry (value or revisions: after a restore, a
    key may hold another value at a mod revision it held before). The watch's own word when
    ``after`` is ``before`` with etcd's events applied (at 10,000 queues, comparing every
    record at every create was half of a manager's CPU: bench/README.md, many_queues)."""
    if after.changed is not None and after.since == before.revision and before.revision:
        return set(after.changed)
    keys = set(before.entries) ^ set(after.entries)
    keys.update(k for k in set(before.entries) & set(after.entries) if before.entries[k] != after.entries[k])
    return keys


def _not_its_queue(record: PartitionRecord, entry: Entry) -> bool:
    """Whether the queue record etcd holds under a partition's queue name no longer wants
    the partition: another incarnation, a pool's queue, or fewer partitions."""
    if record.queue_revision is not None and entry.create_revision != record.queue_revision:
        return True  # deleted and created again: this partition is the old queue's
    try:
        attributes = unpack(entry.value)
    except PushgateError:
        return False
    if isinstance(attributes, dict) and placement(attributes):
        return True  # a pool's queue now: this partition is an earlier queue's
    partitions = attributes.get("partitions", 1) if isinstance(attributes, dict) else 1
    return isinstance(partitions, int) and record.index >= partitions  # past a lowered count


def _same_slot(a: PartitionRecord, b: PartitionRecord) -> bool:
    """Whether two partition records place the same index of the same queue (a revision not
    recorded matches any)."""
    revisions = {a.queue_revision, b.queue_revision}
    return (a.tenant, a.queue, a.index) == (b.tenant, b.queue, b.index) and (
        None in revisions or len(revisions) == 1
    )


async def set_drain(
    etcd: str, node_id: str, *, drain: bool, prefix: str | None = None, etcd_tls: EtcdTls | None = None
) -> None:
    """Ask the managers to move every replica off ``node_id`` (or stop asking)."""
    from ..coordination.etcd_coordinator import EtcdCoordinator

    layout = Layout(prefix) if prefix else Layout()
    async with EtcdCoordinator(etcd, tls=etcd_tls) as coordinator:
        if drain:
            await coordinator.put(layout.drain + node_id, b"")
        else:
            key = layout.drain + node_id
            entry = await coordinator.get(key)
            if entry is not None:  # a delete fenced on the key itself (the interface has no plain delete)
                await coordinator.fenced_commit(
                    key, Epoch(entry.create_revision), {}, [key], holder=entry.value
                )


async def run_manager(
    etcd: str,
    *,
    manager_id: str | None = None,
    ttl_s: float = 2.0,
    prefix: str | None = None,
    rebalance: bool = True,
    replace_after_s: float = 300.0,
    pool_partitions: int | None = None,
    etcd_tls: EtcdTls | None = None,
) -> None:
    """``pushgate manager``: run until cancelled. ``pool_partitions``: the slots each pool
    of shared partitions has at least (``--partitions``; None: one per registered node)."""
    from ..coordination.etcd_coordinator import EtcdCoordinator

    coordinator = await EtcdCoordinator(etcd, tls=etcd_tls).connect()
    manager = Manager(
        coordinator,
        manager_id=manager_id,
        ttl_s=ttl_s,
        layout=Layout(prefix) if prefix else None,
        settings=PlanSettings(
            rebalance=rebalance, replace_after_s=replace_after_s, pool_partitions=pool_partitions
        ),
    )
    await manager.start()
    print(f"pushgate manager {manager.manager_id} started", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await manager.stop()
        await coordinator.close()


def cleared_marks(written: Collection[int], states_at_plan: int, states_now: int) -> set[int]:
    """The garbled-record marks (stale or unknown) a commit that wrote ``written`` clears:
    those records, unless the watch delivered a state of ``partitions/`` while the commit
    was under way. Then the watch's marks stand, for a record garbled after the write shows
    the mark the plan saw, or none: simulation seed ``all`` 303592 (session 37: the record
    was garbled just after m2's promotion committed, the watch showed it before the commit
    returned, and m2 cleared the mark on its own write), and ``all`` 421472 (session 40:
    garbled, written again by m2's promotion, garbled again 1 ms later). Cleared, the record
    was never written again, and its partition stayed unserved. A state that shows the
    write itself clears its mark there; one older than it leaves the mark, and the record
    is written once more."""
    return set(written) if states_now == states_at_plan else set()
