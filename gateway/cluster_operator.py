"""What the console asks of a cluster beyond ``GET /v1/cluster``: drains and their progress.

One small object, built only on ``cluster://`` (:func:`cluster_operator_for`), that the
console reaches through two injected callables (``web_console/deps.py``), so the console
knows nothing of etcd and this file is the one place that changes when the drain
mechanism does:

- :meth:`ClusterOperator.status`: API.md's ``GET /v1/cluster`` document (built by the
  cluster backend from its watched map, unchanged) plus, for the console, each node's
  ``drain_requested`` (``drain/{node}`` in etcd) and each partition's ``replicas`` with the
  LSN each replica published (``[{"node", "lsn"}]``; the document itself gives only the
  leader's), from which the console shows every replica's lag;
- :meth:`ClusterOperator.set_drain`: the drain request itself, written by the very function
  ``pushgate manager --drain NODE`` / ``--undrain NODE`` runs, so the console and the
  terminal are one path to the managers (docs/cluster.md, section 6).

Today a drain is the key ``drain/{node}``: the manager moves leadership off the node, then
replaces its replicas. When the membership work lands (learners, catch-up, tombstones),
the request stays the same key and what changes is the status the document reports.

The map changes (a leader moved, a replica replaced) poke the monitor through
:meth:`ClusterOperator.on_change`, so a page watching a drain sees each move within the
sampler's minimum gap, not at the next 5 s sample.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from backend_store.backend import Backend, ClusterStatus
from backend_store.errors import PushgateError

if TYPE_CHECKING:
    from backend_store.cluster.client.cluster_backend import ClusterBackend
    from backend_store.cluster.client.partition_map import PartitionMap
    from backend_store.cluster.coordination.etcd_coordinator import EtcdCoordinator

log = logging.getLogger("pushgate.cluster")


class ClusterOperator:
    """A gateway component (start, drain, close) holding one etcd connection of its own
    for reading drain requests (the backend's is private to it)."""

    def __init__(self, store: ClusterBackend) -> None:
        self.store = store
        self._listeners: list[Callable[[], None]] = []
        self._etcd: EtcdCoordinator | None = None
        self._drains: set[str] = set()
        self._unread = False  # the last read of drain requests failed (logged once)

    def on_change(self, listener: Callable[[], None]) -> None:
        """``listener()`` after each change of the watched partition map."""
        self._listeners.append(listener)

    async def start(self) -> None:
        from backend_store.cluster.coordination.etcd_coordinator import EtcdCoordinator

        self.store.view.add_listener(self._map_changed)
        settings = self.store.settings
        self._etcd = EtcdCoordinator(
            self.store.endpoints, timeout_s=settings.etcd_timeout_s, tls=settings.etcd_tls()
        )
        await self._etcd.connect()

    async def drain(self) -> None:
        pass

    async def close(self) -> None:
        if self._etcd is not None:
            etcd, self._etcd = self._etcd, None
            await etcd.close()

    def _map_changed(self, _map: PartitionMap) -> None:
        for listener in list(self._listeners):
            listener()

    async def drain_requests(self) -> set[str]:
        """The nodes an operator asked to drain (``drain/{node}``). While etcd does not
        answer, the last ones read: the rest of the document comes from the watched map and
        the queues' figures from the nodes, so a sample must not fail for want of this."""
        if self._etcd is None:
            return self._drains
        try:
            state = await self._etcd.read_prefix(self.store.paths.drain)
        except PushgateError as exc:
            if not self._unread:
                log.warning("cannot read drain requests, showing the last ones read: %s", exc.detail)
            self._unread = True
            return self._drains
        self._unread = False
        self._drains = set(state.values())
        return self._drains

    async def status(self) -> Mapping[str, Any]:
        """``GET /v1/cluster``'s document with drain requests and replica positions."""
        doc = dict(await self.store.cluster_status())
        drained = await self.drain_requests()
        positions = self.store.view.map.nodes
        nodes = [{**node, "drain_requested": node["id"] in drained} for node in doc["nodes"]]
        listed = {node["id"] for node in nodes}
        # A drain asked for a node the map no longer knows still shows (and can be withdrawn).
        nodes += [
            {"id": n, "address": "", "state": "gone", "lag": 0, "drain_requested": True}
            for n in sorted(drained - listed)
        ]
        partitions = []
        for part in doc["partitions"]:
            replicas = []
            for node_id in (part["leader"], *part["followers"]):
                holder = positions.get(node_id) if node_id is not None else None
                own = holder.replicas.get(part["id"]) if holder is not None else None
                if node_id is not None:
                    replicas.append({"node": node_id, "lsn": None if own is None else own.lsn})
            partitions.append({**part, "replicas": replicas})
        return {**doc, "nodes": nodes, "partitions": partitions}

    async def set_drain(self, node_id: str, drain: bool) -> None:
        """Ask the managers to move everything off ``node_id`` (or stop asking): what
        ``pushgate manager --drain`` / ``--undrain`` does, through the same function."""
        from backend_store.cluster.manager.manager import set_drain

        settings = self.store.settings
        await set_drain(
            self.store.endpoints,
            node_id,
            drain=drain,
            prefix=self.store.paths.prefix,
            etcd_tls=settings.etcd_tls(),
        )
        log.info("drain of node %s %s from the console", node_id, "requested" if drain else "withdrawn")


def cluster_operator_for(store: Backend) -> ClusterOperator | None:
    """The operator for a ``cluster://`` store; None for any other (no drains there)."""
    if not isinstance(store, ClusterStatus):
        return None
    from backend_store.cluster.client.cluster_backend import ClusterBackend

    return ClusterOperator(store) if isinstance(store, ClusterBackend) else None
