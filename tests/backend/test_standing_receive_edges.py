"""Standing receives at the edges: what a demand may and may not be served with.

The basics are in ``test_standing_receive.py``. A demand is an optional capability
(:class:`~backend_store.backend.StandingReceive`); backends without it skip these tests. What a
demand hands out must obey the same rules as ``receive``: visible messages only, FIFO groups one
at a time, its own tenant, max_receives, and it counts as a receive.
"""

from __future__ import annotations

import asyncio

from backend_store import Backend, ReceivedMessage, TenantId
from backend_store.backend import StandingReceive

from ..conftest import ManualClock, scaled
from .harness import T1, T2, idle_dispatcher, msg, q, send_one


class Demand:
    """A registered demand and what it was handed."""

    def __init__(self, store: Backend, tenant: TenantId, queue: str, size: int, timeout: float = 60) -> None:
        # A kind without standing receives must name these tests in its `lacks` (harness.py).
        assert isinstance(store, StandingReceive), "this backend kind has no standing receives"
        self.got: asyncio.Queue[list[ReceivedMessage]] = asyncio.Queue()
        store.set_demand(tenant, q(queue), size, timeout, self.got.put_nowait)

    async def served(self) -> list[ReceivedMessage]:
        async with asyncio.timeout(scaled(5)):
            return await self.got.get()

    async def not_served(self, store: Backend) -> None:
        # The writer settles a commit before the caller's await returns; one more no-op
        # commit makes sure any delivery callback of earlier commits has run.
        await store.check_writable()
        await asyncio.sleep(0)
        assert self.got.empty(), self.got.get_nowait()


async def test_a_delayed_send_leaves_the_demand_waiting(store: Backend, clock: ManualClock) -> None:
    await store.create_queue(T1, q("jobs"), {})
    await idle_dispatcher(store, T1, "jobs")
    demand = Demand(store, T1, "jobs", 5)
    await send_one(store, T1, "jobs", "later", delay_s=30)
    await demand.not_served(store)
    await send_one(store, T1, "jobs", "now")
    assert [m.body for m in await demand.served()] == [b"now"]


async def test_a_nack_serves_the_demand(store: Backend) -> None:
    await store.create_queue(T1, q("jobs"), {})
    await send_one(store, T1, "jobs", "a")
    [held] = await store.receive(T1, q("jobs"), 1)
    demand = Demand(store, T1, "jobs", 5)
    await store.nack(T1, [held.receipt])
    [again] = await demand.served()
    assert (again.id, again.receive_count) == (held.id, 2)
    assert (await store.ack(T1, [held.receipt])).acked == 0
    assert (await store.ack(T1, [again.receipt])).acked == 1


async def test_a_demand_is_not_served_by_another_tenant(store: Backend) -> None:
    await store.create_queue(T1, q("jobs"), {})
    await store.create_queue(T2, q("jobs"), {})
    demand = Demand(store, T1, "jobs", 5)
    await send_one(store, T2, "jobs", "for tenant two")
    await demand.not_served(store)
    assert [m.body for m in await store.receive(T2, q("jobs"), 10)] == [b"for tenant two"]


async def test_a_fifo_demand_takes_one_message_per_group(store: Backend) -> None:
    await store.create_queue(T1, q("f"), {"ordering": "fifo"})
    await idle_dispatcher(store, T1, "f")
    demand = Demand(store, T1, "f", 10)
    await store.send(T1, q("f"), [msg("a0", group_id="a"), msg("a1", group_id="a"), msg("b0", group_id="b")])
    assert sorted(m.body for m in await demand.served()) == [b"a0", b"b0"]
    assert await store.receive(T1, q("f"), 10) == []


async def test_a_served_demand_counts_as_a_receive(store: Backend, clock: ManualClock) -> None:
    await store.create_queue(T1, q("jobs"), {"visibility_timeout_s": 30})
    await idle_dispatcher(store, T1, "jobs")
    demand = Demand(store, T1, "jobs", 5, timeout=10)
    await send_one(store, T1, "jobs", "a")
    [got] = await demand.served()
    assert got.visible_at == clock.now + 10
    stats = (await store.get_queue(T1, q("jobs"))).stats
    assert (stats.visible, stats.in_flight) == (0, 1)
    clock.advance(11)
    [again] = await store.receive(T1, q("jobs"), 1)
    assert (again.id, again.receive_count) == (got.id, 2)


async def test_a_demand_never_hands_out_a_message_past_max_receives(
    store: Backend, clock: ManualClock
) -> None:
    await store.create_queue(T1, q("dlq"), {})
    await store.create_queue(
        T1, q("jobs"), {"visibility_timeout_s": 5, "max_receives": 1, "dead_letter_queue": "dlq"}
    )
    await send_one(store, T1, "jobs", "poison")
    [held] = await store.receive(T1, q("jobs"), 1)
    demand = Demand(store, T1, "jobs", 5)
    await store.nack(T1, [held.receipt])  # visible again, past max_receives: moved, not served
    await demand.not_served(store)
    assert [m.body for m in await store.receive(T1, q("dlq"), 10)] == [b"poison"]


async def test_a_replaced_demand_serves_only_the_new_callback(store: Backend) -> None:
    await store.create_queue(T1, q("jobs"), {})
    await idle_dispatcher(store, T1, "jobs")
    old = Demand(store, T1, "jobs", 5)
    new = Demand(store, T1, "jobs", 5)
    await send_one(store, T1, "jobs", "a")
    assert [m.body for m in await new.served()] == [b"a"]
    await old.not_served(store)
