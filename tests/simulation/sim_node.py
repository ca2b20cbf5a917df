"""A simulated backend node: production's ``node/node.py`` (with ``replica_rounds.py``,
``node_serving.py``, ``node_identity.py`` and ``leadership.py``) as is, on simulated ports.

``Node`` is built from a ``NodeConfig`` (production's defaults) and its ports
(``node/ports.py``); here they are the simulation's:

- the coordinator: :class:`~.sim_coordinator.SimCoordinator` on etcd's model;
- :class:`SimListener`: the node's port on the simulated network (``host:7000``);
- :class:`~.sim_partition.SimReplicaStores`: production's ``PartitionHost`` on the model
  store and disk;
- :class:`SimNodeClock`: the process's own clock (clock-skew faults make it run fast or
  slow), whose sleeps and waits end only once a frozen process thaws;
- :class:`SimNodeFiles`: ``DATA/`` on the model disk (receipts, remembered records and
  marks, served sets, the cluster id), outliving the process as the disk does.

The node is started from a task of its process, so every task it starts is the process's
(killing it cancels them). Every node of a run is this one (issue 49: the copies of the
node's loops the simulation ran before are gone).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from backend_store.cluster.coordination.layout import Layout, PartitionRecord, ServedSet
from backend_store.cluster.coordination.storage_record import NodeStorage
from backend_store.cluster.coordination.timeline import RecordMark
from backend_store.cluster.node.node import Node
from backend_store.cluster.node.node_config import NodeConfig
from backend_store.cluster.node.ports import AcceptStream
from backend_store.cluster.node.receipts import KeptReceipt

from .kernel import Process
from .network import Network
from .oracle import Oracle
from .sim_coordinator import SimCoordinator
from .sim_partition import SimReplicaStores
from .sim_store import NodeDisk

PORT = 7000


class SimNodeClock:
    """``NodeClock`` on the process's clock."""

    def __init__(self, proc: Process, wall: Callable[[], float]) -> None:
        self.proc = proc
        self._wall = wall

    def now(self) -> float:
        return self.proc.clock()

    def wall(self) -> float:
        return self._wall()

    async def sleep(self, seconds: float) -> None:
        await self.proc.sleep(seconds)

    async def wait(self, event: asyncio.Event, timeout_s: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.proc.local_to_real(timeout_s)):
                await event.wait()
        await self.proc.awake()


class SimListener:
    """``NodeListener`` on the simulated network: the ``node`` service of the process's host."""

    def __init__(self, proc: Process, network: Network) -> None:
        self.proc = proc
        self.network = network

    async def listen(self, accept: AcceptStream) -> None:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _peer: str) -> None:
            await accept(reader, writer)

        self.network.listen(self.proc, "node", handler)

    @property
    def address(self) -> str:
        return f"{self.proc.name}:{PORT}"

    def close(self) -> None:
        pass  # the node stops only with its process, whose services the network drops


class KeptOnDisk:
    """``node_identity.ClusterIdFile`` on the model disk (``DATA/cluster-id``)."""

    def __init__(self, proc: Process, disk: NodeDisk) -> None:
        self.proc = proc
        self.disk = disk
        self.where = f"{disk.node}:DATA/cluster-id"

    async def read(self) -> str | None:
        return self.disk.cluster_id

    async def keep(self, cluster_id: str) -> None:
        await self.proc.awake()
        self.disk.cluster_id = cluster_id


class SimNodeFiles:
    """``NodeFiles`` on the model disk: each write is durable at once (a frozen process
    writes when it thaws)."""

    def __init__(self, proc: Process, disk: NodeDisk) -> None:
        self.proc = proc
        self.disk = disk
        self.cluster_id = KeptOnDisk(proc, disk)

    def new_cluster_id(self) -> str:
        """From the node's name and the virtual time (production: a uuid4)."""
        return f"c-{self.disk.node}-{asyncio.get_running_loop().time():.6f}"

    async def read_receipts(self) -> dict[int, KeptReceipt]:
        return dict(self.disk.receipts)

    async def keep_receipt(self, partition: int, kept: KeptReceipt) -> None:
        await self.proc.awake()
        self.disk.receipts[partition] = kept

    async def read_remembered(self) -> dict[int, PartitionRecord]:
        return dict(self.disk.remembered)

    async def read_marks(self) -> dict[int, RecordMark]:
        return dict(self.disk.marks)

    async def remember(self, partition: int, record: PartitionRecord, mark: RecordMark | None) -> None:
        await self.proc.awake()
        self.disk.remembered[partition] = record
        if mark is not None:
            self.disk.marks[partition] = mark

    async def forget(self, partition: int) -> None:
        await self.proc.awake()
        self.disk.remembered.pop(partition, None)
        self.disk.marks.pop(partition, None)

    async def read_served_sets(self) -> dict[int, ServedSet]:
        return dict(self.disk.served_sets)

    async def keep_served_set(self, partition: int, served: ServedSet) -> None:
        await self.proc.awake()
        self.disk.served_sets[partition] = served

    async def forget_served_set(self, partition: int) -> None:
        await self.proc.awake()
        self.disk.served_sets.pop(partition, None)

    async def storage(self, stores: Iterable[object]) -> NodeStorage | None:
        return None  # the model's disks have no size (a full one fails its commits)


@dataclass(slots=True)
class SimNode:
    """A node process: production's :class:`Node` in a simulated process."""

    proc: Process
    node: Node

    @property
    def layout(self) -> Layout:
        return self.node.layout


def start_node(
    proc: Process,
    disk: NodeDisk,
    network: Network,
    coordinator: SimCoordinator,
    oracle: Oracle,
    *,
    layout: Layout,
    store_clock: Callable[[], float],
    window_entries: int,
    lease_ttl_s: float = 2.0,
) -> SimNode:
    """Build the node on the simulated ports (its stores' time ``store_clock``, also its
    wall clock; its leaders' shipping window ``window_entries``) and start it from its process."""
    node_id = disk.node
    node = Node(
        # The data directory names the model disk only: the node reaches it through its files.
        NodeConfig(node_id, Path(f"/simulated/{node_id}"), layout=layout, ttl_s=lease_ttl_s),
        coordinator,
        SimListener(proc, network),
        SimReplicaStores(
            proc, node_id, disk, network, oracle, store_clock=store_clock, window_entries=window_entries
        ),
        SimNodeClock(proc, store_clock),
        SimNodeFiles(proc, disk),
    )
    proc.spawn(node.start(), "start")
    return SimNode(proc, node)
