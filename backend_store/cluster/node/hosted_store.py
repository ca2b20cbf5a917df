"""What a :class:`~.partition_host.PartitionHost` holds and reaches, as types: the replica's
store (:class:`HostedStore`), how it is opened (:data:`OpenStore`) and how its leader dials
the other replicas (:data:`Dial`).

A node process opens LMDB environments and dials TCP (:mod:`.local_ports`); the simulation
opens its model store and dials its simulated network, and runs the same ``PartitionHost``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ...backend import ChangeListener, ReplicaStore
from ...types import QueueAttributes, QueueInfo, QueueName, TenantId
from ..replication.log_shipping import InstallSnapshot


class HostedStore(ReplicaStore, Protocol):
    """One replica's store as its host and node use it: the replicated log, the queue
    operations a leader applies from etcd's records, the leader's sweep, wake-ups, and the
    replica's label (kept outside the log). Gateways' requests reach it by name
    (``protocol.ops.call``)."""

    async def check_writable(self) -> None:
        """Raise if a write would fail now (a term's first entry, term.py)."""

    def add_listener(self, listener: ChangeListener) -> None: ...

    async def create_queue(
        self, tenant: TenantId, name: QueueName, attributes: Mapping[str, Any]
    ) -> tuple[QueueInfo, bool]: ...

    async def get_queue(self, tenant: TenantId, name: QueueName) -> QueueInfo: ...

    async def queue_attributes(
        self,
        keys: Collection[tuple[str, str]],
        likely: Mapping[tuple[str, str], QueueAttributes] | None = None,
    ) -> dict[tuple[str, str], QueueAttributes | None]:
        """Several queues' attributes in one read (None: no such queue): a pool
        partition's term checks all its queues at once. A queue that holds what ``likely``
        gives for it is answered with that object (the store may skip decoding it)."""

    async def update_queue(
        self, tenant: TenantId, name: QueueName, changes: Mapping[str, Any]
    ) -> QueueInfo: ...

    async def delete_queue(self, tenant: TenantId, name: QueueName) -> None: ...

    async def sweep(self) -> int:
        """Drop what retention and dedupe windows let go; how many."""

    async def replica_label(self) -> bytes | None: ...

    async def set_replica_label(self, value: bytes) -> None: ...

    async def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class OpenedReplica:
    """A replica's store, opened; ``staging`` and ``install_snapshot`` let its follower be
    re-seeded from a leader's snapshot (None: it never is)."""

    store: HostedStore
    staging: Path | None = None
    install_snapshot: InstallSnapshot | None = None


# Opens (or makes, empty) the replica's store.
OpenStore = Callable[[], Awaitable[OpenedReplica]]
# Opens a connection to the node at ``host:port`` (a leader's link to a follower).
Dial = Callable[[str], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]
