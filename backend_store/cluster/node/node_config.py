"""A node's settings: what ``pushgate node``'s options and an embedding choose, read once.

What a node talks through (etcd, its listening port, its replicas' stores, its clock) is not
here: those are its ports (:mod:`.ports`), built by whoever runs the node
(:mod:`.local_ports` for a process on this machine; the simulation builds its own).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..coordination.layout import Layout


@dataclass(frozen=True, slots=True)
class NodeConfig:
    node_id: str
    # The node's own files (receipts, remembered records, served sets, its cluster's id);
    # its replicas' stores live where its ``ReplicaStores`` put them (DATA/partitions/ locally).
    data_dir: Path
    layout: Layout = field(default_factory=Layout)
    # The etcd session's lease: a node cut from etcd this long stops leading.
    ttl_s: float = 2.0
    # A reconcile round on every change the watches show, and at least this often.
    tick_s: float = 0.2
    # Replicas' positions are republished when they change, at most this often.
    publish_every_s: float = 0.5
    # How long one gateway request may take on a partition (a send waits for its replication).
    request_timeout_s: float = 5.0
    # Check-quorum's window (None: one lease TTL; 0: off). One TTL: a leader cut from its
    # followers costs what a leader cut from etcd costs (its lease), issue 24's "no minority
    # fault costs more than its lease" (two TTLs, before, cost 4.2 s per cut). Four 0.5 s
    # heartbeats: a loaded machine's stall that long would cost the etcd session (same TTL)
    # anyway.
    quorum_window_s: float | None = None
    # How long a hand-over may refuse writes waiting for its successor to catch up before
    # this leader serves again (leadership.py).
    handover_timeout_s: float = 2.0

    @property
    def quorum_window(self) -> float:
        return self.ttl_s if self.quorum_window_s is None else self.quorum_window_s
