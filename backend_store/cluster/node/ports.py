"""What a :class:`~.node.Node` talks through, as protocols: the node's decisions and loops are
the same whichever implementation it is given.

- the **coordinator** is :class:`~..coordination.coordinator.Coordinator` (etcd; the
  simulation's model of it);
- :class:`NodeListener`: the one port that gateways and other nodes' leaders connect to;
- :class:`ReplicaStores`: the replicas' stores, opened as :class:`~.partition_host.PartitionHost`
  s, found on disk and deleted;
- :class:`NodeClock`: the node's timers (its rounds, retries and publication pace);
- :class:`NodeFiles`: what the node keeps of its own (``DATA/``: receipts, the records and
  voting sets its replicas were served on, its cluster's id) and how full its disk is.

:mod:`.local_ports` holds the implementations a node process runs on (TCP, LMDB and files
under the data directory, the system's clock); the simulation (``tests/simulation/``) has
its own, and runs the same node on them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import Protocol

from ...types import Epoch
from ..coordination.layout import PartitionRecord, ServedSet
from ..coordination.storage_record import NodeStorage
from ..coordination.timeline import RecordMark
from .node_identity import KeptClusterId
from .partition_host import PartitionHost, Wake
from .receipts import KeptReceipt

# A connection accepted on the node's port, as the node protocol's streams.
AcceptStream = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class NodeListener(Protocol):
    async def listen(self, accept: AcceptStream) -> None:
        """Start accepting connections, each handed to ``accept``."""

    @property
    def address(self) -> str:
        """``host:port`` where other nodes and gateways reach this one (valid after
        :meth:`listen`); published in the node's record."""

    def close(self) -> None:
        """Stop accepting connections (those accepted go on until the node closes them)."""


class ReplicaStores(Protocol):
    async def open(self, partition: int, wake: Wake, floor: Callable[[], Epoch]) -> PartitionHost:
        """Open the replica of ``partition`` (made empty if there is none yet); ``wake`` is
        called after a commit that made messages visible while it leads; ``floor`` is the
        oldest term it may follow (the node's incarnation: ``timeline.incarnation_floor``). Raises whatever a
        damaged or unreadable replica raises."""

    async def on_disk(self) -> set[int]:
        """The partitions with a replica (or a re-seed's leftovers of one) kept here."""

    def holds(self, partition: int) -> bool:
        """Whether a replica of ``partition`` itself is kept here (not only leftovers)."""

    async def delete(self, partition: int, why: str) -> None:
        """Delete what is kept of ``partition`` (closed already): its replica and leftovers."""


class NodeClock(Protocol):
    def now(self) -> float:
        """Seconds on a clock that never goes back (the node's timers; not the stores' time)."""

    def wall(self) -> float:
        """Seconds since the epoch (when a cluster this node founds was made)."""

    async def sleep(self, seconds: float) -> None: ...

    async def wait(self, event: asyncio.Event, timeout_s: float) -> None:
        """Until ``event`` is set or ``timeout_s`` passed, whichever is first."""


class NodeFiles(Protocol):
    """The node's own files, each write durable before it returns (receipts.py,
    remembered_records.py, served_sets.py, node_identity.py), and its disk's room."""

    @property
    def cluster_id(self) -> KeptClusterId:
        """Where the node keeps its cluster's id."""

    def new_cluster_id(self) -> str:
        """The id of a cluster this node founds."""

    async def read_receipts(self) -> dict[int, KeptReceipt]: ...

    async def keep_receipt(self, partition: int, kept: KeptReceipt) -> None: ...

    async def read_remembered(self) -> dict[int, PartitionRecord]: ...

    async def read_marks(self) -> dict[int, RecordMark]: ...

    async def remember(self, partition: int, record: PartitionRecord, mark: RecordMark | None) -> None: ...

    async def forget(self, partition: int) -> None:
        """The record (and its mark) kept for ``partition``."""

    async def read_served_sets(self) -> dict[int, ServedSet]: ...

    async def keep_served_set(self, partition: int, served: ServedSet) -> None: ...

    async def forget_served_set(self, partition: int) -> None: ...

    async def storage(self, stores: Iterable[object]) -> NodeStorage | None:
        """The node's storage use, published with its positions (None: not measured)."""
