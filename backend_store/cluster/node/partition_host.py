"""One partition replica on a node: its LMDB environment, and its role (leader or follower).

As a follower it takes the leader's replication link (routed here by the node) through a
:class:`~.replication.ReplicationFollower`. As the leader (after the node won the
partition's campaign at epoch E) it runs a :class:`~.replication.ReplicationLeader` at E:
it raises the store's fence to E, commits a no-op entry in the new term (so followers
holding a deposed leader's tail are corrected at once, and committing it commits everything
before it), keeps a link to every other replica (``maintain``), makes sure the queue (and its
dead-letter queue) exists with the attributes from etcd, and serves Backend operations,
replicating every write before answering. It ships the log to the record's learners too,
but counts only the voters' acknowledgements (``replicas``), and publishes the voting set it
counts by once settled, its commit point and the replicas in sync with it (membership
changes, docs/cluster.md). While leading it keeps a :class:`~.quorum.QuorumCheck`; a leader
that resigns for lack of a quorum, or hands over to a successor, keeps a
:class:`~.quorum.Resignation` and publishes the position it vouches for until a newer leader
exists. When and why it does each is :mod:`.leadership`'s decision.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, cast

from ...attributes import apply_patch, parse_attributes
from ...errors import PushgateError, QueueExists, QueueNotFound, StaleEpoch, Unavailable
from ...types import Epoch, Lsn, QueueAttributes, QueueName, TenantId
from ..coordination.layout import PartitionRecord, ReplicaPosition
from ..coordination.queue_record import former_dead_letter_queues, store_attributes
from ..protocol import ops
from ..replication.log_shipping import (
    WINDOW_ENTRIES,
    Connect,
    ReplicationFollower,
    ReplicationLeader,
    ReplicationMode,
)
from ..replication.quorum import QuorumCheck
from .hosted_store import Dial, HostedStore, OpenStore
from .pool_queues import PoolQueues, QueueKey, QueueRecords, not_ready, ready_or_applied
from .term import LeaderTerm

log = logging.getLogger("pushgate.cluster")
# A pass's comparisons of held attributes with a wanted document (by its identity): the
# document, kept so no other takes its identity during the pass, and whether they agree.
Compared = dict[tuple[QueueAttributes, int], tuple[dict[str, Any], bool]]

# Called with (partition, tenant, queue) after a commit that made messages visible (leader only).
Wake = Callable[[int, str, str], None]
# A follower that acknowledged the leader's whole log within this long is in sync with it
# (published; the manager moves leadership and replicas only to replicas in sync).
IN_SYNC_S = 2.0
# Reads answered only once everything they saw is on a majority (``_read_index``): the
# queue's messages (peek) and its counts (get_queue's stats, and a listing's queue_stats).
COMMITTED_READS = frozenset({"peek", "get_queue", "queue_stats"})


class PartitionHost(LeaderTerm):
    def __init__(
        self,
        partition: int,
        node_id: str,
        open_store: OpenStore,
        wake: Wake,
        *,
        dial: Dial,
        clock: Callable[[], float] = time.monotonic,
        sweep_every_s: float = 5.0,
        floor: Callable[[], Epoch] | None = None,
        window_entries: int = WINDOW_ENTRIES,
    ) -> None:
        """``open_store``: opens the replica's store (:meth:`open`); ``dial``: how its leader
        reaches the other replicas (``host:port``); ``clock``: check-quorum's and the
        leader's time (the node's); ``floor``: the oldest term the replica may follow
        (``ReplicationFollower``'s); ``window_entries``: the leader's shipping window."""
        self.partition = partition
        self.floor = floor
        self.sweep_every_s = sweep_every_s
        self._sweeper: asyncio.Task[None] | None = None
        self._sweep_due = asyncio.Event()
        self.node_id = node_id
        self._open_store = open_store
        self._dial = dial
        self.clock = clock
        self.window_entries = window_entries
        self._wake = wake
        self.record: PartitionRecord | None = None
        self.follower: ReplicationFollower | None = None
        # The term this replica leads (term.py): its leader, hand-over and resignation.
        self._init_term()
        self._links: dict[str, tuple[str, asyncio.Task[None]]] = {}  # follower id -> (address, task)
        self._listening: set[int] = set()  # id() of stores our wake-up listener is on
        self._applied_attributes: dict[tuple[str, str], dict[str, Any]] = {}
        # A pool partition's queues, applied and to apply (pool_queues.py).
        self.pool_queues = PoolQueues()

    @property
    def store(self) -> HostedStore:
        """The current store (a re-seed replaces the follower's)."""
        assert self.follower is not None, "partition not open"
        # What ``open_store`` gave, or what its ``install_snapshot`` made of it: the follower
        # holds it as the narrower ReplicaStore.
        return cast(HostedStore, self.follower.store)

    async def open(self) -> None:
        opened = await self._open_store()
        self.follower = ReplicationFollower(
            opened.store,
            partition=self.partition,
            node_id=self.node_id,
            staging=opened.staging,
            install_snapshot=opened.install_snapshot,
            floor=self.floor,
        )

    # Positions -------------------------------------------------------------------------

    async def position(self, leader_epoch: int) -> ReplicaPosition:
        store = self.store
        self.last_epoch, last = self.last_entry()
        resigned = self.resigned
        if resigned is not None:
            # Not our last entry: what we vouch for (see quorum.vouched_position).
            return ReplicaPosition(
                "resigned",
                store.epoch,
                resigned.lsn,
                resigned.last_epoch,
                leader_epoch,
                resigned_on=resigned.designation,
            )
        leader = self.leader
        if leader is None or not self.leading:
            return ReplicaPosition("follower", store.epoch, last, self.last_epoch, leader_epoch)
        return ReplicaPosition(
            "leader",
            store.epoch,
            last,
            self.last_epoch,
            leader_epoch,
            voters=leader.settled_voters(),
            committed=leader.committed_lsn,
            in_sync=leader.in_sync(IN_SYNC_S),
        )

    # Leading -------------------------------------------------------------------------------

    async def lead(
        self,
        epoch: Epoch,
        record: PartitionRecord,
        addresses: Mapping[str, str],
        queues: Mapping[tuple[str, str], Mapping[str, Any]],
        *,
        quorum_window_s: float = 0.0,
    ) -> None:
        """Start serving as the leader of term ``epoch`` (the node won the campaign).

        ``quorum_window_s``: check-quorum's window (0: never resign for lack of a quorum)."""
        store = self.store
        leader = ReplicationLeader(
            store,
            partition=self.partition,
            epoch=epoch,
            replicas=len(record.replicas),
            node_id=self.node_id,
            mode=ReplicationMode(record.mode),
            quorum=QuorumCheck(self.node_id, record.replicas, window_s=quorum_window_s, now=self.clock()),
            clock=self.clock,
            voters=record.replicas,
            window_entries=self.window_entries,
        )
        await leader.start()  # raises StaleEpoch if this replica saw a newer term
        self._term_start = self.last_entry()
        self.resigned = None
        self.leader = leader
        self.record = record
        if id(store) not in self._listening:
            self._listening.add(id(store))
            store.add_listener(lambda tenant, queue: self._on_change(store, tenant, queue))
        self.update_links(record, addresses)
        if self.sweep_every_s > 0:
            self._sweeper = asyncio.create_task(self._sweep(leader), name=f"sweep p{self.partition}")
        self._applied_attributes.clear()
        if record.pool is not None:
            self.pool_queues.begin_term(as_records(queues), self.partition)
        self.open_term(queues)

    def _on_change(self, store: HostedStore, tenant: str, queue: str) -> None:
        if self.leading and self.follower is not None and self.follower.store is store:
            self._wake(self.partition, tenant, queue)

    def update_links(self, record: PartitionRecord, addresses: Mapping[str, str]) -> None:
        """Keep a replication link to every other member of ``record`` (voters and learners)
        whose address is known; count majorities over its voters."""
        leader = self.leader
        if leader is None:
            return
        self.record = record
        leader.set_voters(record.replicas)
        leader.mode = ReplicationMode(record.mode)
        if leader.quorum is not None and leader.quorum.replicas != record.replicas:
            leader.quorum.set_replicas(record.replicas, leader.clock())
        wanted = {n: addresses[n] for n in record.members if n != self.node_id and n in addresses}
        for node_id, (address, task) in list(self._links.items()):
            if wanted.get(node_id) != address or task.done():
                task.cancel()
                del self._links[node_id]
                if node_id not in wanted:
                    leader.followers.pop(node_id, None)
        for node_id, address in wanted.items():
            if node_id not in self._links:
                task = asyncio.create_task(
                    leader.maintain(node_id, self._dialler(address), retry_s=0.1),
                    name=f"link p{self.partition}->{node_id}",
                )
                self._links[node_id] = (address, task)

    def _dialler(self, address: str) -> Connect:
        return lambda: self._dial(address)

    async def apply_queue_attributes(self, queues: Mapping[tuple[str, str], Mapping[str, Any]]) -> None:
        """Make the store's queue (and its dead-letter queue) match etcd's attributes (leader
        only); a pool partition's, those of its queues whose records changed (pool_queues.py)."""
        if not self.leading or self.record is None:
            return
        if self.record.pool is not None:
            first, began = not self.pool_queues.opened, self.clock()
            pending = len(self.pool_queues.pending)
            # Not those applied already (a queue a claimed create made, whose record then
            # came): they are compared with their record without the store (PoolQueues.apply).
            applied = self.pool_queues.applied
            unknown = [k for k in self.pool_queues.pending if k not in applied]
            held = await self.store.queue_attributes(unknown, _by_record(queues, unknown)) if unknown else {}
            same: Compared = {}
            await self.pool_queues.apply(
                as_records(queues),
                self.partition,
                functools.partial(self._ensure_pooled, held, same=same),
                self._drop_pooled,
                functools.partial(_holds_as_wanted, held, same),
            )
            if first and self.pool_queues.opened:
                log.info(
                    "partition %d: the term's %d queues applied in %.3f s",
                    self.partition,
                    pending,
                    self.clock() - began,
                )
            return
        tenant, name = self.record.tenant, self.record.queue
        attributes = queues.get((tenant, name))
        if attributes is None:
            return
        dlq = attributes.get("dead_letter_queue")
        wanted = [(name, attributes)]
        if isinstance(dlq, str) and (tenant, dlq) in queues:
            wanted.insert(0, (dlq, queues[(tenant, dlq)]))  # first: the queue's link needs it
        elif (
            isinstance(dlq, str)
            and (tenant, dlq) in self._applied_attributes
            and await self._drop_queue(TenantId(tenant), QueueName(dlq))
        ):
            # The dead-letter queue was deleted: so is our copy, so poison messages stay in
            # the queue (as on the embedded store) rather than move where nobody reads.
            del self._applied_attributes[(tenant, dlq)]
        for former, _ in former_dead_letter_queues(attributes):
            # One this queue fed before: our copy keeps what moved there, until that queue
            # is deleted (the deleting gateway drops it too; this catches a call it missed).
            if (
                (tenant, former) not in queues
                and (tenant, former) in self._applied_attributes
                and await self._drop_queue(TenantId(tenant), former)
            ):
                del self._applied_attributes[(tenant, former)]
        for queue, attrs in wanted:
            plain = store_attributes(attrs)
            if self._applied_attributes.get((tenant, queue)) == plain:
                continue
            if await self._ensure_queue(TenantId(tenant), QueueName(queue), plain):
                self._applied_attributes[(tenant, queue)] = plain

    async def _ensure_queue(self, tenant: TenantId, queue: QueueName, attrs: dict[str, Any]) -> bool:
        store = self.store
        try:
            try:
                await store.create_queue(tenant, queue, attrs)
            except QueueExists:
                await store.update_queue(tenant, queue, attrs)
        except PushgateError as exc:
            log.warning("partition %d: cannot apply %s/%s attributes: %s", self.partition, tenant, queue, exc)
            return False
        await self._replicate_local_change()
        return True

    async def _ensure_pooled(
        self,
        held: Mapping[QueueKey, QueueAttributes | None],
        key: QueueKey,
        attrs: dict[str, Any],
        *,
        same: Compared | None = None,
    ) -> bool:
        """A pool partition's queue, written only if the store lacks it or holds other
        attributes: a term begins by applying every queue of its partition, and a write
        (and its replication) per queue would delay every queue's failover. ``held``: the
        store's attributes of the queues pending when the pass began, read in one
        transaction (a read per queue delayed the last queues of a failover); a queue that
        became pending since is read now. A change to the store since that read comes with
        a changed record or a served ``delete_queue``, either of which makes the queue
        pending again, to be compared afresh at the next pass.

        ``same``: a pass's comparisons so far, by the store's attributes and the wanted
        document's identity. Queues mostly share their attributes, and ``attrs`` is the
        document shared by every queue whose attributes are equal (``shared_docs.py``): one
        comparison (a validation of every attribute, ~20 us) serves them all. One a queue,
        a new leader's 3,750 queues were served 1.1-1.3 s after their leader keys under load
        in one round at 10,000 queues; 0.3-0.6 s with it (issue 49, session 58)."""
        tenant, queue = TenantId(key[0]), QueueName(key[1])
        if key in held:
            current = held[key]
        else:
            try:
                current = (await self.store.get_queue(tenant, queue)).attributes
            except QueueNotFound:
                current = None
        if current is not None and _same(current, attrs, {} if same is None else same):
            return True
        return await self._ensure_queue(tenant, queue, attrs)

    async def _drop_pooled(self, key: QueueKey) -> bool:
        return await self._drop_queue(TenantId(key[0]), QueueName(key[1]))

    async def _drop_queue(self, tenant: TenantId, queue: QueueName) -> bool:
        store = self.store
        try:
            with contextlib.suppress(QueueNotFound):  # the gateway deleting it got there first
                await store.delete_queue(tenant, queue)
        except PushgateError as exc:
            log.warning("partition %d: cannot delete %s/%s: %s", self.partition, tenant, queue, exc)
            return False
        await self._replicate_local_change()
        return True

    async def _check_dead_letter_copy(self, store: HostedStore, args: Mapping[str, Any]) -> None:
        """A gateway's update that names a dead-letter queue this store has no copy of yet:
        the copy comes with etcd's record (``apply_queue_attributes``), which may not have
        reached us. Answered as not_leader (nothing applied), so the gateway retries."""
        changes = args.get("changes")
        dlq = changes.get("dead_letter_queue") if isinstance(changes, Mapping) else None
        if isinstance(dlq, str) and isinstance(args.get("tenant"), str):
            try:
                await store.get_queue(TenantId(args["tenant"]), QueueName(dlq))
            except QueueNotFound:
                raise ops.NotLeader(
                    f"partition {self.partition} is not ready yet: no copy of {dlq!r}"
                ) from None

    async def _replicate_local_change(self) -> None:
        """Ship what a change made here wrote (a failed majority only delays followers)."""
        if self.leader is not None:
            with contextlib.suppress(PushgateError):
                await self.leader.replicate(self.store.last_lsn)

    async def _sweep(self, leader: ReplicationLeader) -> None:
        """Retention and dedupe expiry, on the leader only; the deletions replicate."""
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.sweep_every_s):
                    await self._sweep_due.wait()
            self._sweep_due.clear()
            if self.leader is not leader or leader.deposed.is_set():
                return
            try:
                if await self.store.sweep():
                    await leader.replicate(self.store.last_lsn)
            except PushgateError as exc:
                log.warning("partition %d: sweep failed: %s", self.partition, exc.detail)

    def sweep_soon(self) -> None:
        """Sweep now rather than at the next interval (a test moved the node's clock)."""
        self._sweep_due.set()

    async def step_down(self, why: str) -> None:
        """Stop leading (deposed, no longer designated, or the node's session was lost)."""
        leader, self.leader = self.leader, None
        self.handing_over_to = None
        links, self._links = list(self._links.values()), {}
        sweeper, self._sweeper = self._sweeper, None
        upkeep = self._cancel_upkeep()
        tasks = [task for _, task in links] + [t for t in (sweeper, upkeep) if t is not None]
        for task in tasks:
            task.cancel()
        if tasks:
            # Not ``suppress(CancelledError)`` around each: that would swallow our own caller's
            # cancellation too.
            await asyncio.wait(tasks)
        if leader is not None:
            # Its links are cancelled: writes waiting for a majority fail now (a deleted
            # queue's partition made its delete wait out the gateway's node timeout).
            leader.stop(f"the leader stepped down ({why})")
            log.warning("partition %d: stepped down from epoch %d (%s)", self.partition, leader.epoch, why)

    # Serving -------------------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        """Leading and serving requests: the queue's attributes are applied (after the
        term's first entry; on a pool partition, those of its queues applied so far are
        served) and no hand-over is under way."""
        return self.leading and self.handing_over_to is None and self._not_ready("", {}) is None

    def _not_ready(self, op: str, args: Mapping[str, Any]) -> str | None:
        return not_ready(self.record, self._applied_attributes, self.pool_queues, op, args)

    async def handle(self, op: str, epoch: Epoch, args: Mapping[str, Any], *, timeout_s: float) -> Any:
        """Run a gateway's request as the leader; raise NotLeader / StaleLeader otherwise."""
        leader = self.leader
        if leader is None or leader.deposed.is_set():
            raise ops.NotLeader(f"node {self.node_id} does not lead partition {self.partition}")
        if self.handing_over_to is not None:
            raise ops.NotLeader(f"partition {self.partition} is moving to {self.handing_over_to}")
        if epoch and epoch < leader.epoch:
            raise ops.StaleLeader(
                f"partition {self.partition} is at epoch {leader.epoch}, not {epoch}", leader.epoch
            )
        if epoch > leader.epoch:
            raise ops.NotLeader(
                f"partition {self.partition}: epoch {epoch} is newer than ours ({leader.epoch})"
            )
        record = self.record
        claim = None
        if op == "create_queue" and record is not None and record.pool is not None:
            claim = self.pool_queues.claim_create(self.partition, args)
        refused: dict[int, str] = {}
        if op == "send_queues":
            args, refused = await self._ready_sends(leader, args)
        elif claim is None:
            await self._ready(leader, op, args)
        store = self.store
        if op == "update_queue":
            await self._check_dead_letter_copy(store, args)
        if not ops.OPS[op].writes:
            result = await ops.call(store, op, args)
            if op in COMMITTED_READS:
                await self._read_index(leader, store.last_lsn, timeout_s)
            return result
        self._writes_in_flight += 1
        try:
            try:
                try:
                    result = await ops.call(store, op, args)
                except QueueExists:
                    if claim is None:
                        raise
                    # The store holds the queue with other attributes (an earlier queue of
                    # the name the watch never showed deleted): applied from its record as
                    # for any request, then asked again.
                    claim = None
                    await self._ready(leader, op, args)
                    result = await ops.call(store, op, args)
            except StaleEpoch:  # refused before it was written
                raise ops.NotLeader(f"partition {self.partition}: deposed") from None
            if self.leader is not leader:
                # Stepped down while the write committed (its partition dropped, say): the
                # links are gone, no majority can come; say so now, not at the timeout.
                raise Unavailable(f"partition {self.partition}: the leader stepped down before replicating")
            try:
                await leader.replicate(store.last_lsn, timeout_s)
            except StaleEpoch:
                # Written here, maybe held by followers: not "not_leader", which promises
                # nothing was applied and lets the gateway retry any request.
                raise Unavailable(
                    f"partition {self.partition}: the leader was deposed before a majority held "
                    "this write; it may or may not have been applied"
                ) from None
        finally:
            self._writes_in_flight -= 1
        if claim is not None:
            self.pool_queues.created(claim)
        self.pool_queues.served(op, args)
        return ops.with_refused(result, refused) if refused else result

    async def _ready_sends(
        self, leader: ReplicationLeader, args: Mapping[str, Any]
    ) -> tuple[Mapping[str, Any], dict[int, str]]:
        """``send_queues``: the entries whose queues are applied here (applying those their
        records hold), and why each other one is not, by its place. Such an entry is
        answered ``not_leader`` alone, and its gateway sends it again as a lone send, whose
        retries end when the queue is applied or found deleted; the request's other queues
        are served meanwhile."""
        sends = args.get("sends")
        if self._not_ready("send_queues", args) is None or not isinstance(sends, list):
            await self._ready(leader, "send_queues", args)  # ready, or malformed: decoding refuses it
            return args, {}
        kept: list[Any] = []
        refused: dict[int, str] = {}
        for place, entry in enumerate(sends):
            queue = entry[0] if isinstance(entry, list) and entry else None
            try:
                await self._ready(leader, "send", {"tenant": args.get("tenant"), "queue": queue})
            except ops.NotLeader as exc:
                if self.leader is not leader or leader.deposed.is_set():
                    raise
                refused[place] = exc.detail
            else:
                kept.append(entry)
        return {**args, "sends": kept}, refused

    async def _ready(self, leader: ReplicationLeader, op: str, args: Mapping[str, Any]) -> None:
        """Return once the queues ``args`` names are applied in this term (applying those
        its records hold); ``not_leader`` if they cannot be, or this term ended meanwhile."""
        why = await ready_or_applied(
            self.record,
            self._applied_attributes,
            self.pool_queues,
            self.partition,
            op,
            args,
            functools.partial(self._ensure_pooled, {}),  # nothing read before: read now
        )
        if self.leader is not leader or leader.deposed.is_set():
            raise ops.NotLeader(f"partition {self.partition}: stepped down")
        if why is not None:
            # Leading, but the queue's attributes have not reached us from etcd yet. Answered
            # as not_leader: nothing was applied, so the gateway may retry any request.
            raise ops.NotLeader(f"partition {self.partition} is not ready yet: {why}")

    async def _read_index(self, leader: ReplicationLeader, lsn: Lsn, timeout_s: float) -> None:
        """Answer a read only once what it saw is on a majority (Raft's read index): a
        leader's store holds writes not yet replicated, which a failover could drop, and a
        peek or a count must not show them. (``async`` partitions do not wait: their writes
        are acknowledged on the leader's fsync alone.)"""
        try:
            await leader.replicate(lsn, timeout_s)
        except StaleEpoch:
            raise ops.NotLeader(f"partition {self.partition}: deposed") from None

    # Life cycle ------------------------------------------------------------------------------

    async def close(self) -> None:
        """Stop leading and close the store (its files are the node's ``ReplicaStores``')."""
        await self.step_down("closing")
        if self.follower is not None:
            await self.store.close()


def as_records(queues: Mapping[tuple[str, str], Mapping[str, Any]]) -> QueueRecords:
    """The node's :class:`QueueRecords` (kept by its watch), or one made of a plain mapping."""
    return queues if isinstance(queues, QueueRecords) else QueueRecords.of(queues)


def _by_record(
    queues: Mapping[QueueKey, Mapping[str, Any]], keys: list[QueueKey]
) -> dict[QueueKey, QueueAttributes]:
    """The attributes each of ``keys`` has by its etcd record (most queues share a document:
    each is parsed once), as ``queue_attributes``'s ``likely``: a queue whose store holds
    them is not decoded (a read of 10,000 queues in 28 ms of CPU against 50, session 77)."""
    parsed: dict[int, QueueAttributes | None] = {}
    out: dict[QueueKey, QueueAttributes] = {}
    for key in keys:
        doc = queues.get(key)
        if doc is None:
            continue
        if id(doc) not in parsed:
            try:
                parsed[id(doc)] = parse_attributes(store_attributes(doc))
            except PushgateError:
                parsed[id(doc)] = None
        attributes = parsed[id(doc)]
        if attributes is not None:
            out[key] = attributes
    return out


def _same(current: QueueAttributes, attrs: dict[str, Any], same: Compared) -> bool:
    """Whether the store's ``current`` attributes are what ``attrs`` asks (memoised in
    ``same`` by the pair, ``_ensure_pooled`` says why)."""
    memo = (current, id(attrs))
    if memo not in same:
        try:
            same[memo] = (attrs, apply_patch(current, attrs) == current)
        except PushgateError:
            same[memo] = (attrs, False)
    return same[memo][1]


def _holds_as_wanted(
    held: Mapping[QueueKey, QueueAttributes | None], same: Compared, key: QueueKey, attrs: dict[str, Any]
) -> bool:
    """``PoolQueues.apply``'s ``held``: the store held ``key`` with ``attrs`` when the pass
    read it (False for a queue that became pending since: ``_ensure_pooled`` reads it)."""
    current = held.get(key)
    return current is not None and _same(current, attrs, same)
