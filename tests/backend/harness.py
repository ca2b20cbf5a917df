"""Helpers shared by the backend tests: opening stores and building messages.

A :class:`StoreFactory` opens backends on one store URL and closes whatever is still
open at teardown, so a test can close and reopen a store (durability, key rotation)
without leaking writer threads.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from backend_store import (
    Backend,
    NewMessage,
    PushgateError,
    QueueName,
    ReceivedMessage,
    SendResult,
    StoreOptions,
    TenantId,
    open_backend,
)
from backend_store.backend import InMemoryReceive
from backend_store.encryption import Keyring

from ..conftest import ManualClock
from ..fixtures.inprocess_cluster import InProcessCluster
from .cluster_isolation import isolated_cluster_test

T1 = TenantId("tenant-one")
T2 = TenantId("tenant-two")


def lmdb_url(root: Path) -> str:
    return f"lmdb://{root / 'store'}"


@contextlib.asynccontextmanager
async def lmdb_store(root: Path) -> AsyncIterator[str]:
    yield lmdb_url(root)


@contextlib.asynccontextmanager
async def cluster_store(request: pytest.FixtureRequest, root: Path) -> AsyncIterator[str]:
    """The session's in-process cluster (three nodes and a manager on real etcd and TCP;
    queues replicated three times, sync: tests/fixtures/inprocess_cluster.py).

    Its nodes keep the test's clock (``clock`` publishes every move to the nodes' injected
    clock) while the test runs and while its queues are deleted, and real time again after
    it. Tests share the cluster, so each leaves it as it found it: every queue it made is
    deleted (and its partitions gone from the map) and the metadata values it wrote are undone."""
    cluster: InProcessCluster = request.getfixturevalue("inprocess_cluster")
    clock: ManualClock = request.getfixturevalue("clock")
    try:
        with clock.publish_to(cluster.set_time):
            async with isolated_cluster_test(f"{cluster.store_url}?etcd_timeout_s=5"):
                yield f"{cluster.store_url}?replication_factor=3&etcd_timeout_s=5"
    finally:
        cluster.set_time(0.0)


@dataclass(frozen=True)
class StoreKind:
    """A backend kind the contract suite runs against.

    ``open``: given the test's request and a scratch directory, bring up what the kind
    needs, yield its store URL, and clean up after the test. Every kind runs on the
    injected ``StoreOptions.clock`` (a cluster's node processes read it from a file the
    test's ManualClock writes). ``plain_defaults``: whether a queue created without
    attributes has docs/api.md's defaults exactly (the cluster kind creates replicated
    queues by default). ``holds_in_memory``: whether the store has ``InMemoryReceive``
    (tests that use it say so in their source). ``lacks``: the tests of other capabilities
    this kind does not have (named, so a new test runs on every kind by default).
    """

    open: Callable[[pytest.FixtureRequest, Path], AbstractAsyncContextManager[str]]
    plain_defaults: bool = True
    holds_in_memory: bool = True
    lacks: frozenset[str] = frozenset()


# What the cluster kind leaves out besides holds in memory (a node holds nothing in memory
# for a gateway: auto-ack subscriptions on a cluster receive as usual, then ack).
CLUSTER_LACKS = frozenset(
    {
        # StorageStats: nodes publish their use every few seconds, so a write does not show
        # at once (tests/cluster/test_node_storage.py checks it on real node processes).
        "test_storage_usage",
    }
)


# No test is copied: a kind joins by adding one entry here.
STORE_KINDS: dict[str, StoreKind] = {
    "lmdb": StoreKind(lambda request, root: lmdb_store(root)),
    "cluster": StoreKind(cluster_store, plain_defaults=False, holds_in_memory=False, lacks=CLUSTER_LACKS),
}


def kinds_for(test: Callable[..., Any]) -> list[str]:
    """The kinds a contract test can run on, judged from what its source uses."""
    source = inspect.getsource(test)
    uses_defaults = "QueueAttributes(" in source
    holds = any(word in source for word in ("in_memory(", "InMemoryReceive", "receive_in_memory"))
    return sorted(
        name
        for name, kind in STORE_KINDS.items()
        if (kind.plain_defaults or not uses_defaults)
        and (kind.holds_in_memory or not holds)
        and test.__name__ not in kind.lacks
    )


@dataclass
class StoreFactory:
    """Opens (constructs and starts) backends on one URL with an injected clock."""

    kind: str
    url: str
    clock: ManualClock
    # Background sweeps run often so retention tests see their effect within a poll.
    sweep_interval_s: float = 0.05
    _open: list[Backend] = field(default_factory=list)

    def options(self, keyring: Keyring | None = None, **overrides: Any) -> StoreOptions:
        values: dict[str, Any] = {"clock": self.clock, "sweep_interval_s": self.sweep_interval_s}
        values.update(overrides)
        return StoreOptions(keyring=keyring, **values)

    async def open(self, keyring: Keyring | None = None, **overrides: Any) -> Backend:
        backend = open_backend(self.url, self.options(keyring, **overrides))
        await backend.start()
        self._open.append(backend)
        return backend

    async def close(self, backend: Backend) -> None:
        self._open.remove(backend)
        await backend.close()

    async def reopen(self, backend: Backend, keyring: Keyring | None = None, **overrides: Any) -> Backend:
        await self.close(backend)
        return await self.open(keyring, **overrides)

    async def close_all(self) -> None:
        while self._open:
            await self._open.pop().close()


def q(name: str) -> QueueName:
    return QueueName(name)


def msg(body: bytes | str, **fields: Any) -> NewMessage:
    data = body.encode() if isinstance(body, str) else body
    return NewMessage(body=data, **fields)


def ok(result: SendResult | PushgateError) -> SendResult:
    """A send entry that must have succeeded (its error, if any, fails the test readably)."""
    assert isinstance(result, SendResult), f"send entry failed: {result!r}"
    return result


async def send_one(
    store: Backend, tenant: TenantId, queue: str, body: bytes | str, **fields: Any
) -> SendResult:
    [result] = await store.send(tenant, q(queue), [msg(body, **fields)])
    return ok(result)


async def receive_all(
    store: Backend, tenant: TenantId, queue: str, visibility_timeout_s: float = 3600, limit: int = 1_000_000
) -> list[ReceivedMessage]:
    """Receive until the queue hands out nothing more (everything visible, now in flight)."""
    got: list[ReceivedMessage] = []
    while len(got) < limit:
        batch = await store.receive(tenant, q(queue), 100, visibility_timeout_s=visibility_timeout_s)
        if not batch:
            break
        got.extend(batch)
    return got


async def idle_dispatcher(store: Backend, tenant: TenantId, queue: str) -> None:
    """Receive from an empty queue, as a push dispatcher does before it idles with a demand:
    on ``cluster://`` that connects this gateway to the queue's leaders, and ``set_demand``
    asks only the leaders it is connected to (the others wake the dispatcher with
    ``Notify``; ``push_operations.py``). Until session 73 a create connected it too (it asked
    each leader to make the queue); now a create is a record write."""
    assert await store.receive(tenant, q(queue), 1) == []


def in_memory(store: Backend) -> InMemoryReceive:
    """The store's in-memory receive (the embedded store; the cluster kind lacks it)."""
    assert isinstance(store, InMemoryReceive)
    return store
