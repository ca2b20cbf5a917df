"""``LmdbBackend.queue_attributes``: many queues' attributes in one read (a pool partition's
new term checks every queue it holds with it: docs/cluster.md, "Shared partitions")."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from backend_store.lmdb_store.engine import LmdbBackend
from backend_store.types import QueueAttributes

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


async def test_queues_sharing_attributes_and_queues_that_differ_each_read_as_their_own(
    store: LmdbBackend,
) -> None:
    # The read parses each distinct set of attributes once (most queues share one): a queue
    # whose set differs in one value, or only in its type, is not given another's.
    for i in range(6):
        await store.create_queue(T1, q(f"plain-{i}"), {})
        await store.create_queue(T1, q(f"slow-{i}"), {"visibility_timeout_s": 30.5 + i % 2})
    await store.create_queue(T1, q("float"), {"visibility_timeout_s": 30.0})
    keys = [(T1, f"{kind}-{i}") for i in range(6) for kind in ("plain", "slow")] + [(T1, "float")]

    held = await store.queue_attributes(keys)

    for key in keys:
        assert held[key] == (await store.get_queue(T1, q(key[1]))).attributes
    assert {held[(T1, f"slow-{i}")].visibility_timeout_s for i in range(6)} == {30.5, 31.5}  # type: ignore[union-attr]
    assert type(held[(T1, "float")].visibility_timeout_s) is type(  # type: ignore[union-attr]
        (await store.get_queue(T1, q("float"))).attributes.visibility_timeout_s
    )


async def test_a_queue_holding_the_likely_attributes_is_answered_with_them_and_another_with_its_own(
    store: LmdbBackend,
) -> None:
    # A pool term's new leader passes each queue's attributes by its etcd record: a queue
    # that holds them is answered with that object (its record not decoded); one that holds
    # others (an update the old leader never applied) is answered with what it holds.
    await store.create_queue(T1, q("as-recorded"), {"visibility_timeout_s": 7})
    await store.create_queue(T1, q("behind"), {"visibility_timeout_s": 7})
    await store.update_queue(T1, q("behind"), {"retention_s": 3600})
    recorded = (await store.get_queue(T1, q("as-recorded"))).attributes
    likely: dict[tuple[str, str], QueueAttributes] = {(T1, "as-recorded"): recorded, (T1, "behind"): recorded}
    likely[(T1, "never")] = recorded

    held = await store.queue_attributes(list(likely), likely)

    assert held[(T1, "as-recorded")] is recorded
    behind = held[(T1, "behind")]
    assert behind is not recorded and behind == (await store.get_queue(T1, q("behind"))).attributes
    assert behind is not None and behind.retention_s == 3600
    assert held[(T1, "never")] is None
