"""Standing receives: the commit that makes messages visible also receives them for a waiting dispatcher."""

from __future__ import annotations

import asyncio

from backend_store import Backend, ReceivedMessage
from backend_store.backend import StandingReceive
from backend_store.types import TenantId

from .harness import idle_dispatcher, msg, ok, q

T1 = TenantId("t1")


async def test_a_send_serves_the_standing_demand_in_its_own_commit(store: Backend) -> None:
    if not isinstance(store, StandingReceive):
        return  # an optional capability; the plain receive contract covers the rest
    await store.create_queue(T1, q("jobs"), {})
    await idle_dispatcher(store, T1, "jobs")
    got: asyncio.Queue[list[ReceivedMessage]] = asyncio.Queue()
    store.set_demand(T1, q("jobs"), 2, 60, got.put_nowait)

    [first] = await store.send(T1, q("jobs"), [msg("a")])
    delivered = await asyncio.wait_for(got.get(), 5)
    assert [(m.id, m.body, m.receive_count) for m in delivered] == [(ok(first).id, b"a", 1)]
    # Handed to the dispatcher, so in flight for everyone else, and its receipt works.
    assert await store.receive(T1, q("jobs"), 10) == []
    assert (await store.ack(T1, [delivered[0].receipt])).acked == 1

    # Served once: the next send waits for the next receive.
    await store.send(T1, q("jobs"), [msg("b")])
    assert got.empty()
    assert [m.body for m in await store.receive(T1, q("jobs"), 10)] == [b"b"]


async def test_a_demand_takes_at_most_its_size_and_can_be_withdrawn(store: Backend) -> None:
    if not isinstance(store, StandingReceive):
        return
    await store.create_queue(T1, q("jobs"), {})
    await idle_dispatcher(store, T1, "jobs")
    got: asyncio.Queue[list[ReceivedMessage]] = asyncio.Queue()
    store.set_demand(T1, q("jobs"), 2, 60, got.put_nowait)
    await store.send(T1, q("jobs"), [msg("a"), msg("b"), msg("c")])
    assert [m.body for m in await asyncio.wait_for(got.get(), 5)] == [b"a", b"b"]
    assert [m.body for m in await store.receive(T1, q("jobs"), 10)] == [b"c"]

    store.set_demand(T1, q("jobs"), 5, 60, got.put_nowait)
    store.clear_demand(T1, q("jobs"), got.put_nowait)
    await store.send(T1, q("jobs"), [msg("d")])
    assert got.empty()
    assert [m.body for m in await store.receive(T1, q("jobs"), 10)] == [b"d"]
