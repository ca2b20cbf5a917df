"""The gateway's metadata in a real etcd: values with the embedded store's semantics, queue
records, and the watch that tells every gateway of a change at once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from backend_store.cluster.client.metadata import ClusterMetadata
from backend_store.cluster.coordination.etcd_coordinator import EtcdCoordinator
from backend_store.cluster.coordination.layout import Layout
from backend_store.errors import InvalidRequest, QueueExists, QueueNotFound
from backend_store.types import QueueName, TenantId
from tests.conftest import scaled
from tests.fixtures.etcd_server import unique_prefix
from tests.fixtures.lagging_etcd import LaggingWatch

T = TenantId("acme")


@pytest.fixture
async def coordinator(etcd_endpoints: list[str]) -> AsyncIterator[EtcdCoordinator]:
    async with EtcdCoordinator(etcd_endpoints) as c:
        yield c


@pytest.fixture
def paths() -> Layout:
    return Layout(unique_prefix("meta") + "/")


@pytest.fixture
async def metadata(coordinator: EtcdCoordinator, paths: Layout) -> AsyncIterator[ClusterMetadata]:
    # A long re-read interval: whatever arrives quickly came through the watch.
    meta = ClusterMetadata(coordinator, paths, reread_every_s=60)
    await meta.start()
    try:
        yield meta
    finally:
        await meta.close()


async def test_values_behave_as_in_the_embedded_store(metadata: ClusterMetadata) -> None:
    assert await metadata.meta_get("api_keys", "k1") is None
    assert await metadata.meta_put("api_keys", "k1", b"one")
    assert await metadata.meta_get("api_keys", "k1") == b"one"
    assert not await metadata.meta_put("api_keys", "k1", b"other", only_if_absent=True)
    assert await metadata.meta_get("api_keys", "k1") == b"one"
    assert await metadata.meta_put("api_keys", "k1", b"two")
    assert await metadata.meta_put("api_keys", "k0", b"zero", only_if_absent=True)
    await metadata.meta_put("jwt_keys", "acme/a", b"ja")
    await metadata.meta_put("jwt_keys", "acme/b", b"jb")
    await metadata.meta_put("jwt_keys", "other/a", b"oa")
    assert await metadata.meta_list("api_keys") == [("k0", b"zero"), ("k1", b"two")]
    assert await metadata.meta_list("jwt_keys", "acme/") == [("acme/a", b"ja"), ("acme/b", b"jb")]
    assert await metadata.meta_list("empty") == []
    assert await metadata.meta_delete("api_keys", "k1")
    assert not await metadata.meta_delete("api_keys", "k1")
    assert await metadata.meta_get("api_keys", "k1") is None


@pytest.mark.parametrize(
    ("namespace", "key"), [("", "k"), ("a\0b", "k"), ("ns", "a\0"), ("a/b", "k"), ("ns", "x" * 400)]
)
async def test_bad_names_are_refused(metadata: ClusterMetadata, namespace: str, key: str) -> None:
    with pytest.raises(InvalidRequest):
        await metadata.meta_put(namespace, key, b"v")
    with pytest.raises(InvalidRequest):
        await metadata.meta_get(namespace, key)


async def test_queue_records(metadata: ClusterMetadata) -> None:
    created, fresh = await metadata.create_queue(
        T, QueueName("orders"), {"partitions": 4, "replication_factor": 3}
    )
    assert fresh and created.attributes.partitions == 4 and created.attributes.replication_factor == 3
    again, fresh = await metadata.create_queue(
        T, QueueName("orders"), {"replication_factor": 3, "partitions": 4}
    )
    assert not fresh and again.created_at == created.created_at
    with pytest.raises(QueueExists):
        await metadata.create_queue(T, QueueName("orders"), {"partitions": 2})
    with pytest.raises(InvalidRequest):
        await metadata.create_queue(T, QueueName("bad name"), {})
    with pytest.raises(InvalidRequest):
        await metadata.create_queue(T, QueueName("x"), {"partitions": 65})
    with pytest.raises(InvalidRequest):
        await metadata.create_queue(T, QueueName("x"), {"max_receives": 3, "dead_letter_queue": "missing"})
    with pytest.raises(InvalidRequest):
        await metadata.create_queue(T, QueueName("x"), {"max_receives": 3, "dead_letter_queue": "x"})
    await metadata.create_queue(T, QueueName("dlq"), {})
    await metadata.create_queue(T, QueueName("x"), {"max_receives": 3, "dead_letter_queue": "dlq"})
    updated = await metadata.update_queue(T, QueueName("orders"), {"visibility_timeout_s": 5})
    assert updated.attributes.visibility_timeout_s == 5 and updated.attributes.partitions == 4
    for immutable in ({"partitions": 2}, {"ordering": "fifo"}):
        with pytest.raises(InvalidRequest):
            await metadata.update_queue(T, QueueName("orders"), immutable)
    assert [r.name for r in metadata.page(T)] == ["dlq", "orders", "x"]
    assert metadata.page(TenantId("nobody")) == []
    await metadata.delete_queue(T, QueueName("orders"))
    with pytest.raises(QueueNotFound):
        await metadata.delete_queue(T, QueueName("orders"))
    with pytest.raises(QueueNotFound):
        await metadata.queue(T, QueueName("orders"))
    with pytest.raises(QueueNotFound):
        await metadata.update_queue(T, QueueName("orders"), {"delay_s": 1})
    # Our own changes are in the watched copy when the call returns (the router reads it).
    assert metadata.cached_queue(T, QueueName("orders")) is None
    cached = metadata.cached_queue(T, QueueName("x"))
    assert cached is not None and cached.attributes.dead_letter_queue == "dlq"


async def test_concurrent_updates_are_both_kept(
    metadata: ClusterMetadata, coordinator: EtcdCoordinator
) -> None:
    other = ClusterMetadata(coordinator, metadata.paths, reread_every_s=60)
    await metadata.create_queue(T, QueueName("q"), {})
    await asyncio.gather(
        metadata.update_queue(T, QueueName("q"), {"delay_s": 7}),
        other.update_queue(T, QueueName("q"), {"visibility_timeout_s": 9}),
        other.update_queue(T, QueueName("q"), {"receive_wait_s": 3}),
    )
    attrs = (await metadata.queue(T, QueueName("q"))).attributes
    assert (attrs.delay_s, attrs.visibility_timeout_s, attrs.receive_wait_s) == (7, 9, 3)


async def test_creates_read_their_own_writes_without_reading_the_prefix(
    etcd_endpoints: list[str], paths: Layout
) -> None:
    # Issue 49: a create put a state of its own in the watched copy; the watch's next state,
    # older than it, sent for a confirming read of all of queues/, and a newer one was
    # compared with it key by key. Now each create waits for the watch to bring its write.
    counted = LaggingWatch(etcd_endpoints, 0.05)
    async with counted:
        metadata = ClusterMetadata(counted, paths, reread_every_s=60)
        await metadata.start()
        try:
            await metadata.create_queue(T, QueueName("first"), {})
            reads = counted.prefix_reads
            names = [QueueName(f"q{i:02d}") for i in range(40)]

            async def create(name: QueueName) -> None:
                await metadata.create_queue(T, name, {})
                assert metadata.cached_queue(T, name) is not None  # read your writes

            await asyncio.gather(*(create(name) for name in names))
            await metadata.update_queue(T, names[0], {"delay_s": 3})
            updated = metadata.cached_queue(T, names[0])
            assert updated is not None and updated.attributes.delay_s == 3
            assert counted.prefix_reads == reads
            assert [r.name for r in metadata.page(T)] == ["first", *names]
        finally:
            await metadata.close()


async def test_another_gateways_changes_arrive_through_the_watch(
    metadata: ClusterMetadata, etcd_endpoints: list[str]
) -> None:
    seen_meta: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
    seen_queues: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
    metadata.add_meta_listener(lambda ns, key: seen_meta.put_nowait((ns, key)))
    metadata.add_queue_listener(lambda t, q: seen_queues.put_nowait((t, q)))
    async with EtcdCoordinator(etcd_endpoints) as c2:
        elsewhere = ClusterMetadata(c2, metadata.paths)
        await elsewhere.meta_put("api_keys", "k9", b"revoked")
        assert await asyncio.wait_for(seen_meta.get(), scaled(5)) == ("api_keys", "k9")
        await elsewhere.create_queue(T, QueueName("jobs"), {})
        assert await asyncio.wait_for(seen_queues.get(), scaled(5)) == (T, "jobs")
        # Listeners run once the watched copy holds the new state.
        assert metadata.cached_queue(T, QueueName("jobs")) is not None
        await elsewhere.update_queue(T, QueueName("jobs"), {"delay_s": 2})
        assert await asyncio.wait_for(seen_queues.get(), scaled(5)) == (T, "jobs")
        # The decoded copy requests route by is the new one, not the one decoded before.
        updated = metadata.cached_queue(T, QueueName("jobs"))
        assert updated is not None and updated.attributes.delay_s == 2
        await elsewhere.meta_delete("api_keys", "k9")
        assert await asyncio.wait_for(seen_meta.get(), scaled(5)) == ("api_keys", "k9")
        await elsewhere.delete_queue(T, QueueName("jobs"))
        assert await asyncio.wait_for(seen_queues.get(), scaled(5)) == (T, "jobs")
        assert metadata.cached_queue(T, QueueName("jobs")) is None


async def test_a_queue_remembers_the_dead_letter_queues_it_fed_while_they_last(
    metadata: ClusterMetadata,
) -> None:
    """A queue that changes its dead-letter queue keeps the old one's dead letters in its
    partitions: its record names that queue (and which incarnation) until it is deleted."""
    for name in ("old", "new"):
        await metadata.create_queue(T, QueueName(name), {})
    await metadata.create_queue(T, QueueName("src"), {"max_receives": 1, "dead_letter_queue": "old"})
    old = await metadata.queue(T, QueueName("old"))
    src = await metadata.update_queue(T, QueueName("src"), {"dead_letter_queue": "new"})
    assert src.former_dead_letter_queues == ((QueueName("old"), old.create_revision),)
    assert src.holds_dead_letters_of(old) and src.holds_dead_letters_of(
        await metadata.queue(T, QueueName("new"))
    )
    # Back to the old one: it is current again, not former.
    src = await metadata.update_queue(T, QueueName("src"), {"dead_letter_queue": "old"})
    assert src.former_dead_letter_queues == (
        (QueueName("new"), (await metadata.queue(T, QueueName("new"))).create_revision),
    )
    src = await metadata.update_queue(T, QueueName("src"), {"dead_letter_queue": None, "max_receives": None})
    assert {name for name, _ in src.former_dead_letter_queues} == {"old", "new"}
    # Deleted and made again under the name: another queue, which holds nothing here.
    await metadata.delete_queue(T, QueueName("old"))
    again, _ = await metadata.create_queue(T, QueueName("old"), {})
    assert not src.holds_dead_letters_of(again)
    src = await metadata.update_queue(T, QueueName("src"), {"visibility_timeout_s": 5})
    assert [name for name, _ in src.former_dead_letter_queues] == ["new"]  # the gone one forgotten


async def test_a_deletion_tells_the_watchs_listeners_of_the_deleted_record_alone(
    metadata: ClusterMetadata, paths: Layout
) -> None:
    # A placed queue is marked, then deleted on that mark: the watched copy drops the record
    # at once and names it alone, where a state naming nothing was compared key by key (10
    # ms of the gateway's loop a deletion at 10,000 queues).
    for name in ("a", "b", "c"):
        await metadata.create_queue(T, QueueName(name), {}, placement=(1,))
    record = await metadata.record(T, QueueName("b"))
    assert record is not None
    marked = await metadata.mark_deleting(record)
    assert marked is not None
    heard: list[set[str]] = []
    metadata.queues.add_listener(lambda _state, keys: heard.append(keys))
    await metadata.delete_queue(T, QueueName("b"), marked.mod_revision)
    key = paths.queue(T, QueueName("b"))
    assert heard[0] == {key} and metadata.queues.get(key[len(paths.queues) :]) is None
    assert await metadata.record(T, QueueName("a")) is not None
