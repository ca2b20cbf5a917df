"""Partition replicas in a simulated node: production's ``node/partition_host.py`` as is, on
simulated ports.

:class:`SimReplicaStores` opens each replica as a :class:`PartitionHost` whose store is the
model's (:class:`~.sim_store.SimReplicaStore` on the node's disk, its clock the stores'),
whose leader dials the other replicas over the simulated network, on the node's (skewed)
clock, with the run's shipping window; it never sweeps (nothing expires in the model). So
the replica's term (``node/term.py``), its leading, links, queue attributes (a pool
partition's through ``node/pool_queues.py``), serving and stepping down are production's,
with its replication (``ReplicationLeader``, ``ReplicationFollower``, check-quorum).

:class:`ObservedPartitionHost` only tells the invariants (:mod:`.oracle`) when a replica
starts leading a term, answers a send and resigns for lack of a quorum: nothing in it
decides. (Used by :mod:`.sim_node`.)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from backend_store.cluster.coordination.layout import PartitionRecord
from backend_store.cluster.node.hosted_store import OpenedReplica, OpenStore
from backend_store.cluster.node.partition_host import PartitionHost, Wake
from backend_store.cluster.replication.log_shipping import Streams
from backend_store.cluster.replication.quorum import Resignation
from backend_store.types import Epoch

from .kernel import Process
from .network import Network
from .oracle import Oracle
from .sim_store import NodeDisk, SimReplicaStore


class ObservedPartitionHost(PartitionHost):
    """``PartitionHost``, reported to the invariants."""

    def __init__(self, proc: Process, oracle: Oracle, partition: int, node_id: str, **ports: Any) -> None:
        super().__init__(partition, node_id, **ports)
        self.proc = proc
        self.oracle = oracle

    async def lead(
        self,
        epoch: Epoch,
        record: PartitionRecord,
        addresses: Mapping[str, str],
        queues: Mapping[tuple[str, str], Mapping[str, Any]],
        *,
        quorum_window_s: float = 0.0,
    ) -> None:
        await super().lead(epoch, record, addresses, queues, quorum_window_s=quorum_window_s)
        # Nothing was awaited since the term's start fenced the store: this is the log the
        # term started from.
        store = self.store
        assert isinstance(store, SimReplicaStore)
        self.oracle.leader_started(self.node_id, self.proc.incarnation, self.partition, epoch, store.data)

    async def handle(self, op: str, epoch: Epoch, args: Mapping[str, Any], *, timeout_s: float) -> Any:
        leader = self.leader
        result = await super().handle(op, epoch, args, timeout_s=timeout_s)
        if op == "send" and leader is not None:
            # Which entries hold what this term answered (its node replies at once).
            store = self.store
            assert isinstance(store, SimReplicaStore)
            self.oracle.replied(self.node_id, self.partition, result, store.data, leader.epoch)
        return result

    async def resign_for_quorum(self, now: float, designation: int) -> Resignation:
        resignation = await super().resign_for_quorum(now, designation)
        self.oracle.resigned(self.node_id, self.partition)
        return resignation


class SimReplicaStores:
    """``node/ports.py``'s ``ReplicaStores`` on a node's model disk."""

    def __init__(
        self,
        proc: Process,
        node_id: str,
        disk: NodeDisk,
        network: Network,
        oracle: Oracle,
        *,
        store_clock: Callable[[], float],
        window_entries: int,
    ) -> None:
        self.proc = proc
        self.node_id = node_id
        self.disk = disk
        self.network = network
        self.oracle = oracle
        self.store_clock = store_clock
        self.window_entries = window_entries

    async def open(self, partition: int, wake: Wake, floor: Callable[[], Epoch]) -> PartitionHost:
        host = ObservedPartitionHost(
            self.proc,
            self.oracle,
            partition,
            self.node_id,
            open_store=self._opener(partition),
            wake=wake,
            dial=self.dial,
            clock=self.proc.clock,
            sweep_every_s=0,
            floor=floor,
            window_entries=self.window_entries,
        )
        await host.open()
        return host

    def _opener(self, partition: int) -> OpenStore:
        async def open_store() -> OpenedReplica:
            return OpenedReplica(SimReplicaStore(self.proc, self.disk, partition, self.store_clock))

        return open_store

    async def dial(self, address: str) -> Streams:
        """A leader's link to the node at ``address`` (its host name, port ignored)."""
        return await self.network.open_connection(self.proc, address.rpartition(":")[0], "node")

    async def on_disk(self) -> set[int]:
        return set(self.disk.partitions)

    def holds(self, partition: int) -> bool:
        return partition in self.disk.partitions

    async def delete(self, partition: int, why: str) -> None:
        self.disk.delete(partition, why)
