"""Keeping contract tests apart on one shared cluster: what a test wrote is undone after it."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from backend_store import StoreOptions
from backend_store.cluster.client.cluster_backend import ClusterBackend, open_cluster_backend
from backend_store.errors import QueueNotFound

from ..conftest import scaled


@contextlib.asynccontextmanager
async def isolated_cluster_test(store_url: str) -> AsyncIterator[None]:
    """Around one test: snapshot the queue records and metadata values; afterwards delete
    every queue the test created (whatever its tenant; as a gateway does, so that the pool
    partitions holding it delete it from their stores), wait until the manager dropped the
    partitions of those made before pools, and put the metadata back."""
    backend = open_cluster_backend(store_url, StoreOptions())
    await backend.start()
    try:
        queues_before = await _queues(backend)
        before = await _meta(backend)
        yield
        after_queues = await _queues(backend)
        for key, revision in after_queues.items():
            split = backend.paths.split_queue_key(key)
            if split is not None and queues_before.get(key) != revision:
                with contextlib.suppress(QueueNotFound):
                    await backend.delete_queue(*split)
        # Own partitions of every queue the test made are gone (those it deleted itself too);
        # pool partitions stay (they are never deleted).
        kept = set(queues_before.values())
        gone = await backend.view.wait_for(
            lambda m: all(p.queue_revision in kept for p in m.partitions.values() if p.pool is None),
            scaled(30),
        )
        assert gone, "the manager did not drop the test's partitions"
        after = await _meta(backend)
        coordinator = backend.metadata.coordinator
        for key in after.keys() - before.keys():
            await coordinator.delete(key)
        for key, value in before.items():
            if after.get(key) != value:
                await coordinator.put(key, value)
    finally:
        await backend.close()


async def _queues(backend: ClusterBackend) -> dict[str, int]:
    """Each queue record's key and create_revision (a queue made again is another queue)."""
    state = await backend.metadata.coordinator.read_prefix(backend.paths.queues)
    return {key: entry.create_revision for key, entry in state.entries.items()}


async def _meta(backend: ClusterBackend) -> dict[str, bytes]:
    state = await backend.metadata.coordinator.read_prefix(backend.paths.meta)
    return {key: entry.value for key, entry in state.entries.items()}
