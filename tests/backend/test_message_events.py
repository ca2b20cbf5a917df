"""The store reports dead-letter moves and expiries to event listeners, once, after commit.

Usage (``dead_lettered``) and the per-queue metrics (``dead_lettered``, ``expired``) are fed
from these events; the durable per-queue ``dead_lettered_total`` must agree with them.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence

from backend_store.backend import Backend, MessageEvent, MessageEvents
from backend_store.types import TenantId
from tests.conftest import ManualClock

from .harness import q, receive_all, send_one

T = TenantId("acme")


class Recorder:
    def __init__(self) -> None:
        self.calls: list[list[MessageEvent]] = []
        self.changed = asyncio.Event()

    def __call__(self, events: Sequence[MessageEvent]) -> None:
        self.calls.append(list(events))
        self.changed.set()

    def totals(self) -> Counter[tuple[str, str]]:
        out: Counter[tuple[str, str]] = Counter()
        for call in self.calls:
            for e in call:
                assert e.tenant == T
                out[(e.queue, e.kind)] += e.count
        return out

    async def wait_for(self, expected: Counter[tuple[str, str]]) -> None:
        async with asyncio.timeout(10):
            while self.totals() != expected:
                self.changed.clear()
                await self.changed.wait()


def events_of(store: Backend) -> Recorder:
    # A kind without message events must name these tests in its `lacks` (harness.py).
    assert isinstance(store, MessageEvents), "this backend kind reports no message events"
    recorder = Recorder()
    store.add_event_listener(recorder)
    return recorder


async def test_a_dead_letter_move_is_reported_once_with_its_source_queue(store: Backend) -> None:
    recorder = events_of(store)
    await store.create_queue(T, q("dlq"), {})
    await store.create_queue(T, q("src"), {"max_receives": 1, "dead_letter_queue": "dlq"})
    for body in ("a", "b", "c"):
        await send_one(store, T, "src", body)
    got = await store.receive(T, q("src"), 10, visibility_timeout_s=3600)
    assert len(got) == 3
    await store.nack(T, [m.receipt for m in got[:2]])  # two come back past max_receives
    assert await store.receive(T, q("src"), 10) == []  # moved, not delivered
    await recorder.wait_for(Counter({("src", "dead_lettered"): 2}))
    info = await store.get_queue(T, q("src"))
    assert info.stats.dead_lettered_total == 2  # the durable total agrees
    assert len(await receive_all(store, T, "dlq")) == 2
    # Nothing else happened: sends, receives and nacks are the callers' to report.
    assert recorder.totals() == Counter({("src", "dead_lettered"): 2})


async def test_expiry_is_reported_by_receive_and_by_the_sweeper(store: Backend, clock: ManualClock) -> None:
    recorder = events_of(store)
    await store.create_queue(T, q("old"), {"retention_s": 60})
    await store.create_queue(T, q("swept"), {"retention_s": 60})
    await send_one(store, T, "old", "x")
    for body in ("1", "2"):
        await send_one(store, T, "swept", body)
    clock.advance(61)
    assert await store.receive(T, q("old"), 10) == []  # past retention: dropped on receive
    # The background sweeper (every 0.05 s in these tests) drops the other queue's two.
    await recorder.wait_for(Counter({("old", "expired"): 1, ("swept", "expired"): 2}))
    assert (await store.get_queue(T, q("swept"))).stats.visible == 0
