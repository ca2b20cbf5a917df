"""What a node reads from each prefix it watches: one pure function a prefix.

``node.py`` and the deterministic simulation's node call these on every state their watches
deliver, so both read etcd alike (a record this version cannot read is left out, never an
error: the partition map's own rules are :func:`~..coordination.layout.read_partition_map`).
``queues/`` is kept by the keys that change instead (:class:`~.pool_queues.QueueRecords`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Mapping

from ...errors import PushgateError
from ...types import Epoch
from ..coordination.coordinator import Coordinator, CoordinatorUnavailable, PrefixState
from ..coordination.layout import Layout, LeaderRecord, NodeRecord, Tombstone

Leaders = dict[int, tuple[LeaderRecord, Epoch]]


def read_leaders(layout: Layout, state: PrefixState) -> Leaders:
    """``leaders/{partition}``: who holds each key, and the epoch it won."""
    out: Leaders = {}
    for key, entry in state.entries.items():
        suffix = key[len(layout.leaders) :]
        if suffix.isdigit():
            with contextlib.suppress(PushgateError):
                record = LeaderRecord.unpack(entry.value)
                out[int(suffix)] = (record, record.epoch(entry.create_revision))
    return out


def leaders_moved(
    before: Mapping[int, tuple[LeaderRecord, Epoch]], after: Leaders, hosted: Collection[int]
) -> bool:
    """Whether a hosted partition's leader changed or vanished (the node then publishes its
    positions at once, so the manager promotes on positions taken after the old key was gone)."""
    return any(before.get(p, (None, 0))[1] != after.get(p, (None, 0))[1] for p in hosted)


def read_nodes(state: PrefixState) -> dict[str, NodeRecord]:
    out: dict[str, NodeRecord] = {}
    for node_id, value in state.values().items():
        with contextlib.suppress(PushgateError):
            out[node_id] = NodeRecord.unpack(value)
    return out


def read_tombstones(layout: Layout, node_id: str, state: PrefixState) -> dict[int, Tombstone]:
    """This node's tombstones: the replicas it may delete."""
    out: dict[int, Tombstone] = {}
    for pid, value in layout.node_tombstones(node_id, state.values()).items():
        with contextlib.suppress(PushgateError):
            out[pid] = Tombstone.unpack(value)
    return out


async def tombstone_stands(
    coordinator: Coordinator, layout: Layout, node_id: str, pid: int, watched: Tombstone | None
) -> bool:
    """Whether etcd, read directly now, still holds the tombstone the watch showed for this
    node's replica of ``pid``. Asked before a deletion, with the cluster record read after
    it: a watch can hold a tombstone of another etcd than the one the cluster record now
    comes from (simulation seed ``all`` 51983, session 33: tombstones a manager wrote into a
    foreign cluster's etcd, after a wipe, were still the watch's when etcd was restored, and
    the cluster record, read directly, was this node's again)."""
    if watched is None:
        return False
    try:
        entry = await coordinator.get(layout.tombstone(pid, node_id))
    except CoordinatorUnavailable:
        return False
    if entry is None:
        return False
    try:
        return Tombstone.unpack(entry.value) == watched
    except PushgateError:
        return False
