"""Routing of queues placed on shared partitions, the gateway's side (docs/cluster.md,
"Shared partitions"): a placed queue's partitions are its placement's pool partitions, bound
to the queue; receipts are accepted for a queue only from its placement or the placements of
the queues feeding it dead letters; the indexes that keep those questions O(sources).

The map and the records live in a real etcd; no node answers (nothing here calls one)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import msgpack
import pytest

from backend_store.cluster.client.metadata import ClusterMetadata
from backend_store.cluster.client.node_health import BreakerSettings, NodeHealth
from backend_store.cluster.client.partition_calls import PartitionCalls
from backend_store.cluster.client.partition_map import ClusterView, PartitionMap, bind_to_queue
from backend_store.cluster.client.queue_index import QueueIndex
from backend_store.cluster.client.queue_parts import QueueParts
from backend_store.cluster.client.routing import prefix_receipt
from backend_store.cluster.coordination import pools
from backend_store.cluster.coordination.etcd_coordinator import EtcdCoordinator
from backend_store.cluster.coordination.layout import Layout, LeaderRecord, PartitionRecord
from backend_store.errors import QueueNotFound, Unavailable
from backend_store.types import QueueName, TenantId
from tests.conftest import scaled
from tests.fixtures.etcd_server import unique_prefix

T = TenantId("acme")
OTHER = TenantId("other")
POOL = pools.pool_name(3, "sync")
SLOTS = (11, 12, 13, 14)  # the pool's partition ids by slot
LEGACY = 20  # a queue's own partition, made before pools


class World:
    """A gateway's metadata, map and parts over a real etcd prefix."""

    def __init__(self, coordinator: EtcdCoordinator, paths: Layout) -> None:
        self.coordinator = coordinator
        self.paths = paths
        self.metadata = ClusterMetadata(coordinator, paths, reread_every_s=60)
        self.view = ClusterView(coordinator, paths, reread_every_s=60)
        calls = PartitionCalls(
            self.view, self.metadata, NodeHealth(BreakerSettings()), deadline_s=1, node_timeout_s=1
        )
        self.parts = QueueParts(self.metadata, self.view, calls)

    async def start(self) -> None:
        for slot, pid in enumerate(SLOTS):
            record = PartitionRecord(pools.POOL_TENANT, POOL, slot, ("n1", "n2", "n3"), "n1")
            await self.coordinator.put(self.paths.partition(pid), record.pack())
            await self.coordinator.put(self.paths.leader(pid), LeaderRecord("n1", "127.0.0.1:1").pack())
        legacy = PartitionRecord(T, "old", 0, ("n1",), "n1")
        await self.coordinator.put(self.paths.partition(LEGACY), legacy.pack())
        await self.metadata.start()
        await self.view.start()

    async def close(self) -> None:
        await self.view.close()
        await self.metadata.close()

    async def queue(self, name: str, placement: tuple[int, ...] | None, **attributes: object) -> None:
        await self.metadata.create_queue(T, QueueName(name), attributes, placement=placement)


@pytest.fixture
async def world(etcd_endpoints: list[str]) -> AsyncIterator[World]:
    async with EtcdCoordinator(etcd_endpoints) as coordinator:
        w = World(coordinator, Layout(unique_prefix("placement") + "/"))
        await w.start()
        try:
            yield w
        finally:
            await w.close()


async def test_a_placed_queue_routes_to_its_pool_partitions_bound_to_it(world: World) -> None:
    await world.queue("jobs", (13, 11), partitions=2, replication_factor=3)
    record = world.metadata.cached_queue(T, QueueName("jobs"))
    assert record is not None and record.placement == (13, 11)
    parts = world.parts.parts(record)
    # Partition i is placement[i], carrying the queue's tenant, name, index and incarnation.
    assert [(p.id, p.tenant, p.queue, p.index) for p in parts] == [(13, T, "jobs", 0), (11, T, "jobs", 1)]
    assert all(p.placed and p.queue_revision == record.create_revision for p in parts)
    assert parts[0].leader is not None and parts[0].leader.node == "n1"
    # A new leader of the pool partition is found by its id, for the queue as bound.
    await world.coordinator.delete(world.paths.leader(13))
    await world.coordinator.put(world.paths.leader(13), LeaderRecord("n2", "127.0.0.1:2").pack())
    assert await world.view.wait_for(
        lambda m: (r := m.resolve(parts[0])) is not None and r.leader is not None and r.leader.node == "n2",
        scaled(5),
    )
    moved = world.view.map.resolve(parts[0])
    assert moved is not None and (moved.tenant, moved.queue, moved.index) == (T, "jobs", 0)


async def test_a_record_without_placement_keeps_its_own_partitions(world: World) -> None:
    # Written as today's code wrote it: no placement field (the upgrade in place).
    await world.queue("old", None)
    record = world.metadata.cached_queue(T, QueueName("old"))
    assert record is not None and record.placement is None
    legacy = world.view.map.partitions[LEGACY]
    assert legacy.pool is None
    # Its own partition serves it (queue_revision None on that record: any incarnation).
    assert [p.id for p in world.parts.parts(record)] == [LEGACY]
    assert not world.parts.parts(record)[0].placed


async def test_receipts_are_accepted_only_from_the_queues_placement(world: World) -> None:
    await world.queue("jobs", (12,))
    await world.queue("mail", (14,))
    receipt = prefix_receipt(12, "inner")
    found = world.parts.receipt_partition(T, receipt, QueueName("jobs"))
    assert found is not None
    part, inner = found
    assert (part.id, part.tenant, part.queue, inner) == (12, T, "jobs", "inner")
    # Another queue's partition, a partition nobody of this tenant is on, another tenant.
    assert world.parts.receipt_partition(T, receipt, QueueName("mail")) is None
    assert world.parts.receipt_partition(T, prefix_receipt(13, "x"), None) is None
    assert world.parts.receipt_partition(OTHER, receipt, None) is None
    assert world.parts.receipt_partition(OTHER, receipt, QueueName("jobs")) is None
    # Any queue of the tenant's (no queue named): bound to the tenant.
    anyq = world.parts.receipt_partition(T, receipt, None)
    assert anyq is not None and anyq[0].tenant == T and anyq[0].id == 12


async def test_dead_letters_are_found_in_the_placements_of_the_queues_feeding_them(world: World) -> None:
    await world.queue("dlq", (11,))
    await world.queue("a", (12,), max_receives=2, dead_letter_queue="dlq")
    await world.queue("b", (13, 14), partitions=2, max_receives=2, dead_letter_queue="dlq")
    await world.queue("c", (14,))
    # Feeding it from its own partition: that partition holds one copy, asked once.
    await world.queue("e", (11,), max_receives=2, dead_letter_queue="dlq")
    dlq = world.metadata.cached_queue(T, QueueName("dlq"))
    assert dlq is not None
    held = world.parts.holders(dlq)
    assert [(p.id, p.queue) for p in held] == [(11, "dlq"), (12, "a"), (13, "b"), (14, "b")]
    # A dead letter's receipt names the source's partition: good for the dead-letter queue.
    found = world.parts.receipt_partition(T, prefix_receipt(13, "r"), QueueName("dlq"))
    assert found is not None and found[0].queue == "b"
    assert world.parts.receipt_partition(T, prefix_receipt(12, "r"), QueueName("c")) is None
    # A source that stops feeding it no longer holds it; a former one until then is kept
    # (former_dead_letter_queues), as on partitions of their own.
    await world.metadata.update_queue(T, QueueName("a"), {"dead_letter_queue": None, "max_receives": None})
    dlq = world.metadata.cached_queue(T, QueueName("dlq"))
    assert dlq is not None
    assert {p.id for p in world.parts.holders(dlq)} == {11, 12, 13, 14}
    await world.metadata.delete_queue(T, QueueName("b"))
    assert {p.id for p in world.parts.holders(dlq)} == {11, 12}


async def test_a_record_marked_deleting_reads_as_absent(world: World) -> None:
    await world.queue("gone", (12,))
    record = world.metadata.cached_queue(T, QueueName("gone"))
    assert record is not None
    marked = await world.metadata.mark_deleting(record)
    assert marked is not None and marked.deleting
    assert world.metadata.cached_queue(T, QueueName("gone")) is None
    assert world.metadata.page(T) == []
    assert world.parts.receipt_partition(T, prefix_receipt(12, "r"), QueueName("gone")) is None
    # Creating it again returns the marked record: the caller finishes the deletion first.
    again, created = await world.metadata.create_queue(T, QueueName("gone"), {}, placement=(13,))
    assert not created and again.deleting
    # A mark made on a record that changed since is refused (compare-and-put).
    assert await world.metadata.mark_deleting(record) is None
    # The record goes only as of its mark, and is out of this gateway's copy on return.
    with pytest.raises(QueueNotFound):
        await world.metadata.delete_queue(T, QueueName("gone"), record.mod_revision)
    await world.metadata.delete_queue(T, QueueName("gone"), marked.mod_revision)
    assert world.metadata.cached_record(T, QueueName("gone")) is None
    assert list(world.metadata.index.names_after(T, "")) == []


async def test_listing_pages_by_name_from_the_watched_records(world: World) -> None:
    names = [f"q{i:03d}" for i in range(25)]
    for i, name in enumerate(names):
        await world.queue(name, (SLOTS[i % 4],))
    seen: list[str] = []
    after = ""
    while True:
        page = world.metadata.page(T, after=after, limit=10)
        seen.extend(r.name for r in page)
        if len(page) < 10:
            break
        after = page[-1].name
    assert seen == names
    assert [r.name for r in world.metadata.page(T, prefix="q01")] == [f"q01{i}" for i in range(10)]
    assert [r.name for r in world.metadata.page(T, after="q015", prefix="q01")] == [
        "q016",
        "q017",
        "q018",
        "q019",
    ]
    assert world.metadata.page(OTHER) == []


def record_doc(**fields: object) -> bytes:
    """A queue record's document as a gateway writes it (only the fields the index reads)."""
    packed: bytes = msgpack.packb(fields)
    return packed


def test_the_index_gives_sources_and_partitions_back_when_records_change() -> None:
    index = QueueIndex()
    feeding = record_doc(dead_letter_queue="dlq", placement=[3, 4])
    index.update(T, QueueName("src"), feeding)
    index.update(T, QueueName("dlq"), record_doc(placement=[4]))
    assert index.sources(T, QueueName("dlq")) == ["src"]
    assert index.on_partition(4) == [(T, "dlq"), (T, "src")]
    assert index.tenant_on_partition(T, 3) and not index.tenant_on_partition(OTHER, 3)
    index.update(T, QueueName("src"), record_doc(placement=[5]))
    assert index.sources(T, QueueName("dlq")) == []
    assert index.on_partition(3) == [] and index.on_partition(5) == [(T, "src")]
    index.update(T, QueueName("src"), None)
    assert index.on_partition(5) == []
    assert list(index.names_after(T, "")) == ["dlq"]
    index.update(T, QueueName("dlq"), None)
    assert list(index.names_after(T, "")) == []


def test_a_bound_partition_follows_its_id_in_a_new_map() -> None:
    bound = bind_to_queue(None, 7, T, QueueName("jobs"), 1, 42)
    assert bound.placed and bound.leader is None and bound.pool is None
    assert PartitionMap().resolve(bound) is None


async def test_a_placement_this_gateway_cannot_read_is_unavailable_not_a_crash(world: World) -> None:
    await world.queue("dlq", (11,))
    # As a newer version might write it: a placement whose ids do not read as numbers.
    doc = {"max_receives": 2, "dead_letter_queue": "dlq", "created_at": 1.0, pools.PLACEMENT: ["p-12"]}
    await world.coordinator.put(world.paths.queue(T, "odd"), record_doc(**doc))
    odd = await world.metadata.queue(T, QueueName("odd"))
    assert odd.placement == ()
    with pytest.raises(Unavailable):
        world.parts.parts(odd)
    # Its dead-letter queue is still served from the partitions it can reach.
    await world.metadata.queues.refresh()
    dlq = world.metadata.cached_queue(T, QueueName("dlq"))
    assert dlq is not None and [p.id for p in world.parts.holders(dlq)] == [11]
