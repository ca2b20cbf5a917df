"""Helpers shared by the backend tests: opening stores and building messages.

A :class:`StoreFactory` opens backends on one store URL and closes whatever is still
open at teardown, so a test can close and reopen a store (durability, key rotation)
without leaking writer threads.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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

T1 = TenantId("tenant-one")
T2 = TenantId("tenant-two")


def lmdb_url(root: Path) -> str:
    return f"lmdb://{root / 'store'}"


@contextlib.asynccontextmanager
async def lmdb_store(root: Path) -> AsyncIterator[str]:
    yield lmdb_url(root)


# Each backend kind the contract suite runs against: given a scratch directory, bring up
# whatever the kind needs (nothing for lmdb; node processes for a cluster), yield its store
# URL, and tear it down after the test. The cluster backend joins by adding one entry here;
# no test is copied. Tests inject time through StoreOptions.clock, so a kind's nodes must
# honour the options they are opened with (e.g. run in-process under test).
STORE_KINDS: dict[str, Callable[[Path], AbstractAsyncContextManager[str]]] = {
    "lmdb": lmdb_store,
}


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
