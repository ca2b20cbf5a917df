"""A copy of ``node/partition_host.py`` on the simulated store, for :mod:`.copied_node`
only (the production ``PartitionHost`` runs in :mod:`.sim_node`); kept until the pinned
seeds are found again on the production node.

Replication is the production code: a :class:`ReplicationLeader` (its links dialled by
:meth:`CopiedPartitionHost._maintain`, a copy of ``ReplicationLeader.maintain`` on the simulated
network) and a :class:`ReplicationFollower`, check-quorum's :class:`QuorumCheck` and
:func:`vouched_position`, the commit waiters. What is modelled is what ``PartitionHost`` does
around them (the same steps, in the same order) on :class:`~.sim_store.SimReplicaStore`
instead of LMDB, with the node's (skewed) clock. The decision to hand over is leadership.py's
(called from :mod:`.copied_node`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Awaitable, Mapping
from typing import TYPE_CHECKING, Any

from backend_store.cluster.coordination.layout import PartitionRecord, ReplicaPosition
from backend_store.cluster.coordination.timeline import incarnation_floor
from backend_store.cluster.node.partition_host import IN_SYNC_S, as_records
from backend_store.cluster.node.pool_queues import PoolQueues, QueueKey, ready_or_applied
from backend_store.cluster.node.term import LeaderTerm
from backend_store.cluster.protocol import ops
from backend_store.cluster.replication.log_shipping import (
    ReplicationFollower,
    ReplicationLeader,
    ReplicationMode,
)
from backend_store.cluster.replication.quorum import QuorumCheck, Resignation
from backend_store.errors import PushgateError, StaleEpoch, Unavailable
from backend_store.types import Epoch, QueueName, TenantId

from .sim_store import SimReplicaStore

if TYPE_CHECKING:
    from .copied_node import CopiedNode


class CopiedPartitionHost(LeaderTerm):
    """``PartitionHost`` on the simulated store and network; its term is production's
    (``node/term.py``)."""

    def __init__(self, node: CopiedNode, partition: int) -> None:
        self.node = node
        self.partition = partition
        self.record: PartitionRecord | None = None
        self.follower: ReplicationFollower | None = None
        self._init_term()
        self._links: dict[str, tuple[str, asyncio.Task[None]]] = {}
        self._applied: set[tuple[str, str]] = set()
        self.pool_queues = PoolQueues()  # a pool partition's queues (node/pool_queues.py)

    @property
    def store(self) -> SimReplicaStore:
        assert self.follower is not None, "partition not open"
        store = self.follower.store
        assert isinstance(store, SimReplicaStore)
        return store

    async def open(self) -> None:
        node = self.node
        store = SimReplicaStore(node.proc, node.disk, self.partition, node.store_clock)
        self.follower = ReplicationFollower(
            store,
            partition=self.partition,
            node_id=node.node_id,
            floor=lambda: incarnation_floor(node.identity.incarnation),  # ``ReplicaRounds._open_host``
        )

    # Positions ---------------------------------------------------------------------------

    async def position(self, leader_epoch: int) -> ReplicaPosition:
        store = self.store
        self.last_epoch, last = self.last_entry()
        resigned = self.resigned
        if resigned is not None:
            return ReplicaPosition("resigned", store.epoch, resigned.lsn, resigned.last_epoch, leader_epoch)
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

    # Leading ---------------------------------------------------------------------------------

    async def lead(
        self,
        epoch: Epoch,
        record: PartitionRecord,
        addresses: Mapping[str, str],
        queues: Mapping[tuple[str, str], Mapping[str, Any]],
        *,
        quorum_window_s: float,
    ) -> None:
        node = self.node
        store = self.store
        leader = ReplicationLeader(
            store,
            partition=self.partition,
            epoch=epoch,
            replicas=len(record.replicas),
            node_id=node.node_id,
            mode=ReplicationMode(record.mode),
            quorum=QuorumCheck(
                node.node_id, record.replicas, window_s=quorum_window_s, now=node.proc.clock()
            ),
            clock=node.proc.clock,
            voters=record.replicas,
            window_entries=node.window_entries,
        )
        await leader.start()  # raises StaleEpoch if this replica saw a newer term
        node.oracle.leader_started(node.node_id, node.proc.incarnation, self.partition, epoch, store.data)
        self._term_start = self.last_entry()
        self.resigned = None
        self.leader = leader
        self.record = record
        self.update_links(record, addresses)
        self._applied.clear()
        if record.pool is not None:
            self.pool_queues.begin_term(as_records(queues), self.partition)
        self.open_term(queues)

    def update_links(self, record: PartitionRecord, addresses: Mapping[str, str]) -> None:
        leader = self.leader
        if leader is None:
            return
        self.record = record
        leader.set_voters(record.replicas)
        leader.mode = ReplicationMode(record.mode)
        if leader.quorum is not None and leader.quorum.replicas != record.replicas:
            leader.quorum.set_replicas(record.replicas, leader.clock())
        me = self.node.node_id
        wanted = {n: addresses[n] for n in record.members if n != me and n in addresses}
        for node_id, (address, task) in list(self._links.items()):
            if wanted.get(node_id) != address or task.done():
                task.cancel()
                del self._links[node_id]
                if node_id not in wanted:
                    leader.followers.pop(node_id, None)
        for node_id, address in wanted.items():
            if node_id not in self._links:
                task = self.node.proc.spawn(
                    self._maintain(leader, node_id, address), f"link p{self.partition}->{node_id}"
                )
                self._links[node_id] = (address, task)

    async def _maintain(self, leader: ReplicationLeader, follower_id: str, address: str) -> None:
        """``ReplicationLeader.maintain`` (retry_s 0.1, as ``update_links`` asks) on the
        simulated network."""
        proc, network = self.node.proc, self.node.network
        host = address.rpartition(":")[0]
        while not leader.deposed.is_set():
            try:
                async with asyncio.timeout(2.0):
                    reader, writer = await network.open_connection(proc, host, "node")
            except (OSError, TimeoutError):
                await asyncio.sleep(0.1)
                continue
            await leader.follow(follower_id, reader, writer)
            await asyncio.sleep(0.1)

    async def apply_queue_attributes(self, queues: Mapping[tuple[str, str], Mapping[str, Any]]) -> None:
        """The queue's copy in this store (the model has no attributes beyond existing); a
        pool partition's queues as ``PartitionHost`` applies them (node/pool_queues.py)."""
        if not self.leading or self.record is None:
            return
        if self.record.pool is not None:
            # One read for the pass, as production's ``queue_attributes``: what the store held
            # when the pass began, not when each queue's turn comes.
            held = {key: self.store.queue_exists(*key) for key in self.pool_queues.pending}
            await self.pool_queues.apply(
                as_records(queues),
                self.partition,
                functools.partial(self._ensure_pooled, held),
                self._drop_pooled,
            )
            return
        key = (self.record.tenant, self.record.queue)
        if key not in queues or key in self._applied:
            return
        try:
            await self.store.ensure_queue(*key)
        except PushgateError as exc:
            self.node.note(f"p{self.partition}: cannot apply {key[1]} attributes: {exc.detail}")
            return
        if self.leader is not None:
            with contextlib.suppress(PushgateError):  # a failed majority only delays followers
                await self.leader.replicate(self.store.last_lsn)
        self._applied.add(key)

    async def _ensure_pooled(
        self, held: Mapping[QueueKey, bool], key: QueueKey, _attrs: dict[str, Any]
    ) -> bool:
        """``PartitionHost._ensure_pooled``: written only if the store lacked the queue when
        the pass began (``held``), or, for a queue pending since, lacks it now."""
        if held[key] if key in held else self.store.queue_exists(*key):
            return True
        return await self._write_queue_change(key, self.store.ensure_queue(*key), "create")

    async def _drop_pooled(self, key: QueueKey) -> bool:
        """``PartitionHost._drop_queue``: deleted (already gone is done)."""
        if not self.store.queue_exists(*key):
            return True
        return await self._write_queue_change(
            key, self.store.delete_queue(TenantId(key[0]), QueueName(key[1])), "delete"
        )

    async def _write_queue_change(self, key: QueueKey, write: Awaitable[None], what: str) -> bool:
        try:
            await write
        except PushgateError as exc:
            self.node.note(f"p{self.partition}: cannot {what} {key[1]}: {exc.detail}")
            return False
        if self.leader is not None:
            with contextlib.suppress(PushgateError):  # a failed majority only delays followers
                await self.leader.replicate(self.store.last_lsn)
        return True

    async def resign_for_quorum(self, now: float) -> Resignation:
        resignation = await super().resign_for_quorum(now)
        self.node.oracle.resigned(self.node.node_id, self.partition)
        return resignation

    async def step_down(self, why: str) -> None:
        leader, self.leader = self.leader, None
        self.handing_over_to = None
        links, self._links = list(self._links.values()), {}
        upkeep = self._cancel_upkeep()
        tasks = [task for _, task in links] + ([upkeep] if upkeep is not None else [])
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        if leader is not None:
            leader.stop(f"the leader stepped down ({why})")
            self.node.note(f"p{self.partition}: stepped down from epoch {leader.epoch} ({why})")

    # Serving ---------------------------------------------------------------------------------

    async def handle(self, op: str, epoch: Epoch, args: Mapping[str, Any], *, timeout_s: float) -> Any:
        leader = self.leader
        if leader is None or leader.deposed.is_set():
            raise ops.NotLeader(f"node {self.node.node_id} does not lead partition {self.partition}")
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
        why = await ready_or_applied(
            self.record,
            self._applied,
            self.pool_queues,
            self.partition,
            op,
            args,
            functools.partial(self._ensure_pooled, {}),
        )
        if self.leader is not leader or leader.deposed.is_set():
            raise ops.NotLeader(f"partition {self.partition}: stepped down")
        if why is not None:
            raise ops.NotLeader(f"partition {self.partition} is not ready yet: {why}")
        store = self.store
        if not ops.OPS[op].writes:
            return await ops.call(store, op, args)
        self._writes_in_flight += 1
        try:
            try:
                result = await ops.call(store, op, args)
            except StaleEpoch:
                raise ops.NotLeader(f"partition {self.partition}: deposed") from None
            if self.leader is not leader:
                raise Unavailable(f"partition {self.partition}: the leader stepped down before replicating")
            try:
                await leader.replicate(store.last_lsn, timeout_s)
            except StaleEpoch:
                raise Unavailable(
                    f"partition {self.partition}: the leader was deposed before a majority held this write"
                ) from None
        finally:
            self._writes_in_flight -= 1
        self.pool_queues.served(op, args)
        return result

    # Life cycle ----------------------------------------------------------------------------------

    async def close(self) -> None:
        await self.step_down("closing")
        if self.follower is not None:
            await self.store.close()

    async def destroy(self, why: str) -> None:
        await self.close()
        self.node.disk.delete(self.partition, why)
