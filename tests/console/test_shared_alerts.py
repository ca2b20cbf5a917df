"""Two gateways on one store share alert state: each transition is recorded once.

Two :class:`AlertEngine` s (as two gateways build them) on one real LMDB store, fed the
same samples in turn, as two gateways' monitors would be. What an operator depends on: one
webhook POST and one history entry per transition whichever gateway saw it first, the same
active alerts and history on both, and a restarted gateway that does not fire again an
alert still firing.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from backend_store.backend import Backend
from backend_store.options import StoreOptions
from backend_store.url import open_backend
from web_console.alerts import AlertEngine, AlertRule, RuleStore, SharedAlerts, WebhookNotifier
from web_console.monitor import DepthHistory, QueueSample, Snapshot


class Notifications(WebhookNotifier):
    """A webhook notifier that records what each gateway would POST (never started: sends nothing)."""

    def __init__(self) -> None:
        super().__init__("http://127.0.0.1:9/never-called")
        self.sent: list[dict[str, Any]] = []

    def enqueue(self, event: dict[str, Any]) -> None:
        self.sent.append(event["alert"])


def sample(at: float, depth: int) -> Snapshot:
    return Snapshot(at, (QueueSample("t", "orders", depth, 0, 0, None, 0, 0, 0, 0, None, {}),))


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Backend]:
    backend = open_backend(f"lmdb://{tmp_path / 'store'}", StoreOptions(sweep_interval_s=0))
    await backend.start()
    try:
        yield backend
    finally:
        await backend.close()


def gateway(store: Backend, notes: Notifications) -> AlertEngine:
    return AlertEngine(
        RuleStore(store),
        DepthHistory(),
        notifier=notes,
        shared=SharedAlerts(store),
    )


async def test_each_transition_is_recorded_once_across_gateways(store: Backend) -> None:
    notes_a, notes_b = Notifications(), Notifications()
    a, b = gateway(store, notes_a), gateway(store, notes_b)
    await a.add_rule(AlertRule(id="r1", tenant="t", kind="queue_depth", threshold=10, created_at=1))

    # Both see the depth pass the threshold; the first to claim records it.
    await a.on_sample(sample(100, 50))
    await b.on_sample(sample(100.5, 50))
    assert [(n["state"], n["subject"]) for n in notes_a.sent] == [("fired", "t/orders")]
    assert notes_b.sent == []
    assert [al.subject for al in a.active()] == [al.subject for al in b.active()] == ["t/orders"]
    assert a.active()[0].since == b.active()[0].since == 100

    # b sees the depth back to 0 first: b resolves it, a adopts that at its next sample.
    await b.on_sample(sample(105, 0))
    await a.on_sample(sample(105.5, 0))
    assert [n["state"] for n in notes_b.sent] == ["resolved"]
    assert [n["state"] for n in notes_a.sent] == ["fired"]
    assert a.active() == b.active() == []
    assert [e.state for e in a.recent()] == [e.state for e in b.recent()] == ["resolved", "fired"]
    assert sum(a.transitions.values()) + sum(b.transitions.values()) == 2


async def test_a_restarted_gateway_adopts_a_firing_alert_without_firing_it_again(store: Backend) -> None:
    first = Notifications()
    a = gateway(store, first)
    await a.add_rule(AlertRule(id="r1", tenant="t", kind="queue_depth", threshold=10, created_at=1))
    await a.on_sample(sample(100, 50))
    assert [n["state"] for n in first.sent] == ["fired"]

    again = Notifications()
    restarted = gateway(store, again)  # a new process: nothing in memory
    await restarted.on_sample(sample(200, 50))
    assert again.sent == []
    assert [(al.subject, al.since) for al in restarted.active()] == [("t/orders", 100)]
    assert [e.state for e in restarted.recent()] == ["fired"]
    # Its rule deleted while it fires: the alert resolves, once.
    await restarted.delete_rule("t", "r1")
    await restarted.on_sample(sample(201, 50))
    await a.on_sample(sample(201.5, 50))
    assert [n["state"] for n in again.sent] == ["resolved"] and [n["state"] for n in first.sent] == ["fired"]
    assert a.active() == restarted.active() == []
