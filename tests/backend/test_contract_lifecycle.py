"""The Backend contract: Stats, listeners, durability across reopen, start and close.

Run against every backend kind (see conftest.py). Semantics follow docs/api.md and, where it is
silent, Amazon SQS. Time-based behaviour moves the injected ManualClock; nothing sleeps.
"""

from __future__ import annotations

import asyncio

import pytest

from backend_store import Backend, NewMessage, PushgateError, SendResult, TenantId
from backend_store.backend import MetadataStore, QueueStore
from backend_store.errors import InvalidRequest

from ..conftest import ManualClock, scaled
from .harness import T1, StoreFactory, msg, ok, q, receive_all, send_one

# ---------------------------------------------------------------------------
# Roles
# ---------------------------------------------------------------------------


def _operations(role: type) -> set[str]:
    return {name for name in vars(role) if not name.startswith("_")}


async def test_a_store_plays_both_roles_and_the_roles_share_no_operation(store: Backend) -> None:
    """backend_store/backend.py: queues and messages (QueueStore) and the metadata store
    (MetadataStore) are two protocols; a Backend is one storage in both."""
    assert isinstance(store, QueueStore) and isinstance(store, MetadataStore)
    assert _operations(MetadataStore) == {"meta_get", "meta_put", "meta_delete", "meta_list"}
    assert not _operations(QueueStore) & _operations(MetadataStore)
    assert {"send", "receive", "ack", "create_queue"} <= _operations(QueueStore)
    assert _operations(Backend) == {"start", "close", "check_writable"}


# ---------------------------------------------------------------------------
# Stats
# ---------------------------------------------------------------------------


async def test_stats(store: Backend, clock: ManualClock) -> None:
    await store.create_queue(T1, q("dlq"), {})
    await store.create_queue(
        T1, q("orders"), {"visibility_timeout_s": 10, "max_receives": 1, "dead_letter_queue": "dlq"}
    )
    info = await store.get_queue(T1, q("orders"))
    assert info.stats.visible == 0 and info.stats.sent_total == 0
    assert info.stats.oldest_age_s is None  # docs/store.md: null for an empty queue

    await store.send(T1, q("orders"), [msg("a"), msg("b"), msg("c"), msg("later", delay_s=100)])
    clock.advance(5)
    [a, _b] = await store.receive(T1, q("orders"), 2)
    stats = (await store.get_queue(T1, q("orders"))).stats
    assert (stats.visible, stats.in_flight, stats.delayed) == (1, 2, 1)
    assert stats.sent_total == 4
    assert stats.oldest_age_s == pytest.approx(5)

    await store.ack(T1, [a.receipt])
    clock.advance(11)  # b times out; its next receive moves it to the DLQ
    assert [m.body for m in await store.receive(T1, q("orders"), 10)] == [b"c"]
    stats = (await store.get_queue(T1, q("orders"))).stats
    assert (stats.visible, stats.in_flight, stats.delayed) == (0, 1, 1)
    assert (stats.sent_total, stats.acked_total, stats.dead_lettered_total) == (4, 1, 1)
    dlq = (await store.get_queue(T1, q("dlq"))).stats
    assert dlq.visible == 1

    listed = {i.name: i.stats for i in await store.list_queues(T1)}
    assert listed[q("orders")] == stats


# ---------------------------------------------------------------------------
# Listeners, durability, lifecycle
# ---------------------------------------------------------------------------


async def test_listeners_hear_sends_and_nacks(store: Backend) -> None:
    await store.create_queue(T1, q("orders"), {})
    heard: list[tuple[TenantId, str]] = []
    event = asyncio.Event()

    def listener(tenant: TenantId, queue: str) -> None:
        heard.append((tenant, queue))
        event.set()

    store.add_listener(listener)

    async def expect_wake(what: str) -> None:
        async with asyncio.timeout(scaled(5)):
            await event.wait()
        assert heard[-1] == (T1, "orders"), what
        event.clear()

    await send_one(store, T1, "orders", "a")
    await expect_wake("send")
    await send_one(store, T1, "orders", "later", delay_s=30)
    await expect_wake("delayed send")
    [got] = await store.receive(T1, q("orders"), 1)
    await store.nack(T1, [got.receipt])
    await expect_wake("nack")


async def test_listeners_hear_the_dead_letter_queue_when_a_message_moves(
    store: Backend, clock: ManualClock
) -> None:
    # The DLQ's consumers wait on wake-ups like any other queue's.
    await store.create_queue(T1, q("dlq"), {})
    await store.create_queue(
        T1, q("orders"), {"visibility_timeout_s": 1, "max_receives": 1, "dead_letter_queue": "dlq"}
    )
    await send_one(store, T1, "orders", "poison")
    await store.receive(T1, q("orders"), 1)
    clock.advance(2)
    woke = asyncio.Event()
    store.add_listener(lambda tenant, queue: woke.set() if (tenant, queue) == (T1, "dlq") else None)
    assert await store.receive(T1, q("orders"), 1) == []
    async with asyncio.timeout(scaled(5)):
        await woke.wait()


async def test_a_failing_listener_does_not_fail_sends_or_other_listeners(store: Backend) -> None:
    await store.create_queue(T1, q("orders"), {})
    heard = asyncio.Event()

    def broken(tenant: TenantId, queue: str) -> None:
        raise RuntimeError("listener bug")

    store.add_listener(broken)
    store.add_listener(lambda tenant, queue: heard.set())
    await send_one(store, T1, "orders", "a")
    async with asyncio.timeout(scaled(5)):
        await heard.wait()
    assert len(await store.receive(T1, q("orders"), 10)) == 1


async def test_concurrent_consumers_never_share_a_message(store: Backend) -> None:
    await store.create_queue(T1, q("orders"), {"visibility_timeout_s": 600})
    for start in range(0, 500, 100):
        await store.send(T1, q("orders"), [msg(f"m{i}") for i in range(start, start + 100)])

    async def consumer() -> list[str]:
        mine: list[str] = []
        while got := await store.receive(T1, q("orders"), 7):
            mine += [m.id for m in got]
            result = await store.ack(T1, [m.receipt for m in got])
            assert result.acked == len(got)
        return mine

    taken = [i for ids in await asyncio.gather(*(consumer() for _ in range(8))) for i in ids]
    assert len(taken) == 500 == len(set(taken))
    stats = (await store.get_queue(T1, q("orders"))).stats
    assert (stats.visible, stats.in_flight, stats.acked_total) == (0, 0, 500)


async def test_concurrent_producers_and_consumers_account_for_every_message(store: Backend) -> None:
    # Producers, and consumers that nack every third message back: every message is acked
    # exactly once, none twice, none left behind.
    await store.create_queue(T1, q("orders"), {"visibility_timeout_s": 600})
    await store.create_queue(T1, q("f"), {"ordering": "fifo", "visibility_timeout_s": 600})
    producing = 8
    acked: dict[str, list[bytes]] = {"orders": [], "f": []}

    async def producer(p: int) -> None:
        nonlocal producing
        for i in range(40):
            await send_one(store, T1, "orders", f"{p}-{i}")
            await send_one(store, T1, "f", f"{p}-{i}", group_id=f"g{p % 3}")
        producing -= 1

    async def consumer(queue: str, c: int) -> None:
        turn = 0
        while True:
            got = await store.receive(T1, q(queue), 5)
            if not got:
                if not producing:
                    return
                await asyncio.sleep(0)
                continue
            turn += 1
            if (turn + c) % 3 == 0:
                assert (await store.nack(T1, [m.receipt for m in got])).acked == len(got)
                continue
            result = await store.ack(T1, [m.receipt for m in got])
            assert result.acked == len(got), result.failed
            acked[queue] += [m.body for m in got]

    await asyncio.gather(
        *(producer(p) for p in range(8)),
        *(consumer(queue, c) for queue in ("orders", "f") for c in range(4)),
    )
    expected = sorted(f"{p}-{i}".encode() for p in range(8) for i in range(40))
    for queue in ("orders", "f"):
        assert sorted(acked[queue]) == expected, queue
        stats = (await store.get_queue(T1, q(queue))).stats
        assert (stats.visible, stats.in_flight, stats.acked_total) == (0, 0, 320)
    # Per FIFO group, acks happened in send order (one in flight per group).
    for g in range(3):
        group = [b for b in acked["f"] if int(b.split(b"-")[0]) % 3 == g]
        for p in {int(b.split(b"-")[0]) for b in group}:
            mine = [int(b.split(b"-")[1]) for b in group if int(b.split(b"-")[0]) == p]
            assert mine == sorted(mine), (g, p)


async def test_everything_survives_reopen(store_factory: StoreFactory, clock: ManualClock) -> None:
    store = await store_factory.open()
    await store.create_queue(T1, q("orders"), {"visibility_timeout_s": 100, "dedupe_window_s": 600})
    await store.create_queue(T1, q("f"), {"ordering": "fifo"})
    sent = [ok(r) for r in await store.send(T1, q("orders"), [msg("a", dedupe_id="d"), msg("b"), msg("c")])]
    await store.send(T1, q("f"), [msg("f0", group_id="g"), msg("f1", group_id="g")])
    [held] = await store.receive(T1, q("orders"), 1)
    [f0] = await store.receive(T1, q("f"), 1)
    await store.meta_put("tenants", "acme", b"{}")

    store = await store_factory.reopen(store)
    assert [i.name for i in await store.list_queues(T1)] == ["f", "orders"]
    assert (await store.get_queue(T1, q("orders"))).attributes.visibility_timeout_s == 100
    assert await store.meta_get("tenants", "acme") == b"{}"
    # In-flight state is durable: the held message is still invisible, its receipt still works,
    # and the fifo group is still blocked.
    assert [m.body for m in await receive_all(store, T1, "orders", visibility_timeout_s=5)] == [b"b", b"c"]
    assert await store.receive(T1, q("f"), 1) == []
    assert (await store.ack(T1, [held.receipt, f0.receipt])).acked == 2
    [f1] = await store.receive(T1, q("f"), 1)
    assert f1.body == b"f1"
    stats = (await store.get_queue(T1, q("orders"))).stats
    assert (stats.sent_total, stats.acked_total) == (3, 1)
    # So is the dedupe index, and seqs keep growing.
    dup = await send_one(store, T1, "orders", "a", dedupe_id="d")
    assert dup.duplicate and dup.id == sent[0].id
    fresh = await send_one(store, T1, "orders", "d")
    assert fresh.seq > max(r.seq for r in sent)


async def test_start_is_idempotent_and_check_writable(store: Backend) -> None:
    await store.start()
    await store.check_writable()
    await store.create_queue(T1, q("orders"), {})
    await send_one(store, T1, "orders", "a")


async def test_close_finishes_queued_writes(store_factory: StoreFactory) -> None:
    store = await store_factory.open()
    await store.create_queue(T1, q("orders"), {})
    sends = [asyncio.ensure_future(store.send(T1, q("orders"), [msg(f"m{i}")])) for i in range(200)]
    await asyncio.sleep(0)  # let them reach the writer's queue
    await store_factory.close(store)
    # Every send either completed (and then must be on disk) or failed; none hangs.
    async with asyncio.timeout(scaled(10)):
        outcomes = await asyncio.gather(*sends, return_exceptions=True)
    stored = {r[0].id for r in outcomes if isinstance(r, list) and isinstance(r[0], SendResult)}
    store = await store_factory.open()
    got = await receive_all(store, T1, "orders")
    assert stored <= {m.id for m in got}
    assert len(got) == len({m.id for m in got})


async def test_send_many_small_batches_concurrently_share_commits(store: Backend) -> None:
    # Not a speed test: hundreds of concurrent callers must all complete and all land once.
    await store.create_queue(T1, q("orders"), {})
    batches = [[NewMessage(body=f"{b}-{i}".encode()) for i in range(5)] for b in range(100)]
    results = await asyncio.gather(*(store.send(T1, q("orders"), batch) for batch in batches))
    ids = [ok(r).id for rs in results for r in rs]
    assert len(set(ids)) == 500
    assert len(await receive_all(store, T1, "orders")) == 500


async def test_one_bad_operation_does_not_fail_the_others_of_its_commit(store: Backend) -> None:
    # Keys past what the storage engine takes (LMDB: 511 bytes) come from callers: a JWT kid
    # or tenant name as a metadata key, a tenant id in a queue key, a long group_id. One such call must fail alone, not
    # take down every send that happened to share its group commit.
    await store.create_queue(T1, q("orders"), {})
    await store.create_queue(T1, q("f"), {"ordering": "fifo"})
    outcomes = await asyncio.gather(
        store.meta_put("keys", "k" * 1000, b"v"),
        store.create_queue(TenantId("t" * 1000), q("orders"), {}),
        store.send(T1, q("f"), [msg("long group", group_id="g" * 1000), msg("fine", group_id="g")]),
        *(store.send(T1, q("orders"), [msg(f"m{i}")]) for i in range(10)),
        return_exceptions=True,
    )
    meta, tenant, fifo, *sends = outcomes
    # A metadata name or tenant id past the store's bound is the caller's error, refused
    # before anything is written; a long group id is hashed into its key (keys.py) and stored.
    assert isinstance(meta, InvalidRequest), meta
    assert isinstance(tenant, InvalidRequest), tenant
    assert all(isinstance(r, list) and isinstance(r[0], SendResult) for r in sends), sends
    assert isinstance(fifo, list), fifo
    assert all(isinstance(r, SendResult) for r in fifo), fifo
    assert len(await receive_all(store, T1, "orders")) == 10
    got = await receive_all(store, T1, "f")
    assert sorted((m.body, m.group_id) for m in got) == [(b"fine", "g"), (b"long group", "g" * 1000)]


async def test_strings_that_cannot_be_stored_are_invalid_requests(store: Backend) -> None:
    # A lone surrogate is a valid Python str but not UTF-8. The contract: errors are
    # PushgateErrors, and a send batch fails per entry; an input error is never "unavailable"
    # (clients retry those forever).
    await store.create_queue(T1, q("orders"), {})
    await store.create_queue(T1, q("f"), {"ordering": "fifo"})
    with pytest.raises(InvalidRequest):
        await store.meta_put("keys", "\ud800", b"v")
    for queue, bad in (
        ("f", msg("bad", group_id="\ud800")),
        ("orders", msg("bad", dedupe_id="\ud800")),
        ("orders", msg("bad", attributes={"k": "\ud800"})),
    ):
        results = await store.send(T1, q(queue), [bad, msg("good", group_id="g" if queue == "f" else None)])
        assert isinstance(results[0], InvalidRequest), results
        assert isinstance(results[1], SendResult), results


async def test_calls_racing_close_end_in_results_or_store_errors(store_factory: StoreFactory) -> None:
    # Graceful shutdown closes the store while requests (stats, long-polls) are still reading.
    # They may finish or fail with a PushgateError (the gateway answers 503); anything else is a 500.
    for _ in range(5):
        store = await store_factory.open()
        await store.create_queue(T1, q("orders"), {})
        await store.send(T1, q("orders"), [msg("x" * 100) for _ in range(50)])

        readers = [asyncio.ensure_future(_read_forever(store)) for _ in range(8)]
        await asyncio.sleep(0.01)  # let the readers get going, mid-read, on worker threads
        await store_factory.close(store)
        # They end with the store, not at their request deadline (10 s on the cluster).
        async with asyncio.timeout(scaled(5)):
            outcomes = await asyncio.gather(*readers, return_exceptions=True)
        strays = [o for o in outcomes if not isinstance(o, PushgateError)]
        assert not strays, f"not a PushgateError after close: {strays[0]!r}"


async def _read_forever(store: Backend) -> None:
    while True:
        await store.list_queues(T1)
        await store.get_queue(T1, q("orders"))
        await store.meta_list("ns")
