"""A node deletes a replica only on a tombstone etcd holds now (``tombstone_stands``), on a
real etcd: the tombstone a watch shows is read again directly before the deletion, and only
the very same tombstone, still there, lets the node delete.

Why (simulation seed ``all`` 51983, session 34): tombstones a manager wrote into a foreign
etcd after a wipe were still a node's watch's when the real etcd was restored; the cluster
record, read directly, was the node's own again, and a replica holding acknowledged entries
was deleted on a tombstone the real etcd never held.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from backend_store.cluster.coordination.etcd_coordinator import EtcdCoordinator
from backend_store.cluster.coordination.layout import Layout, Tombstone
from backend_store.cluster.node.etcd_records import tombstone_stands
from tests.fixtures.etcd_server import unique_prefix


@pytest.fixture
async def coordinator(etcd_endpoints: list[str]) -> AsyncIterator[EtcdCoordinator]:
    async with EtcdCoordinator(etcd_endpoints) as c:
        yield c


async def test_only_the_tombstone_etcd_holds_now_lets_a_node_delete(coordinator: EtcdCoordinator) -> None:
    layout = Layout(unique_prefix("tomb") + "/")
    watched = Tombstone(5, "n1", "moved", 30, "t", "q")
    key = layout.tombstone(5, "n1")

    # The watch shows it, etcd does not hold it (a foreign etcd's, or deleted since).
    assert not await tombstone_stands(coordinator, layout, "n1", 5, watched)
    await coordinator.put(key, watched.pack())
    assert await tombstone_stands(coordinator, layout, "n1", 5, watched)
    # etcd holds another tombstone under the key: not the one the node acts on.
    await coordinator.put(key, Tombstone(5, "n1", "moved", 12, "t", "q").pack())
    assert not await tombstone_stands(coordinator, layout, "n1", 5, watched)
    await coordinator.put(key, b"\xc1 not msgpack")
    assert not await tombstone_stands(coordinator, layout, "n1", 5, watched)
    # Nothing watched: nothing to delete on.
    assert not await tombstone_stands(coordinator, layout, "n1", 5, None)
