"""One commit, one signal on the embedded store: a standing receive that took everything a
commit made visible is that commit's wake-up; change listeners (the wake-up hub, other
gateways' signals) hear nothing of the queue. After a full delivery, or with no demand,
they do. On a real store; the dispatcher's side runs in every push test."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from backend_store import NewMessage, QueueName, TenantId, open_backend
from backend_store.backend import Backend, StandingReceive
from backend_store.types import ReceivedMessage
from tests.conftest import scaled

T = TenantId("t")
Q = QueueName("q")


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Backend]:
    backend = open_backend(f"lmdb://{tmp_path}")
    await backend.start()
    await backend.create_queue(T, Q, {})
    try:
        yield backend
    finally:
        await backend.close()


class Signals:
    """What a commit told this process: wake-ups (listener calls) and deliveries, in order."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, int]] = []
        self.delivered = asyncio.Event()

    def listener(self, tenant: TenantId, queue: QueueName) -> None:
        self.seen.append(("wake", 0))

    def deliver(self, messages: list[ReceivedMessage]) -> None:
        self.seen.append(("delivery", len(messages)))
        self.delivered.set()


async def after_commit(store: Backend, signals: Signals, bodies: list[bytes]) -> list[tuple[str, int]]:
    """Send ``bodies`` in one call; return the signals once its commit's callbacks ran."""
    signals.seen.clear()
    await store.send(T, Q, [NewMessage(b) for b in bodies])
    await asyncio.sleep(0)  # the commit's callbacks run in the same hop as the send's answer
    return list(signals.seen)


async def test_a_demand_that_took_everything_is_the_commits_only_signal(store: Backend) -> None:
    assert isinstance(store, StandingReceive)
    signals = Signals()
    store.add_listener(signals.listener)
    store.set_demand(T, Q, 10, 30.0, signals.deliver)
    assert await after_commit(store, signals, [b"one", b"two"]) == [("delivery", 2)]


async def test_a_full_delivery_leaves_the_wake_up_for_whoever_looks_next(store: Backend) -> None:
    assert isinstance(store, StandingReceive)
    signals = Signals()
    store.add_listener(signals.listener)
    store.set_demand(T, Q, 1, 30.0, signals.deliver)
    # One of two taken: the other is visible, so the queue's wake-up goes out too.
    assert await after_commit(store, signals, [b"one", b"two"]) == [("wake", 0), ("delivery", 1)]


async def test_without_a_demand_a_commit_wakes_the_listeners(store: Backend) -> None:
    signals = Signals()
    store.add_listener(signals.listener)
    async with asyncio.timeout(scaled(5)):
        assert await after_commit(store, signals, [b"one"]) == [("wake", 0)]
