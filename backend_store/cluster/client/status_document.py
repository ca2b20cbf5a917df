"""``GET /v1/cluster`` (API.md): nodes and partitions as operators and the console see them.

Built from the gateway's watched partition map alone (no node is asked): each node's state,
its replication lag (entries behind the leaders of the partitions it follows) and the storage
use it publishes; each partition's leader, followers, epoch and the leader's LSN, and a
membership change under way: ``learners`` (replicas catching up, not yet voting: a drain,
a rebalancing move or the replacement of a dead replica), ``leaving`` (voters that leave once
those vote) and ``successor`` (a hand-over of leadership asked for).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..coordination.identity import IdentityVerdict
from ..coordination.storage_record import NodeStorage
from .partition_map import PartitionMap


def cluster_document(
    current: PartitionMap, addresses: Mapping[str, str], identity: IdentityVerdict | None = None
) -> dict[str, Any]:
    """The document for ``current``; ``addresses``: every node's last known address (a node
    whose lease expired is gone from the map but still named by partitions); ``identity``:
    the gateway's verdict on etcd's cluster record."""
    nodes = []
    for node in sorted(current.nodes.values(), key=lambda n: n.id):
        lag = 0
        for pid, position in node.replicas.items():
            part = current.partitions.get(pid)
            if part is None or part.leader is None or part.leader.node == node.id:
                continue
            leader = current.nodes.get(part.leader.node)
            head = leader.replicas.get(pid) if leader is not None else None
            if head is not None:
                lag += max(0, head.lsn - position.lsn)
        nodes.append(
            {
                "id": node.id,
                "address": node.address,
                "state": node.state,
                "lag": lag,
                "storage": _storage_document(node.storage),
                "strays": [{"partition": p, "reason": why} for p, why in sorted(node.strays.items())],
                "refusal": node.refusal,
            }
        )
    # A node whose lease expired is gone from nodes/; while partitions still name it, it
    # is shown as down (the console's node_down alert fires on it).
    named = {n for part in current.partitions.values() for n in (*part.replicas, *part.learners)}
    for missing in sorted(named - current.nodes.keys()):
        address = addresses.get(missing, "")
        nodes.append(
            {
                "id": missing,
                "address": address,
                "state": "down",
                "lag": 0,
                "storage": None,
                "strays": [],
                "refusal": None,
            }
        )
    partitions = []
    for part in sorted(current.partitions.values(), key=lambda p: (p.tenant, p.queue, p.index)):
        claim = part.leader
        head = None
        if claim is not None and (holder := current.nodes.get(claim.node)) is not None:
            head = holder.replicas.get(part.id)
        partitions.append(
            {
                "id": part.id,
                "tenant": part.tenant,
                "queue": part.queue,
                "index": part.index,
                "leader": None if claim is None else claim.node,
                "followers": [n for n in part.replicas if claim is None or n != claim.node],
                "epoch": 0 if claim is None else claim.epoch,
                "lsn": 0 if head is None else head.lsn,
                "mode": part.mode,
                "learners": list(part.learners),
                "leaving": list(part.leaving),
                "successor": part.successor,
            }
        )
    verdict = identity or IdentityVerdict()
    cluster = {"id": verdict.cluster_id, "trusted": verdict.trusted, "refusal": verdict.refusal}
    return {"cluster": cluster, "nodes": nodes, "partitions": partitions}


def _storage_document(storage: NodeStorage | None) -> dict[str, Any] | None:
    """A node's ``storage`` in ``GET /v1/cluster`` (None until it published one)."""
    if storage is None:
        return None
    return {
        "used_bytes": storage.used_bytes,
        "map_size": storage.map_size,
        "max_map_size": storage.max_map_size,
        "environments": storage.environments,
        "map_used_ratio": round(storage.map_used_ratio, 6),
        "disk_free_bytes": storage.disk_free_bytes,
        "disk_total_bytes": storage.disk_total_bytes,
    }
