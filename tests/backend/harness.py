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
from backend_store.encryption import Keyring

from ..conftest import ManualClock
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
    """The session's dev cluster (three nodes; queues replicated three times, sync).

    Tests share it, so each leaves it as it found it: its tenants' queues are deleted (and
    their partitions gone from the map) and the metadata values it wrote are undone."""
    cluster = request.getfixturevalue("dev_cluster")
    async with isolated_cluster_test(f"{cluster.store_url}?etcd_timeout_s=5", (T1, T2)):
        yield f"{cluster.store_url}?replication_factor=3&etcd_timeout_s=5"


@dataclass(frozen=True)
class StoreKind:
    """A backend kind the contract suite runs against.

    ``open``: given the test's request and a scratch directory, bring up what the kind
    needs, yield its store URL, and clean up after the test. ``follows_clock``: whether the
    store runs on the injected ``StoreOptions.clock``; a cluster's node processes keep real
    time, so tests that move a ManualClock (or compare with CLOCK_START) run only on kinds
    that follow it. ``plain_defaults``: whether a queue created without attributes has
    docs/api.md's defaults exactly (the cluster kind creates replicated queues by default).
    ``only``: when set, the tests this kind runs (the rest of the suite runs on the others).
    """

    open: Callable[[pytest.FixtureRequest, Path], AbstractAsyncContextManager[str]]
    follows_clock: bool = True
    plain_defaults: bool = True
    only: frozenset[str] | None = None


# The part of the suite that runs on the cluster: every area of the contract (send, receive,
# ack, nack, batches, dedupe, FIFO, tenancy, receipts, queue and metadata calls, listeners,
# concurrency, bad input), within the CI budget for it (each test places and drops queues
# through the manager, a second or so each on an idle machine). Tests that move an injected
# clock cannot run on node processes at all (see follows_clock).
CLUSTER_TESTS = frozenset(
    {
        "test_listeners_hear_sends_and_nacks",
        "test_concurrent_producers_and_consumers_account_for_every_message",
        "test_one_bad_operation_does_not_fail_the_others_of_its_commit",
        "test_strings_that_cannot_be_stored_are_invalid_requests",
        "test_batch_send_gives_one_result_per_entry_in_order",
        "test_ack_reports_bad_receipts_without_failing_good_ones",
        "test_nack_makes_visible_now",
        "test_receive_respects_max_and_best_effort_order",
        "test_send_to_missing_queue_raises_for_the_whole_call",
        "test_malformed_receipts_fail_cleanly",
        "test_fifo_groups_proceed_in_parallel",
        "test_dedupe_within_one_batch",
        "test_dedupe_is_per_queue_and_tenant",
        "test_same_queue_name_in_two_tenants_keeps_messages_apart",
        "test_update_queue_changes_mutable_attributes",
        "test_meta_only_if_absent_races_have_one_winner",
        "test_delete_queue_removes_it_and_its_messages",
        "test_old_receipts_do_not_work_on_a_recreated_queue",
    }
)


# No test is copied: a kind joins by adding one entry here.
STORE_KINDS: dict[str, StoreKind] = {
    "lmdb": StoreKind(lambda request, root: lmdb_store(root)),
    "cluster": StoreKind(cluster_store, follows_clock=False, plain_defaults=False, only=CLUSTER_TESTS),
}


def kinds_for(test: Callable[..., Any]) -> list[str]:
    """The kinds a contract test can run on, judged from what its source uses."""
    source = inspect.getsource(test)
    uses_clock = "clock" in source or "CLOCK_START" in source
    uses_defaults = "QueueAttributes(" in source
    return sorted(
        name
        for name, kind in STORE_KINDS.items()
        if (kind.follows_clock or not uses_clock)
        and (kind.plain_defaults or not uses_defaults)
        and (kind.only is None or test.__name__ in kind.only)
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
