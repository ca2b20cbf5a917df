"""The pool partitions a new queue is placed on (docs/cluster.md, "Shared partitions").

A queue of replication class ``(factor, mode)`` lives in the pool ``rf{factor}-{mode}``.
Its slots come from the watched map: while the map shows enough of them (the usual case, once
a class's first queue made its pool) a create asks etcd nothing here. Otherwise the gateway
asks for the pool, ``pools/{name}`` (:class:`~..coordination.pools.PoolRequest`: created if
absent, its ``min_partitions`` raised with compare-and-put when this queue asks for more
partitions than the pool has), and waits, up to ``wait_s``, for the manager to make the slots.
"""

from __future__ import annotations

from dataclasses import replace

from ...errors import Unavailable
from ...types import QueueAttributes, QueueName, TenantId
from ..coordination import pools
from ..coordination.coordinator import Coordinator
from ..coordination.layout import Layout
from .partition_map import ClusterView, PartitionInfo

# Compare-and-put rounds of ``pools/{name}`` against other gateways asking at once.
_ASK_ATTEMPTS = 20


class PoolSlots:
    def __init__(self, coordinator: Coordinator, paths: Layout, view: ClusterView, *, wait_s: float) -> None:
        self.coordinator = coordinator
        self.paths = paths
        self.view = view
        self.wait_s = wait_s

    async def place(self, tenant: TenantId, name: QueueName, attrs: QueueAttributes) -> tuple[int, ...]:
        """The partition ids of a new queue with ``attrs``, by index (``pools.place``)."""
        return pools.place(tenant, name, attrs.partitions, await self.slots(attrs))

    async def slots(self, attrs: QueueAttributes) -> tuple[int, ...]:
        """The partition ids of the queue's pool by slot, at least ``attrs.partitions`` of
        them; ``Unavailable`` if the manager did not make them within ``wait_s``."""
        name = pools.pool_name(attrs.replication_factor, attrs.replication_mode)
        wanted = attrs.partitions
        slots = self.view.map.pool_slots(name)
        if len(slots) < wanted:
            await self._ask(pools.PoolRequest(attrs.replication_factor, attrs.replication_mode, wanted))
            # Until every slot is led, not only made: a create that made (or grew) a pool
            # returns with the pool served, so the readiness check (every partition of the
            # map has a leader) holds after it as it did when a queue's partitions were its
            # own. A slot still leaderless after wait_s delays nothing more: the queue waits
            # only for its own placement's leaders.
            await self.view.wait_for(lambda m: _made_and_led(m.pool_slots(name), wanted), self.wait_s)
            slots = self.view.map.pool_slots(name)
            if len(slots) < wanted:
                raise Unavailable(
                    f"the pool {name} has {len(slots)} of the {wanted} partition(s) this queue needs "
                    f"after {self.wait_s:g}s (is a manager running?); retry"
                )
        return tuple(p.id for p in slots)

    async def _ask(self, request: pools.PoolRequest) -> None:
        """Write ``pools/{name}`` so that it asks for at least ``request.min_partitions``."""
        key = self.paths.pool(request.name)
        for _ in range(_ASK_ATTEMPTS):
            entry = await self.coordinator.get(key)
            if entry is None:
                if await self.coordinator.create(key, request.pack()):
                    return
                continue  # another gateway asked first: read its request
            current = pools.PoolRequest.unpack(entry.value)
            if current.min_partitions >= request.min_partitions:
                return
            raised = replace(current, min_partitions=request.min_partitions)
            if await self.coordinator.compare_and_put(key, raised.pack(), entry.mod_revision):
                return
        raise Unavailable(f"pools/{request.name} changed too often to ask for its partitions; retry")


def _made_and_led(slots: tuple[PartitionInfo, ...], wanted: int) -> bool:
    return len(slots) >= wanted and all(p.leader for p in slots)
