"""The simulated gateway's queues in pools of shared partitions, made and deleted as the real
gateway does (docs/cluster.md, "Shared partitions"), and the churn of a many-queue run.

Creating a queue: ask for its pool (``pools/{name}``, created if absent) when the map shows
none of its slots, wait for the manager's slots in the map, place the queue (``pools.place``,
wrapping around a pool smaller than the queue's partitions) and write its record with its
``placement`` (create-if-absent), and nothing more: each leader makes the queue in its
pass, or for the first request naming it. Deleting one: mark its record ``deleting``, ask its
partitions' leaders to delete it (best effort: they also do it on the mark), delete the
record. A queue's requests go to the partitions of its placement.

:class:`Churn` creates short-lived queues during the chaos, sends a few messages to each (each
acknowledgement is checked by the oracle like any other) and deletes them, and deletes some
of the idle queues made at the start: the pool partitions' leaders apply creates and deletes
under faults while the producers' queues, on the same partitions, must lose nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from typing import TYPE_CHECKING, Any

from backend_store.cluster.client.partition_map import PartitionInfo, PartitionMap, bind_to_queue
from backend_store.cluster.coordination import pools
from backend_store.cluster.coordination.coordinator import CoordinatorUnavailable
from backend_store.cluster.coordination.layout import Layout, pack, unpack
from backend_store.errors import PushgateError
from backend_store.types import NewMessage, QueueName, SendResult, TenantId

from .oracle import Oracle
from .sim_coordinator import SimCoordinator

if TYPE_CHECKING:
    from .sim_gateway import QueueSpec, SimGateway

TENANT = TenantId("t")
POOL = pools.pool_name(3, "sync")
_RETRY_S = 0.5


def pool_slots(current: PartitionMap, name: str) -> list[PartitionInfo]:
    """The pool's slots the map shows, 0.. without a gap (a later slot placed before an
    earlier one waits for it: every gateway must see the same slots)."""
    slots = current.of_queue(TenantId(pools.POOL_TENANT), QueueName(name))
    out: list[PartitionInfo] = []
    for part in slots:
        if part.index != len(out):
            break
        out.append(part)
    return out


class SimPools:
    """Placement, create and delete of pooled queues for one simulated gateway."""

    def __init__(self, coordinator: SimCoordinator, layout: Layout, gateway: SimGateway) -> None:
        self.coordinator = coordinator
        self.layout = layout
        self.gateway = gateway
        self.placements: dict[str, tuple[int, ...]] = {}
        self.written: list[str] = []  # the queues whose records ``create`` wrote, in order

    def route(self, queue: str, index: int) -> PartitionInfo | None:
        """The partition a pooled queue's index lives on, bound to the queue as the real
        gateway binds it (``bind_to_queue``: calls carry the queue's tenant and name, and
        a leader's "not applied" has etcd asked about that queue); None: not a pooled
        queue here. The pool partition as the map has it, tenant ``""``, made that check
        ask for a key etcd refuses, and the read failed (``pools`` 1100174, session 59)."""
        placement = self.placements.get(queue)
        if placement is None:
            return None
        pid = placement[index]
        found = self.gateway.view.map.partitions.get(pid)
        return bind_to_queue(found, pid, TENANT, QueueName(queue), index, None)

    async def _ask(self) -> None:
        key = self.layout.pool(POOL)
        if await self.coordinator.get(key) is None:
            await self.coordinator.create(key, pools.PoolRequest(3, "sync").pack())

    async def create(self, spec: QueueSpec, timeout_s: float) -> bool:
        """Create ``spec`` in the pool (whether it was done within ``timeout_s``)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        key = self.layout.queue(TENANT, spec.name)
        while loop.time() < deadline:
            try:
                slots = pool_slots(self.gateway.view.map, POOL)
                if not slots:
                    await self._ask()
                    await self.gateway.view.wait_for(
                        lambda m: bool(pool_slots(m, POOL)), max(0.0, deadline - loop.time())
                    )
                    continue
                placement = pools.place(TENANT, spec.name, spec.partitions, [p.id for p in slots])
                doc = {**spec.attributes(), pools.PLACEMENT: list(placement)}
                if not await self.coordinator.create(key, pack(doc)):
                    entry = await self.coordinator.get(key)  # an earlier try of ours got there
                    held = pools.placement(unpack(entry.value)) if entry is not None else None
                    if held is None or pools.deleting(unpack(entry.value) if entry else {}):
                        await asyncio.sleep(_RETRY_S)
                        continue
                    placement = held
                else:
                    self.written.append(spec.name)
                # A record write, as the real gateway's create since session 73: each leader
                # makes the queue in its pass, or for the first request naming it.
                self.placements[spec.name] = placement
                return True
            except (CoordinatorUnavailable, PushgateError):
                await asyncio.sleep(_RETRY_S)
        return False

    async def delete(self, name: str, timeout_s: float) -> bool:
        """Delete a pooled queue: mark, ask its leaders, remove the record."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        key = self.layout.queue(TENANT, name)
        while loop.time() < deadline:
            try:
                entry = await self.coordinator.get(key)
                if entry is None:
                    self.placements.pop(name, None)
                    return True
                doc: dict[str, Any] = unpack(entry.value)
                revision = entry.mod_revision
                if not pools.deleting(doc):
                    marked = {**doc, pools.DELETING: True}
                    if not await self.coordinator.compare_and_put(key, pack(marked), revision):
                        continue
                    entry = await self.coordinator.get(key)
                    if entry is None:
                        continue
                    revision = entry.mod_revision
                for index in range(len(pools.placement(doc) or ())):
                    with contextlib.suppress(PushgateError):  # the leader deletes it on the mark
                        await self.gateway.call(name, index, "delete_queue", retry_unknown=True, name=name)
                if await self.coordinator.delete(key, revision):
                    self.placements.pop(name, None)
                    return True
            except (CoordinatorUnavailable, PushgateError):
                await asyncio.sleep(_RETRY_S)
        return False


class Churn:
    """Queues created, sent to and deleted during the chaos (the module's docstring)."""

    def __init__(self, gateway: SimGateway, oracle: Oracle, rng: random.Random, idle: list[str]) -> None:
        self.gateway = gateway
        self.oracle = oracle
        self.rng = rng
        self.idle = list(idle)
        self.created = 0
        self.deleted = 0
        self.acked = 0

    async def run(self) -> None:
        from .sim_gateway import QueueSpec

        pools_ = self.gateway.pools
        live: list[str] = []
        n = 0
        while True:
            await asyncio.sleep(0.2 + self.rng.random() * 0.6)
            roll = self.rng.random()
            if roll < 0.5 or not live:
                n += 1
                spec = QueueSpec(f"c{n}", self.rng.choice([1, 1, 2]), [])
                if await pools_.create(spec, 10.0):
                    self.created += 1
                    live.append(spec.name)
                    await self._send_some(spec)
            elif roll < 0.85:
                name = live.pop(0)
                if await pools_.delete(name, 10.0):
                    self.deleted += 1
            elif self.idle:
                name = self.idle.pop(self.rng.randrange(len(self.idle)))
                if await pools_.delete(name, 10.0):
                    self.deleted += 1

    async def _send_some(self, spec: QueueSpec) -> None:
        group = f"churn-{spec.name}"
        for seq in range(1, self.rng.randint(1, 3) + 1):
            body = f"{group}/{seq}".encode()
            message = NewMessage(body, group_id=group, dedupe_id=f"{group}-{seq}")
            try:
                pid, results = await self.gateway.call(
                    spec.name, 0, "send", retry_unknown=True, messages=[message]
                )
            except PushgateError:
                return
            if isinstance(results[0], SendResult):
                self.oracle.acknowledged(pid, str(results[0].id), group, seq, body)
                self.acked += 1
