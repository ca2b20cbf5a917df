"""What a :class:`~.node.Node` talks through, as protocols: the node's decisions and loops are
the same whichever implementation it is given.

- the **coordinator** is :class:`~..coordination.coordinator.Coordinator` (etcd; the
  simulation's model of it);
- :class:`NodeListener`: the one port that gateways and other nodes' leaders connect to;
- :class:`ReplicaStores`: the replicas' stores, opened as :class:`~.partition_host.PartitionHost`
  s, found on disk and deleted;
- :class:`NodeClock`: the node's timers (its rounds, retries and publication pace).

:mod:`.local_ports` holds the implementations a node process runs on (TCP, LMDB under the
data directory, the system's clock).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Protocol

from ...types import Epoch
from .partition_host import PartitionHost, Wake

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

    async def sleep(self, seconds: float) -> None: ...

    async def wait(self, event: asyncio.Event, timeout_s: float) -> None:
        """Until ``event`` is set or ``timeout_s`` passed, whichever is first."""
