"""The monitor's sampler on a real embedded store: stats of every tenant, rates, history,
and sends bringing samples forward only while a live page watches."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import pytest

from backend_store import Backend, NewMessage, StoreOptions, open_backend
from backend_store.types import QueueName, TenantId
from tests.conftest import ManualClock, scaled
from web_console.monitor import MonitorSources, QueueSampler
from web_console.monitor.sampler import S_PER_QUEUE, timer_gap

T1, T2 = TenantId("one"), TenantId("two")


@pytest.fixture
async def store(tmp_path: Path, clock: ManualClock) -> AsyncIterator[Backend]:
    backend = open_backend(f"lmdb://{tmp_path / 'store'}", StoreOptions(clock=clock, sweep_interval_s=0))
    await backend.start()
    try:
        yield backend
    finally:
        await backend.close()


def sources_for(store: Backend, clock: ManualClock) -> MonitorSources:
    async def tenants() -> list[str]:
        return [T1, T2]

    return MonitorSources(store, tenants, consumers=lambda t, q: 2, clock=clock)


async def test_a_sample_covers_every_tenant_with_rates_and_history(
    store: Backend, clock: ManualClock
) -> None:
    for tenant in (T1, T2):
        await store.create_queue(tenant, QueueName("q"), {})
    sampler = QueueSampler(sources_for(store, clock))
    first = await sampler.sample()
    assert sorted(q.key for q in first.queues) == [("one", "q"), ("two", "q")]
    assert first.storage is not None and first.storage.used_bytes > 0
    assert not first.cluster and first.nodes == ()
    await store.send(T1, QueueName("q"), [NewMessage(b"x") for _ in range(10)])
    clock.advance(5)
    second = await sampler.sample()
    q1 = second.queue("one", "q")
    assert q1 is not None and (q1.visible, q1.consumers, q1.send_rate) == (10, 2, 2.0)
    assert q1.oldest_age_s == pytest.approx(5)
    assert sampler.history.points("one", "q")[-1][1] == 10  # one point per 30 s step, newest value
    # fresh() reuses a young sample and reads again once it is old.
    assert await sampler.fresh(1.0) is second
    clock.advance(2)
    assert (await sampler.fresh(1.0)).at == clock.now


async def test_sends_bring_samples_forward_only_while_watched(store: Backend, clock: ManualClock) -> None:
    await store.create_queue(T1, QueueName("q"), {})
    sampler = QueueSampler(sources_for(store, clock), interval_s=3600, min_gap_s=0)
    await sampler.start()
    try:
        first = await sampler.next_sample(0.0, scaled(10))
        assert first is not None
        clock.advance(1)
        await store.send(T1, QueueName("q"), [NewMessage(b"x")])
        # Nobody watches: the send waits for the hourly sample (a short, bounded look).
        same = await sampler.next_sample(first.at, 0.3)
        assert same is not None and same.at == first.at and sampler.samples_taken == 1
        with sampler.watching():
            # A new live page gets a fresh sample at once: what changed between its page load
            # and its stream's start shows without waiting for the hourly one.
            clock.advance(1)
            joined = await sampler.next_sample(first.at, scaled(10))
            assert joined is not None and joined.at == clock.now
            one = joined.queue("one", "q")
            assert one is not None and one.visible == 1
            clock.advance(1)
            await store.send(T1, QueueName("q"), [NewMessage(b"y")])
            second = await sampler.next_sample(joined.at, scaled(10))
        assert second is not None and second.at == clock.now
        q1 = second.queue("one", "q")
        assert q1 is not None and q1.visible == 2
        assert sampler.watchers == 0
    finally:
        await sampler.drain()
    assert await sampler.next_sample(0.0, 1.0) is None  # stopped: waiters are let go


def test_the_timer_pace_grows_with_the_queues_sampled() -> None:
    assert timer_gap(5.0, 100, S_PER_QUEUE) == 5.0
    assert timer_gap(5.0, 2_500, S_PER_QUEUE) == 5.0
    assert timer_gap(5.0, 10_000, S_PER_QUEUE) == pytest.approx(20.0)
    assert timer_gap(30.0, 10_000, S_PER_QUEUE) == 30.0  # an operator's slower pace holds


async def test_a_store_with_many_queues_is_sampled_less_often(store: Backend, clock: ManualClock) -> None:
    for i in range(20):
        await store.create_queue(T1, QueueName(f"q{i}"), {})
    # 20 queues at 25 ms each: one sample per 0.5 s, where the interval alone asks for one
    # per 20 ms (the duty cycle allows that: a sample of 20 queues takes about 2 ms).
    sampler = QueueSampler(sources_for(store, clock), interval_s=0.02, min_gap_s=0, s_per_queue=0.025)
    await sampler.start()
    try:
        await asyncio.sleep(1.2)
        assert len(sampler.latest.queues) == 20
        assert 1 <= sampler.samples_taken <= 4
    finally:
        await sampler.drain()


async def test_each_rate_counts_its_own_events(store: Backend, clock: ManualClock) -> None:
    """Sends, acks, this gateway's deliveries and dead-letterings a second, each from its own
    counter (distinct figures, so that two rates swapped would show)."""
    q, dlq = QueueName("q"), QueueName("dlq")
    await store.create_queue(T1, dlq, {})
    await store.create_queue(T1, q, {"dead_letter_queue": "dlq", "max_receives": 1})
    sources = sources_for(store, clock)
    delivered = {q: 0}
    sources.delivered = lambda tenant, queue: delivered.get(queue, 0)
    sampler = QueueSampler(sources)
    await sampler.sample()
    delivered[q] = 7
    await store.send(T1, q, [NewMessage(b"x") for _ in range(8)])
    first = await store.receive(T1, q, 5, visibility_timeout_s=1)
    await store.ack(T1, [m.receipt for m in first[:3]])
    clock.advance(2)
    # The two received and not acked are back, past max_receives: dead-lettered, not received.
    assert len(await store.receive(T1, q, 10)) == 3
    sample = (await sampler.sample()).queue(T1, q)
    assert sample is not None
    assert (sample.send_rate, sample.ack_rate, sample.delivered_rate, sample.dead_letter_rate) == (
        4.0,
        1.5,
        3.5,
        1.0,
    )


class PageRecorder:
    """The store, with the limit of each ``list_queues`` read recorded (a sample must not
    read a whole tenant at once: at 10,000 queues that held the gateway's loop 80-130 ms)."""

    def __init__(self, store: Backend) -> None:
        self._store = store
        self.limits: list[int | None] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def list_queues(self, tenant: TenantId, *, after: str = "", limit: int | None = None) -> Any:
        self.limits.append(limit)
        return await self._store.list_queues(tenant, after=after, limit=limit)


async def test_a_sample_reads_a_page_at_a_time_and_misses_no_queue(
    store: Backend, clock: ManualClock
) -> None:
    # 23 queues in one tenant (three pages of 7, and 2), 7 in the other (a page, then an
    # empty one), names whose order is not their creation's.
    names = {T1: [f"q{(i * 7) % 23:02d}" for i in range(23)], T2: [f"r{i}" for i in range(7)]}
    for tenant, queues in names.items():
        for name in queues:
            await store.create_queue(tenant, QueueName(name), {})
    await store.send(T1, QueueName("q22"), [NewMessage(b"x")])
    recorder = PageRecorder(store)
    sources = sources_for(store, clock)
    sources.backend = cast(Backend, recorder)
    sampler = QueueSampler(sources, page_size=7)
    snapshot = await sampler.sample()
    assert [q.key for q in snapshot.queues] == [
        (tenant, name) for tenant in (T1, T2) for name in sorted(names[tenant])
    ]
    last = snapshot.queue(T1, "q22")
    assert last is not None and last.visible == 1
    assert recorder.limits == [7] * 6
    assert all(sampler.history.points(*q.key) for q in snapshot.queues)
