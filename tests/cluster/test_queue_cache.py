"""The gateway's queue cache on ``cluster://`` asks no node on a miss (issue 25): the
attributes a hot request reads (a long-poll's wait, a send's dedupe window) are in the queue
record the gateway's metadata watch already holds, whereas ``get_queue`` asks every partition
of the queue for its stats. Real etcd, three real ``pushgate node`` processes and a manager;
the gateway's ``ClusterBackend`` and ``QueueCache`` in the test.

The proof is a cluster that cannot answer: every node frozen with SIGSTOP. A cache miss is
still answered, from the watch, while a ``get_queue`` begun at the same moment waits for the
nodes; it completes once they are thawed."""

from __future__ import annotations

import asyncio
import signal

from backend_store import StoreOptions
from backend_store.cluster.client.cluster_backend import open_cluster_backend
from backend_store.errors import QueueNotFound
from backend_store.types import QueueName, TenantId
from gateway.queue_cache import QueueCache
from tests.conftest import scaled

from .processes import ClusterHarness

TENANT, QUEUE = TenantId("acme"), QueueName("cached")


async def test_a_cache_miss_is_answered_from_the_watch_with_every_node_frozen(
    harness: ClusterHarness,
) -> None:
    # A request deadline far past the test: a stats read waits for the frozen nodes, not for it.
    deadline = scaled(120)
    url = f"cluster://{','.join(harness.endpoints)}{harness.prefix}?request_deadline_s={deadline}"
    backend = open_cluster_backend(url, StoreOptions())
    await backend.start()
    frozen: list[str] = []
    try:
        assert await backend.view.wait_for(lambda m: len(m.nodes) == 3, scaled(30)), "nodes did not register"
        created, _ = await backend.create_queue(TENANT, QUEUE, {"partitions": 2, "receive_wait_s": 7})

        async def watched() -> bool:
            return backend.watched_queue(TENANT, QUEUE) is not None

        await harness.wait_for("the watch shows the queue", watched)
        cache = QueueCache(backend)
        for name in harness.nodes:
            harness.nodes[name].signal(signal.SIGSTOP)
            frozen.append(name)
        stats = asyncio.ensure_future(backend.get_queue(TENANT, QUEUE))
        # No await inside when the watch holds the record; the bound is reached only by a
        # miss that asks the nodes (it would wait for them until the request deadline).
        async with asyncio.timeout(scaled(10)):
            info = await cache.get(TENANT, QUEUE)
        assert (info.tenant, info.name, info.created_at) == (TENANT, QUEUE, created.created_at)
        assert info.attributes.receive_wait_s == 7 and info.attributes.partitions == 2
        assert not stats.done(), "the stats read answered with every node frozen"
        # A queue the watch does not hold is still refused (by etcd, which is not frozen).
        async with asyncio.timeout(scaled(10)):
            try:
                await cache.get(TENANT, QueueName("never-created"))
                raise AssertionError("a queue that does not exist was found")
            except QueueNotFound:
                pass
        for name in frozen:
            harness.nodes[name].signal(signal.SIGCONT)
        frozen.clear()
        async with asyncio.timeout(scaled(60)):
            full = await stats
        assert full.attributes == info.attributes and full.created_at == info.created_at
    finally:
        for name in frozen:
            harness.nodes[name].signal(signal.SIGCONT)
        await backend.close()
