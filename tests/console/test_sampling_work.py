"""What a sampling tick costs at many queues, counted (not timed): a real embedded store, the
gateway's sampler with the alert engine as its listener, default rules and one of our own.

An idle queue costs a tick no new sample and no alert evaluation; a queue that changed is
evaluated, fires and resolves as before (issue 49: at 1,000 queues the sampler and the alert
engine were 31% of a gateway's samples, rebuilding and evaluating every queue every tick).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from backend_store import Backend, NewMessage, StoreOptions, open_backend
from backend_store.types import QueueName, TenantId
from tests.conftest import ManualClock
from web_console.alerts import AlertEngine, AlertRule, RuleStore, SharedAlerts
from web_console.monitor import MonitorSources, QueueSampler, Snapshot

TENANT = TenantId("operator")
QUEUES = 300


@pytest.fixture
async def store(tmp_path: Path, clock: ManualClock) -> AsyncIterator[Backend]:
    backend = open_backend(f"lmdb://{tmp_path / 'store'}", StoreOptions(clock=clock, sweep_interval_s=0))
    await backend.start()
    try:
        yield backend
    finally:
        await backend.close()


class CountedRates:
    """Counts the rate-history reads the alert rules make (one per queue evaluated by a
    windowed rule), passing each to the sampler's real history."""

    def __init__(self, sampler: QueueSampler) -> None:
        self.calls = 0
        real = sampler.rates.increase

        def increase(*args: Any, **kwargs: Any) -> int:
            self.calls += 1
            return real(*args, **kwargs)

        sampler.rates.increase = increase  # type: ignore[method-assign]


async def test_an_idle_queue_costs_a_tick_no_sample_and_no_evaluation(
    store: Backend, clock: ManualClock
) -> None:
    for i in range(QUEUES):
        await store.create_queue(TENANT, QueueName(f"q{i:03d}"), {})

    async def tenants() -> list[str]:
        return [TENANT]

    sampler = QueueSampler(MonitorSources(store, tenants, clock=clock))
    alerts = AlertEngine(
        RuleStore(store),
        sampler.history,
        shared=SharedAlerts(store),
        rates=sampler.rates,
        defaults_for=TENANT,  # dead_lettered over a window, oldest_age: every queue of the tenant
    )
    sampler.listeners.append(alerts.on_sample)
    counted = CountedRates(sampler)

    async def tick() -> tuple[Snapshot, Snapshot]:
        before = sampler.latest
        clock.advance(30)
        return before, await sampler.sample()

    await tick()  # the default rules are given to the tenant
    assert {r.kind for r in alerts.rules} >= {"dead_lettered", "oldest_age"}
    await alerts.add_rule(AlertRule("deep", TENANT, "queue_depth", threshold=2, for_s=0))
    _, first = await tick()  # every queue new the tick before: rates 0 from now on
    assert len(first.queues) == QUEUES

    counted.calls = 0
    before, idle = await tick()
    rebuilt = [q for q in idle.queues if q is not before.queue(q.tenant, q.name)]
    assert rebuilt == [] and idle.changed == ()
    assert counted.calls == 0  # no queue evaluated by the windowed default rule
    assert alerts.active() == []

    # One queue changes among the idle ones: it alone is sampled again and evaluated.
    await store.send(TENANT, QueueName("q007"), [NewMessage(b"x") for _ in range(3)])
    counted.calls = 0
    _, busy = await tick()
    assert [q.name for q in busy.changed or ()] == ["q007"]
    assert counted.calls == 1
    assert [(a.rule_id, a.subject) for a in alerts.active()] == [("deep", "operator/q007")]

    # Firing and idle: still tracked (evaluated each tick), the others not.
    counted.calls = 0
    _, held = await tick()
    assert [q.name for q in held.changed or ()] == ["q007"]  # its oldest message ages
    assert [(a.rule_id, a.subject) for a in alerts.active()] == [("deep", "operator/q007")]

    # Deleted: its alert resolves, though no sample of it changed.
    await store.delete_queue(TENANT, QueueName("q007"))
    await tick()
    assert alerts.active() == []
    assert [e.state for e in alerts.recent() if e.rule_id == "deep"] == ["resolved", "fired"]

    # A rule added later sees every queue at once, idle or not.
    await store.send(TENANT, QueueName("q100"), [NewMessage(b"x") for _ in range(3)])
    await tick()
    await alerts.add_rule(AlertRule("deeper", TENANT, "queue_depth", threshold=1, for_s=0))
    await tick()
    assert ("deeper", "operator/q100") in [(a.rule_id, a.subject) for a in alerts.active()]
