"""Keeping contract tests apart on one shared cluster: what a test wrote is undone after it."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence

from backend_store import StoreOptions, TenantId
from backend_store.cluster.cluster_backend import ClusterBackend, open_cluster_backend
from backend_store.errors import QueueNotFound

from ..conftest import scaled


@contextlib.asynccontextmanager
async def isolated_cluster_test(store_url: str, tenants: Sequence[TenantId]) -> AsyncIterator[None]:
    """Around one test: snapshot the metadata values; afterwards delete the tenants' queues,
    wait until the manager dropped their partitions, and put the metadata back."""
    backend = open_cluster_backend(store_url, StoreOptions())
    await backend.start()
    try:
        before = await _meta(backend)
        yield
        for tenant in tenants:
            for record in await backend.metadata.list_queues(tenant):
                with contextlib.suppress(QueueNotFound):
                    await backend.metadata.delete_queue(tenant, record.name)
        gone = await backend.view.wait_for(
            lambda m: not any(p.tenant in tenants for p in m.partitions.values()), scaled(30)
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


async def _meta(backend: ClusterBackend) -> dict[str, bytes]:
    state = await backend.metadata.coordinator.read_prefix(backend.paths.meta)
    return {key: entry.value for key, entry in state.entries.items()}
