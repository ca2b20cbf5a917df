"""Queue records created together (backend_store/cluster/client/record_creates.py), on a
real etcd: the creates of the moment share one transaction and read nothing back, and a
batch holding a key that exists still gives every create the answer it gets alone."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import pytest

from backend_store.cluster.client.metadata import ClusterMetadata
from backend_store.cluster.coordination.coordinator import Entry
from backend_store.cluster.coordination.etcd_coordinator import EtcdCoordinator
from backend_store.cluster.coordination.layout import Layout
from backend_store.errors import QueueExists
from backend_store.types import QueueName, TenantId
from tests.fixtures.etcd_server import unique_prefix

T = TenantId("acme")


class CountedEtcd(EtcdCoordinator):
    """etcd counting the round trips a create can make: writes (a transaction each) and
    reads of one key."""

    writes = 0
    key_reads = 0

    async def create_many(self, items: Mapping[str, bytes]) -> tuple[int, frozenset[str]]:
        self.writes += 1
        return await super().create_many(items)

    async def compare_and_put(self, key: str, value: bytes, mod_revision: int) -> bool:
        self.writes += 1
        return await super().compare_and_put(key, value, mod_revision)

    async def get(self, key: str) -> Entry | None:
        self.key_reads += 1
        return await super().get(key)


@pytest.fixture
def paths() -> Layout:
    return Layout(unique_prefix("creates") + "/")


async def test_creates_of_the_moment_share_one_transaction_and_read_nothing_back(
    etcd_endpoints: list[str], paths: Layout
) -> None:
    # Issue 49: each create was its own transaction and then a read of its key for the
    # revisions, two round trips per queue (15 creates a second at 10,000 queues).
    etcd = CountedEtcd(etcd_endpoints)
    async with etcd:
        metadata = ClusterMetadata(etcd, paths, reread_every_s=60)
        await metadata.start()
        try:
            names = [QueueName(f"inbox-{i:02d}") for i in range(40)]
            results = await asyncio.gather(*(metadata.create_queue(T, n, {}) for n in names))
            assert (etcd.writes, etcd.key_reads) == (1, 0)
            assert all(created for _, created in results)
            for record, _ in results:
                # Read your writes, and the revisions etcd gave the record.
                assert metadata.cached_queue(T, record.name) == record
                stored = await etcd.get(paths.queue(T, record.name))
                assert stored is not None
                assert (record.create_revision, record.mod_revision) == (
                    stored.create_revision,
                    stored.mod_revision,
                )
            assert [r.name for r in metadata.page(T)] == names
        finally:
            await metadata.close()


async def test_a_batch_holding_an_existing_key_answers_each_create_as_alone(
    etcd_endpoints: list[str], paths: Layout
) -> None:
    async with EtcdCoordinator(etcd_endpoints) as etcd:
        metadata = ClusterMetadata(etcd, paths, reread_every_s=60)
        await metadata.start()
        try:
            same, _ = await metadata.create_queue(T, QueueName("same"), {"delay_s": 1})
            await metadata.create_queue(T, QueueName("clash"), {"delay_s": 2})
            results = await asyncio.gather(
                metadata.create_queue(T, QueueName("new-1"), {}),
                metadata.create_queue(T, QueueName("same"), {"delay_s": 1}),
                metadata.create_queue(T, QueueName("clash"), {"delay_s": 3}),
                metadata.create_queue(T, QueueName("twin"), {}),
                metadata.create_queue(T, QueueName("twin"), {}),
                metadata.create_queue(T, QueueName("new-2"), {}),
                return_exceptions=True,
            )
            new_1, again, clash, twin_a, twin_b, new_2 = results
            assert isinstance(new_1, tuple) and new_1[1] and isinstance(new_2, tuple) and new_2[1]
            assert again == (same, False)
            assert isinstance(clash, QueueExists)
            assert isinstance(twin_a, tuple) and isinstance(twin_b, tuple)
            assert sorted([twin_a[1], twin_b[1]]) == [False, True]  # one made it, one found it
            assert twin_a[0].create_revision == twin_b[0].create_revision
            assert [r.name for r in metadata.page(T)] == ["clash", "new-1", "new-2", "same", "twin"]
            clashed = metadata.cached_queue(T, QueueName("clash"))
            assert clashed is not None and clashed.attributes.delay_s == 2
        finally:
            await metadata.close()
