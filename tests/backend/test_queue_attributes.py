"""``LmdbBackend.queue_attributes``: many queues' attributes in one read (a pool partition's
new term checks every queue it holds with it: docs/cluster.md, "Shared partitions")."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from backend_store.lmdb_store.engine import LmdbBackend

from ..conftest import ManualClock
from .harness import T1, T2, StoreFactory, lmdb_url, q


@pytest.fixture
async def store(tmp_path: Path, clock: ManualClock) -> AsyncIterator[LmdbBackend]:
    factory = StoreFactory(kind="lmdb", url=lmdb_url(tmp_path), clock=clock)
    try:
        opened = await factory.open()
        assert isinstance(opened, LmdbBackend)
        yield opened
    finally:
        await factory.close_all()


async def test_each_queue_as_get_queue_reads_it_and_none_for_a_queue_not_held(store: LmdbBackend) -> None:
    await store.create_queue(T1, q("inbox"), {"visibility_timeout_s": 7})
    await store.create_queue(T2, q("inbox"), {})  # same name, another tenant
    await store.create_queue(T1, q("gone"), {})
    await store.update_queue(T1, q("inbox"), {"retention_s": 3600})
    await store.delete_queue(T1, q("gone"))
    keys = [(T1, "inbox"), (T2, "inbox"), (T1, "gone"), (T2, "never")]

    held = await store.queue_attributes(keys)

    assert list(held) == keys
    inbox = held[(T1, "inbox")]
    assert inbox is not None and (inbox.visibility_timeout_s, inbox.retention_s) == (7, 3600)
    assert inbox == (await store.get_queue(T1, q("inbox"))).attributes
    assert held[(T2, "inbox")] == (await store.get_queue(T2, q("inbox"))).attributes
    assert held[(T1, "gone")] is None and held[(T2, "never")] is None
    assert await store.queue_attributes([]) == {}
