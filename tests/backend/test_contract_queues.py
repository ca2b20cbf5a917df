"""The Backend contract: Queues (create, get, list, update, delete, purge, attribute bounds) and metadata.

Run against every backend kind (see conftest.py). Semantics follow docs/api.md and, where it is
silent, Amazon SQS. Time-based behaviour moves the injected ManualClock; nothing sleeps.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from backend_store import Backend, QueueAttributes, TenantId
from backend_store.errors import InvalidRequest, QueueExists, QueueFull, QueueNotFound

from ..conftest import ManualClock
from .harness import T1, T2, msg, q, receive_all, send_one

# ---------------------------------------------------------------------------
# Queues
# ---------------------------------------------------------------------------


async def test_create_queue_reports_created_then_is_idempotent(store: Backend, clock: ManualClock) -> None:
    info, created = await store.create_queue(T1, q("orders"), {"visibility_timeout_s": 5})
    assert created is True
    assert info.name == "orders"
    assert info.tenant == T1
    assert info.created_at == clock.now
    assert info.attributes == QueueAttributes(visibility_timeout_s=5)

    clock.advance(10)
    again, created = await store.create_queue(T1, q("orders"), {"visibility_timeout_s": 5})
    assert created is False
    assert again.attributes == info.attributes
    # The original creation time stands: nothing was recreated.
    assert again.created_at == info.created_at


async def test_create_queue_compares_resolved_attributes(store: Backend) -> None:
    # Spelling out a default is the same queue as leaving it out.
    await store.create_queue(T1, q("orders"), {})
    _, created = await store.create_queue(T1, q("orders"), {"visibility_timeout_s": 30})
    assert created is False


async def test_create_queue_with_different_attributes_conflicts(store: Backend) -> None:
    await store.create_queue(T1, q("orders"), {"visibility_timeout_s": 5})
    with pytest.raises(QueueExists):
        await store.create_queue(T1, q("orders"), {"visibility_timeout_s": 6})
    with pytest.raises(QueueExists):
        await store.create_queue(T1, q("orders"), {})
    info = await store.get_queue(T1, q("orders"))
    assert info.attributes.visibility_timeout_s == 5


@pytest.mark.parametrize(
    "name",
    [
        "",
        "a" * 81,
        "has space",
        "dot.name",
        ".fifo",
        "twice.fifo.fifo",
        "upper.FIFO",
        "a" * 76 + ".fifo",
        "slash/x",
        "ünïcode",
        "trailing\n",
        "trailing.fifo\n",
    ],
)
async def test_create_queue_rejects_bad_names(store: Backend, name: str) -> None:
    with pytest.raises(InvalidRequest):
        await store.create_queue(T1, q(name), {})


async def test_create_queue_accepts_name_edges(store: Backend) -> None:
    # A name may end in ".fifo" as SQS names FIFO queues (80 characters in all).
    for name in ("a", "A" * 80, "with_under-dash09", "jobs.fifo", "B" * 75 + ".fifo"):
        _, created = await store.create_queue(T1, q(name), {})
        assert created


# Attribute values just outside docs/api.md's bounds, and other malformed values.
BAD_ATTRIBUTES: list[dict[str, Any]] = [
    {"max_message_bytes": 0},
    {"max_message_bytes": 1048577},
    {"max_message_bytes": 1.5},
    {"max_messages": 0},
    {"max_messages": 10**9 + 1},
    {"visibility_timeout_s": -1},
    {"visibility_timeout_s": 43201},
    {"visibility_timeout_s": float("nan")},
    {"visibility_timeout_s": "30"},
    {"visibility_timeout_s": True},
    {"retention_s": 59},
    {"retention_s": 1209601},
    {"delay_s": 901},
    {"delay_s": -0.5},
    {"receive_wait_s": 21},
    {"max_receives": 0, "dead_letter_queue": "dlq"},
    {"max_receives": 1001, "dead_letter_queue": "dlq"},
    {"max_receives": 3},
    {"dead_letter_queue": "dlq"},
    {"ordering": "lifo"},
    {"dedupe_window_s": 86401},
    {"content_dedupe": "yes"},
    {"content_dedupe": 1},
    {"replication_mode": "eventually"},
    {"replication_factor": 0},
    {"no_such_attribute": 1},
]


@pytest.mark.parametrize("attributes", BAD_ATTRIBUTES, ids=repr)
async def test_create_queue_rejects_out_of_bound_attributes(
    store: Backend, attributes: dict[str, Any]
) -> None:
    await store.create_queue(T1, q("dlq"), {})
    with pytest.raises(InvalidRequest):
        await store.create_queue(T1, q("orders"), attributes)
    with pytest.raises(QueueNotFound):
        await store.get_queue(T1, q("orders"))


GOOD_EDGES: list[dict[str, Any]] = [
    {"max_message_bytes": 1},
    {"max_message_bytes": 1048576},
    {"max_messages": 1},
    {"max_messages": 10**9},
    {"max_messages": None},
    {"visibility_timeout_s": 0},
    {"visibility_timeout_s": 43200},
    {"retention_s": 60},
    {"retention_s": 1209600},
    {"delay_s": 900},
    {"receive_wait_s": 20},
    {"max_receives": 1, "dead_letter_queue": "dlq"},
    {"max_receives": 1000, "dead_letter_queue": "dlq"},
    {"ordering": "fifo"},
    {"dedupe_window_s": 0},
    {"dedupe_window_s": 86400},
    {"content_dedupe": True},
    {"replication_mode": "async"},
]


@pytest.mark.parametrize("attributes", GOOD_EDGES, ids=repr)
async def test_create_queue_accepts_bound_edges(store: Backend, attributes: dict[str, Any]) -> None:
    await store.create_queue(T1, q("dlq"), {})
    info, created = await store.create_queue(T1, q("orders"), attributes)
    assert created
    for name, value in attributes.items():
        assert getattr(info.attributes, name) == value


async def test_dead_letter_queue_must_exist_in_the_same_tenant(store: Backend) -> None:
    attrs = {"max_receives": 2, "dead_letter_queue": "dlq"}
    with pytest.raises(InvalidRequest):
        await store.create_queue(T1, q("orders"), attrs)
    # A queue of that name in another tenant does not count.
    await store.create_queue(T2, q("dlq"), {})
    with pytest.raises(InvalidRequest):
        await store.create_queue(T1, q("orders"), attrs)
    await store.create_queue(T1, q("dlq"), {})
    _, created = await store.create_queue(T1, q("orders"), attrs)
    assert created


async def test_get_and_list_are_per_tenant(store: Backend) -> None:
    for name in ("zeta", "alpha", "mid"):
        await store.create_queue(T1, q(name), {})
    await store.create_queue(T2, q("alpha"), {"visibility_timeout_s": 7})
    await store.create_queue(T2, q("other"), {})

    assert [i.name for i in await store.list_queues(T1)] == ["alpha", "mid", "zeta"]
    assert [i.name for i in await store.list_queues(T2)] == ["alpha", "other"]
    assert await store.list_queues(TenantId("nobody")) == []

    with pytest.raises(QueueNotFound):
        await store.get_queue(T2, q("zeta"))
    # Same name, different tenants: different queues.
    assert (await store.get_queue(T1, q("alpha"))).attributes.visibility_timeout_s == 30
    assert (await store.get_queue(T2, q("alpha"))).attributes.visibility_timeout_s == 7


async def test_list_queues_pages_by_name_with_counts(store: Backend) -> None:
    names = ["a1", "a2", "b1", "b2", "b3", "c1"]
    for name in names:
        await store.create_queue(T1, q(name), {})
    await store.create_queue(T2, q("b0"), {})
    await send_one(store, T1, "b2", "x")
    # Page after page, each read from where the last ended (GET /v1/queues' cursor).
    pages: list[list[str]] = []
    after = ""
    while True:
        page = await store.list_queues(T1, after=after, limit=4)
        pages.append([i.name for i in page])
        if len(page) < 4:
            break
        after = page[-1].name
    assert pages == [["a1", "a2", "b1", "b2"], ["b3", "c1"]]
    # A name prefix (SQS ListQueues' QueueNamePrefix), alone or with a cursor.
    assert [i.name for i in await store.list_queues(T1, prefix="b")] == ["b1", "b2", "b3"]
    assert [i.name for i in await store.list_queues(T1, after="b1", prefix="b", limit=1)] == ["b2"]
    assert [i.name for i in await store.list_queues(T1, after="a", prefix="b")] == ["b1", "b2", "b3"]
    assert await store.list_queues(T1, after="c1") == []
    # Each queue of a page carries its own counts.
    counts = {i.name: i.stats.visible for i in await store.list_queues(T1, after="b1", limit=2)}
    assert counts == {"b2": 1, "b3": 0}


async def test_a_listing_counts_each_queue_apart_from_its_neighbours(
    store: Backend, clock: ManualClock
) -> None:
    """One read counts every queue of a page or a partition (a pool leader's counts): each
    queue's in-flight, delayed and oldest message are its own, whatever the queues beside it
    in name and storage order hold."""
    for name in ["a", "b", "c", "d"]:
        await store.create_queue(T1, q(name), {})
    await store.send(T1, q("a"), [msg("a1"), msg("a2"), msg("a-later", delay_s=100)])
    [_] = await store.receive(T1, q("a"), 1, visibility_timeout_s=60)
    clock.advance(2)
    await send_one(store, T1, "c", "c-later", delay_s=100)
    clock.advance(1)
    await store.send(T1, q("d"), [msg("d1"), msg("d2")])
    assert len(await receive_all(store, T1, "d")) == 2
    clock.advance(2)
    expected = {
        "a": (1, 1, 1, 5.0),
        "b": (0, 0, 0, None),
        "c": (0, 0, 1, 3.0),
        "d": (0, 2, 0, 2.0),
    }
    listed = {i.name: i.stats for i in await store.list_queues(T1)}
    alone = {name: (await store.get_queue(T1, q(name))).stats for name in expected}
    assert listed == alone
    got = {
        name: (
            s.visible,
            s.in_flight,
            s.delayed,
            None if s.oldest_age_s is None else round(s.oldest_age_s, 3),
        )
        for name, s in listed.items()
    }
    assert got == expected


async def test_same_queue_name_in_two_tenants_keeps_messages_apart(store: Backend) -> None:
    await store.create_queue(T1, q("orders"), {})
    await store.create_queue(T2, q("orders"), {})
    await send_one(store, T1, "orders", "for one")
    assert await store.receive(T2, q("orders"), 10) == []
    [got] = await store.receive(T1, q("orders"), 10)
    assert got.body == b"for one"
    # Another tenant's receipt is as good as garbage.
    result = await store.ack(T2, [got.receipt])
    assert result.acked == 0
    assert [(f.receipt, f.code) for f in result.failed] == [(got.receipt, "invalid_receipt")]
    assert (await store.get_queue(T1, q("orders"))).stats.in_flight == 1


async def test_a_tenant_id_cannot_reach_into_another_tenants_queues(store: Backend) -> None:
    # Tenant ids come from auth (API keys, JWT claims), not from this store. Whatever they
    # hold, "a" must not see the queues of "a\0b" (keys built as tenant NUL name would).
    sneaky = TenantId("a\0b")
    try:
        await store.create_queue(sneaky, q("q"), {})
    except InvalidRequest:
        return  # refusing such tenant ids outright is fine
    assert await store.list_queues(TenantId("a")) == []
    for name in ("b\0q", "b"):
        with pytest.raises((QueueNotFound, InvalidRequest)):
            await store.get_queue(TenantId("a"), q(name))
    assert [i.name for i in await store.list_queues(sneaky)] == ["q"]


@pytest.mark.parametrize("name", ["b\0q", "", "x" * 81, "a/b"])
async def test_every_queue_call_validates_the_name(store: Backend, name: str) -> None:
    with pytest.raises((InvalidRequest, QueueNotFound)):
        await store.get_queue(T1, q(name))
    with pytest.raises((InvalidRequest, QueueNotFound)):
        await store.send(T1, q(name), [msg("x")])
    with pytest.raises((InvalidRequest, QueueNotFound)):
        await store.receive(T1, q(name), 1)


async def test_get_queue_missing_raises(store: Backend) -> None:
    with pytest.raises(QueueNotFound):
        await store.get_queue(T1, q("nope"))


async def test_update_queue_changes_mutable_attributes(store: Backend) -> None:
    await store.create_queue(T1, q("orders"), {"visibility_timeout_s": 5, "delay_s": 1})
    info = await store.update_queue(T1, q("orders"), {"visibility_timeout_s": 60})
    assert info.attributes.visibility_timeout_s == 60
    assert info.attributes.delay_s == 1  # left out: kept
    assert (await store.get_queue(T1, q("orders"))).attributes.visibility_timeout_s == 60
    # Re-creating with the old attributes now conflicts; with the new ones it does not.
    with pytest.raises(QueueExists):
        await store.create_queue(T1, q("orders"), {"visibility_timeout_s": 5, "delay_s": 1})
    _, created = await store.create_queue(T1, q("orders"), {"visibility_timeout_s": 60, "delay_s": 1})
    assert created is False


async def test_update_queue_keeps_ordering_immutable(store: Backend) -> None:
    await store.create_queue(T1, q("orders"), {"ordering": "fifo"})
    with pytest.raises(InvalidRequest):
        await store.update_queue(T1, q("orders"), {"ordering": "best_effort"})
    # Naming the current value is not a change.
    info = await store.update_queue(T1, q("orders"), {"ordering": "fifo", "delay_s": 2})
    assert info.attributes.ordering == "fifo"
    assert info.attributes.delay_s == 2


async def test_update_queue_validates(store: Backend) -> None:
    await store.create_queue(T1, q("orders"), {})
    with pytest.raises(InvalidRequest):
        await store.update_queue(T1, q("orders"), {"visibility_timeout_s": 43201})
    with pytest.raises(InvalidRequest):
        await store.update_queue(T1, q("orders"), {"bogus": 1})
    with pytest.raises(InvalidRequest):
        await store.update_queue(T1, q("orders"), {"max_receives": 3, "dead_letter_queue": "missing"})
    with pytest.raises(QueueNotFound):
        await store.update_queue(T1, q("missing"), {"delay_s": 1})
    with pytest.raises(QueueNotFound):
        await store.update_queue(T2, q("orders"), {"delay_s": 1})
    assert (await store.get_queue(T1, q("orders"))).attributes == QueueAttributes()


async def test_delete_queue_removes_it_and_its_messages(store: Backend) -> None:
    await store.create_queue(T1, q("orders"), {})
    await store.create_queue(T1, q("keep"), {})
    await send_one(store, T1, "orders", "a")
    await send_one(store, T1, "orders", "b")
    [held] = await store.receive(T1, q("orders"), 1)

    await store.delete_queue(T1, q("orders"))
    assert [i.name for i in await store.list_queues(T1)] == ["keep"]
    with pytest.raises(QueueNotFound):
        await store.get_queue(T1, q("orders"))
    with pytest.raises(QueueNotFound):
        await store.send(T1, q("orders"), [msg("c")])
    result = await store.ack(T1, [held.receipt])
    assert result.acked == 0 and len(result.failed) == 1

    # A new queue of the same name starts empty.
    await store.create_queue(T1, q("orders"), {})
    assert await store.receive(T1, q("orders"), 10) == []
    assert (await store.get_queue(T1, q("orders"))).stats.visible == 0


async def test_old_receipts_do_not_work_on_a_recreated_queue(store: Backend) -> None:
    await store.create_queue(T1, q("orders"), {})
    await send_one(store, T1, "orders", "old")
    [old] = await store.receive(T1, q("orders"), 1)
    await store.delete_queue(T1, q("orders"))
    await store.create_queue(T1, q("orders"), {})
    await send_one(store, T1, "orders", "new")
    [new] = await store.receive(T1, q("orders"), 1)
    # Same name, maybe the same seq: the old receipt must not touch the new message.
    assert (await store.ack(T1, [old.receipt])).acked == 0
    assert (await store.nack(T1, [old.receipt])).acked == 0
    assert await store.receive(T1, q("orders"), 1) == []
    assert (await store.ack(T1, [new.receipt])).acked == 1


async def test_updated_visibility_applies_to_later_receives(store: Backend, clock: ManualClock) -> None:
    await store.create_queue(T1, q("orders"), {"visibility_timeout_s": 30})
    await store.send(T1, q("orders"), [msg("a"), msg("b")])
    [a] = await store.receive(T1, q("orders"), 1)
    await store.update_queue(T1, q("orders"), {"visibility_timeout_s": 5})
    [b] = await store.receive(T1, q("orders"), 1)
    assert (a.visible_at, b.visible_at) == (clock.now + 30, clock.now + 5)


async def test_lowering_max_messages_keeps_what_is_stored(store: Backend) -> None:
    await store.create_queue(T1, q("orders"), {})
    await store.send(T1, q("orders"), [msg(f"m{i}") for i in range(5)])
    await store.update_queue(T1, q("orders"), {"max_messages": 2})
    [full] = await store.send(T1, q("orders"), [msg("x")])
    assert isinstance(full, QueueFull)
    assert len(await receive_all(store, T1, "orders")) == 5


async def test_delete_missing_queue_raises(store: Backend) -> None:
    await store.create_queue(T2, q("orders"), {})
    with pytest.raises(QueueNotFound):
        await store.delete_queue(T1, q("orders"))
    await store.get_queue(T2, q("orders"))


async def test_purge_counts_visible_delayed_and_in_flight(store: Backend) -> None:
    await store.create_queue(T1, q("orders"), {})
    await store.send(T1, q("orders"), [msg("a"), msg("b"), msg("c", delay_s=60)])
    [held] = await store.receive(T1, q("orders"), 1)

    assert await store.purge_queue(T1, q("orders")) == 3
    stats = (await store.get_queue(T1, q("orders"))).stats
    assert (stats.visible, stats.in_flight, stats.delayed) == (0, 0, 0)
    assert (await store.ack(T1, [held.receipt])).acked == 0
    assert await store.purge_queue(T1, q("orders")) == 0
    with pytest.raises(QueueNotFound):
        await store.purge_queue(T1, q("missing"))
    # The queue itself stays and works.
    await send_one(store, T1, "orders", "after")
    [got] = await store.receive(T1, q("orders"), 10)
    assert got.body == b"after"


# ---------------------------------------------------------------------------
# Metadata
# ---------------------------------------------------------------------------


async def test_meta_put_get_delete(store: Backend) -> None:
    assert await store.meta_get("tenants", "acme") is None
    assert await store.meta_put("tenants", "acme", b"v1") is True
    assert await store.meta_get("tenants", "acme") == b"v1"
    assert await store.meta_put("tenants", "acme", b"v2") is True
    assert await store.meta_get("tenants", "acme") == b"v2"
    assert await store.meta_put("tenants", "acme", b"v3", only_if_absent=True) is False
    assert await store.meta_get("tenants", "acme") == b"v2"
    assert await store.meta_put("tenants", "new", b"n", only_if_absent=True) is True
    assert await store.meta_delete("tenants", "acme") is True
    assert await store.meta_delete("tenants", "acme") is False
    assert await store.meta_get("tenants", "acme") is None


async def test_meta_list_by_namespace_and_prefix(store: Backend) -> None:
    for key in ("k/b", "k/a", "k/c", "other", "k"):
        await store.meta_put("keys", key, key.encode())
    await store.meta_put("keysx", "k/zz", b"other namespace")
    await store.meta_put("ke", "ys", b"namespace boundary")
    assert await store.meta_list("keys", "k/") == [("k/a", b"k/a"), ("k/b", b"k/b"), ("k/c", b"k/c")]
    assert [k for k, _ in await store.meta_list("keys")] == ["k", "k/a", "k/b", "k/c", "other"]
    assert await store.meta_list("empty") == []


async def test_meta_only_if_absent_races_have_one_winner(store: Backend) -> None:
    results = await asyncio.gather(
        *(store.meta_put("locks", "leader", f"{i}".encode(), only_if_absent=True) for i in range(20))
    )
    assert results.count(True) == 1
    winner = results.index(True)
    assert await store.meta_get("locks", "leader") == f"{winner}".encode()
