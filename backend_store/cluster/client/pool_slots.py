"""The pool partitions a new queue is placed on (docs/cluster.md, "Shared partitions").

A queue of replication class ``(factor, mode)`` lives in the pool ``rf{factor}-{mode}``.
Its slots come from the watched map: once a class's first queue made its pool, a create asks
etcd nothing here. For the first, the gateway asks for the pool, ``pools/{name}``
(:class:`~..coordination.pools.PoolRequest`, created if absent), and waits, up to ``wait_s``,
for the manager to make the slots and for each to have a leader.

A queue asking for more partitions than the pool has shares them (``pools.place`` wraps
around); the pool is not grown for it. Until session 66 it was: the pool's
``min_partitions`` was raised to the queue's ``partitions``, and the create waited for the
manager to make that many slots and for each to be led. A first queue of a class with 52
partitions made 52 replication groups (an environment, a writer thread and an election
each, on every replica): 6.5-8.5 s on an idle 3-node dev cluster, past 10 s under CI's
load (the cluster pass's schemathesis test timed out on it), and then every node paid for
those groups' idle work, where the pool's partitions are what spreads the load anyway.
"""

from __future__ import annotations

from ...errors import Unavailable
from ...types import QueueAttributes, QueueName, TenantId
from ..coordination import pools
from ..coordination.coordinator import Coordinator
from ..coordination.layout import Layout
from .partition_map import ClusterView, PartitionInfo


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
        """The partition ids of the queue's pool by slot; ``Unavailable`` if the manager did
        not make the pool within ``wait_s``."""
        name = pools.pool_name(attrs.replication_factor, attrs.replication_mode)
        slots = self.view.map.pool_slots(name)
        if not slots:
            await self._ask(pools.PoolRequest(attrs.replication_factor, attrs.replication_mode))
            # Until every slot is led, not only made: a create that made a pool returns with
            # the pool served, so the readiness check (every partition of the map has a
            # leader) holds after it as it did when a queue's partitions were its own. The
            # manager makes a new pool's slots in one plan (one transaction, up to 62), so
            # the first slots the map shows are all of them. A slot still leaderless after
            # wait_s delays nothing more: the queue waits only for its own placement's leaders.
            await self.view.wait_for(lambda m: _made_and_led(m.pool_slots(name)), self.wait_s)
            slots = self.view.map.pool_slots(name)
            if not slots:
                raise Unavailable(
                    f"the pool {name} has no partitions after {self.wait_s:g}s (is a manager running?); retry"
                )
        return tuple(p.id for p in slots)

    async def _ask(self, request: pools.PoolRequest) -> None:
        """Write ``pools/{name}`` unless another gateway already did."""
        key = self.paths.pool(request.name)
        if await self.coordinator.get(key) is None:
            await self.coordinator.create(key, request.pack())  # False: another got in first


def _made_and_led(slots: tuple[PartitionInfo, ...]) -> bool:
    return bool(slots) and all(p.leader for p in slots)
