"""``cluster://etcd-host:port[,...][/root/]``: the :class:`~backend_store.backend.Backend` on
replicated backend nodes, found through etcd.

What it does per request (docs/cluster.md, "The gateway on the cluster"):

- **Metadata** (tenants, keys, limits, queue records) lives in etcd (:mod:`.metadata`);
  changes made by any gateway reach this one's listeners through the watch.
- **Routing.** A queue's partitions and their leaders come from the watched partition map
  (:mod:`.partition_map`); :mod:`.routing` picks the partition of each send and prefixes
  every receipt with its partition id. Each request carries the leader's epoch.
- **Isolation.** One connection per node (the node helper's :class:`~.client.NodePool`),
  a timeout per request and a circuit breaker per node (:mod:`.node_health`): a slow node
  costs only the partitions it leads.
- **Moving leaders.** ``not_leader`` / ``stale_epoch`` re-read the map and retry; a
  partition without a leader is waited for (up to the request deadline). A request whose
  fate is unknown (a timeout, a lost connection) is retried only when that is safe: reads,
  and sends whose every message carries a dedupe id (the partition dedupes the retry).
- **Push.** Nodes send ``Notify`` after commits that made messages visible; it feeds the
  change listeners, so WebSocket delivery stays push across gateways. An idle dispatcher's
  standing receive (``set_demand``) goes to the partitions' leaders (:mod:`.standing`), which
  receive for it inside the sending commit and push the messages back (``Delivery``).

The backend is built from one part per protocol it implements: :mod:`.queue_operations`
(``QueueStore``'s queues), :mod:`.message_operations` (its messages, ``ReceiptShards``,
``DeadLetters``), :mod:`.push_operations` (change listeners, ``StandingReceive``,
``MessageEvents``); this module holds its life cycle, ``MetadataStore``, ``MetadataWatch``,
``ClusterStatus``, ``StorageStats`` and ``ReloadsTls``. :mod:`.queue_parts` says where a
queue's data is, for all of them; :mod:`.cluster_settings` reads the URL.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections.abc import Mapping
from typing import Any

from ...backend import ChangeListener, EventListener
from ...commit_stats import CommitStats
from ...errors import Unavailable
from ...options import StoreOptions
from ...tls_reload import RELOAD_EVERY_S, TlsReloader
from ...types import QueueInfo, QueueName, StorageUsage, TenantId
from ..coordination.coordinator import CoordinatorUnavailable
from ..coordination.etcd_coordinator import EtcdCoordinator
from ..coordination.layout import Layout
from ..protocol.tls import NodeTls, node_tls_loader
from .cluster_settings import ClusterSettings, parse_cluster_url
from .metadata import ClusterMetadata, MetaListener, QueueListener
from .node_health import BreakerSettings, NodeHealth
from .node_pool import NodePool
from .partition_calls import PartitionCalls
from .partition_map import ClusterView, LeaderClaim
from .pool_slots import PoolSlots
from .push_operations import PushOperations
from .queue_operations import QueueOperations
from .queue_parts import QueueParts
from .send_batcher import SendBatcher
from .standing import StandingDemands
from .status_document import cluster_document


class ClusterBackend(QueueOperations, PushOperations):
    """The gateway's store in cluster mode. Build with :func:`open_cluster_backend`."""

    def __init__(self, endpoints: str, settings: ClusterSettings, options: StoreOptions) -> None:
        self.endpoints = endpoints
        self.settings = settings
        self.paths = Layout(settings.root)
        self.gateway_id = f"gw-{uuid.uuid4().hex[:8]}"
        self._options = options
        self._coordinator = EtcdCoordinator(
            endpoints, timeout_s=settings.etcd_timeout_s, tls=settings.etcd_tls()
        )
        self.metadata = ClusterMetadata(
            self._coordinator,
            self.paths,
            clock=options.clock or time.time,
            reread_every_s=settings.reread_every_s,
        )
        self.view = ClusterView(self._coordinator, self.paths, reread_every_s=settings.reread_every_s)
        self.health = NodeHealth(BreakerSettings())
        self.calls = PartitionCalls(
            self.view,
            self.metadata,
            self.health,
            deadline_s=settings.request_deadline_s,
            node_timeout_s=settings.node_timeout_s,
        )
        self.queue_parts = QueueParts(self.metadata, self.view, self.calls)
        self.pool_slots = PoolSlots(
            self._coordinator, self.paths, self.view, wait_s=settings.placement_wait_s
        )
        # The node connections while the backend runs (``start`` to ``close``).
        self.pool: NodePool | None = None
        self.send_batcher = SendBatcher(
            self.calls.call, enabled=settings.send_batching != 0, linger_s=settings.send_linger_s
        )
        tls_files = settings.tls_files()
        self.tls = NodeTls.load(tls_files) if tls_files is not None else None
        # Renewed files are loaded into self.tls's contexts while the backend runs (ReloadsTls).
        self._tls_reloader = (
            TlsReloader(
                (tls_files.cert, tls_files.key, tls_files.ca), node_tls_loader(self.tls), RELOAD_EVERY_S
            )
            if tls_files is not None and self.tls is not None
            else None
        )
        self._tls_watch: asyncio.Task[None] | None = None
        self._listeners: list[ChangeListener] = []
        self._round_robin = itertools.count()
        self._leaders: dict[int, LeaderClaim | None] = {}
        self._addresses: dict[str, str] = {}  # every node's last known address
        self.standing = StandingDemands()
        self._releases: set[asyncio.Task[None]] = set()
        self._event_listeners: list[EventListener] = []
        self._started = False

    # Life cycle ---------------------------------------------------------------------

    async def start(self) -> None:
        if self._started:
            return
        try:
            await self._coordinator.connect()
            await self.metadata.start()
            await self.view.start()
        except CoordinatorUnavailable as exc:
            await self.close()
            raise Unavailable(f"cannot reach etcd at {self.endpoints}: {exc.detail}") from None
        self.pool = self.calls.pool = NodePool(
            self.gateway_id,
            on_notify=self._notified,
            on_delivery=self._delivered,
            on_disconnect=self._disconnected,
            on_events=self._events_reported,
            timeout_s=self.settings.node_timeout_s,
            tls=self.tls.client if self.tls is not None else None,
        )
        self.view.add_listener(self._map_changed)
        if self._tls_reloader is not None:
            self._tls_watch = asyncio.create_task(self._tls_reloader.run())
        self._started = True

    def reload_tls(self) -> bool:
        """``ReloadsTls``: look at the TLS files now; whether a renewed set was loaded."""
        return self._tls_reloader is not None and self._tls_reloader.check()

    async def close(self) -> None:
        if self._tls_watch is not None:
            self._tls_watch.cancel()
        # First: a request racing close must not use it.
        pool, self.pool, self.calls.pool = self.pool, None, None
        releases = list(self._releases)
        for task in releases:
            task.cancel()  # their messages come back after their visibility timeout
        if releases:
            await asyncio.wait(releases)
        if pool is not None:
            await pool.close()
        await self.view.close()
        await self.metadata.close()
        await self._coordinator.close()
        self._started = False

    async def check_writable(self) -> None:
        """Ready when etcd answers, holds this cluster (its identity record), and every
        partition of the map has a leader."""
        try:
            await self._coordinator.get(self.paths.prefix + "ready-check")
        except CoordinatorUnavailable as exc:
            raise Unavailable(f"etcd is unreachable: {exc.detail}") from None
        refusal = self.view.identity.refusal
        if refusal is not None:
            raise Unavailable(f"the cluster's metadata cannot be trusted: {refusal}")
        leaderless = self.view.map.leaderless()
        if leaderless:
            names = ", ".join(f"{p.queue}[{p.index}]" for p in leaderless[:5])
            raise Unavailable(f"{len(leaderless)} partition(s) have no leader yet: {names}")

    # Metadata changes (the MetadataWatch capability) ---------------------------------

    def add_meta_listener(self, listener: MetaListener) -> None:
        """``listener(namespace, key)`` after a metadata value changed anywhere in the cluster."""
        self.metadata.add_meta_listener(listener)

    def add_queue_listener(self, listener: QueueListener) -> None:
        """``listener(tenant, queue)`` after a queue's record changed anywhere in the cluster."""
        self.metadata.add_queue_listener(listener)

    def watched_queue(self, tenant: TenantId, name: QueueName) -> QueueInfo | None:
        """The MetadataWatch capability's queue: the watched record's attributes, no stats
        (asking every partition for stats to read an attribute is what this saves)."""
        record = self.metadata.cached_queue(tenant, name)
        if record is None:
            return None
        return QueueInfo(record.tenant, record.name, record.created_at, record.attributes)

    def placement_of(self, tenant: TenantId, name: QueueName) -> tuple[int, ...] | None:
        """The QueuePlacements capability: the watched record's placement."""
        record = self.metadata.cached_queue(tenant, name)
        return None if record is None else record.placement

    # Metadata -----------------------------------------------------------------------

    async def meta_get(self, namespace: str, key: str) -> bytes | None:
        return await self.metadata.meta_get(namespace, key)

    async def meta_put(self, namespace: str, key: str, value: bytes, *, only_if_absent: bool = False) -> bool:
        return await self.metadata.meta_put(namespace, key, value, only_if_absent=only_if_absent)

    async def meta_delete(self, namespace: str, key: str) -> bool:
        return await self.metadata.meta_delete(namespace, key)

    async def meta_list(self, namespace: str, prefix: str = "") -> list[tuple[str, bytes]]:
        return await self.metadata.meta_list(namespace, prefix)

    # Cluster status (the ClusterStatus capability) ---------------------------------

    async def cluster_status(self) -> Mapping[str, Any]:
        """API.md's ``GET /v1/cluster`` document, from the watched map (no node is asked)."""
        return cluster_document(self.view.map, self._addresses, self.view.identity)

    # Storage use (the StorageStats capability) ------------------------------------

    async def storage_usage(self) -> StorageUsage:
        """The fullest partition environment of any node in the map (the one nearest "map
        full"), from what nodes publish every few seconds; no node is asked. Zeros before
        any node published. Each node's own figures (disk free among them) are in
        :meth:`cluster_status`."""
        published = [n.storage.fullest for n in self.view.map.nodes.values() if n.storage is not None]
        fullest = max((u for u in published if u is not None), key=lambda u: u.used_ratio, default=None)
        return fullest if fullest is not None else StorageUsage(0, 0, 0)

    def commit_stats(self) -> CommitStats | None:
        """None: commits happen on the nodes, not in the gateway."""
        return None


def open_cluster_backend(url: str, options: StoreOptions) -> ClusterBackend:
    """Build (not start) the cluster backend a ``cluster://`` URL names."""
    endpoints, settings = parse_cluster_url(url)
    return ClusterBackend(endpoints, settings, options)
