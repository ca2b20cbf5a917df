"""Cached records are read once however many requests miss them together, and a change made
while a read is in flight is not undone by that read (gateway/auth/ttl_cache.py).

Against a real embedded store, whose metadata reads are counted and can be held: a miss
under 64 concurrent requests used to read the record 64 times (session 69 counted 143 etcd
reads in 20 s on a cluster gateway), and a read that began before a revocation and ended
after it cached the unrevoked key for a whole TTL."""

from __future__ import annotations

import asyncio
import collections
from typing import Any

import pytest

from backend_store.backend import Backend
from backend_store.errors import Unauthorized
from backend_store.types import TenantId
from gateway.auth.authenticator import Authenticator
from gateway.auth.ttl_cache import TtlCache
from gateway.limits.store import LimitsStore
from tests.conftest import ManualClock

from .test_authenticator import new_key


class HeldReads:
    """A store whose ``meta_get`` calls are counted by key and, while ``holding``, read and
    then wait for :meth:`release` before answering (every other call goes straight to the
    real store)."""

    def __init__(self, backend: Backend) -> None:
        self._backend = backend
        self.reads: collections.Counter[tuple[str, str]] = collections.Counter()
        self.holding = False
        self.waiting = 0
        self._gate = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    async def meta_get(self, namespace: str, key: str) -> bytes | None:
        self.reads[namespace, key] += 1
        value = await self._backend.meta_get(namespace, key)
        if self.holding:  # read, its answer on its way
            self.waiting += 1
            await self._gate.wait()
        return value

    def release(self) -> None:
        self.holding = False
        self._gate.set()

    async def until_waiting(self, n: int) -> None:
        for _ in range(1000):
            if self.waiting >= n:
                return
            await asyncio.sleep(0.001)
        raise AssertionError(f"{self.waiting} reads waiting, not {n}")


@pytest.fixture
def held(backend: Backend) -> HeldReads:
    return HeldReads(backend)


@pytest.fixture
def held_auth(held: HeldReads, cache_clock: ManualClock) -> Authenticator:
    return Authenticator(held, cache_ttl_s=5.0, clock=cache_clock)


async def test_many_requests_missing_one_key_record_read_it_once(
    held_auth: Authenticator, held: HeldReads, cache_clock: ManualClock
) -> None:
    token = await new_key(held_auth, "send:*")
    principal = await held_auth.authenticate(token)
    cache_clock.advance(5.0)  # the key record and the verified token expire together
    held.reads.clear()
    held.holding = True
    calls = [asyncio.create_task(held_auth.authenticate(token)) for _ in range(64)]
    await held.until_waiting(1)
    await asyncio.sleep(0.01)  # every call has met the miss by now
    held.release()
    assert await asyncio.gather(*calls) == [principal] * 64
    assert held.reads[("api_keys", principal.subject)] == 1, held.reads


async def test_a_revocation_during_a_read_is_not_undone_by_it(
    held_auth: Authenticator, held: HeldReads, cache_clock: ManualClock
) -> None:
    token = await new_key(held_auth, "send:*")
    principal = await held_auth.authenticate(token)
    cache_clock.advance(5.0)
    held.holding = True
    before = asyncio.create_task(held_auth.authenticate(token))
    await held.until_waiting(1)
    held.holding = False  # the revocation's own reads go through
    await held_auth.api_keys.revoke(principal.subject)
    held.release()
    # Asked before the revocation: answered from the read that began before it.
    assert await before == principal
    # That read is not cached past the revocation.
    with pytest.raises(Unauthorized, match="revoked"):
        await held_auth.authenticate(token)


async def test_limits_are_read_once_and_a_change_meanwhile_wins(held: HeldReads) -> None:
    limits = LimitsStore(held, cache_ttl_s=5.0)
    tenant = TenantId("acme")
    held.holding = True
    first = [asyncio.create_task(limits.get(tenant)) for _ in range(16)]
    await held.until_waiting(1)
    held.holding = False
    changed = await limits.update(tenant, {"send": "5/second"})
    held.release()
    assert len({id(x) for x in await asyncio.gather(*first)}) == 1
    assert held.reads[("limits", "acme")] == 2  # the 16 callers' one read, the update's own
    assert await limits.get(tenant) == changed


# The cache alone (sans-I/O: a manual clock and futures the test completes).


async def test_a_failed_read_fails_every_waiter_and_caches_nothing() -> None:
    cache: TtlCache[str, int] = TtlCache(5.0, clock=ManualClock())
    gate: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    reads = 0

    async def read() -> int:
        nonlocal reads
        reads += 1
        return await gate

    calls = [asyncio.create_task(cache.load("k", read)) for _ in range(3)]
    await asyncio.sleep(0)
    gate.set_exception(ConnectionError("etcd unreachable"))
    results = await asyncio.gather(*calls, return_exceptions=True)
    assert all(isinstance(r, ConnectionError) for r in results) and reads == 1

    async def seven() -> int:
        return 7

    assert (await cache.load("k", seven))[0] == 7  # read again, not the failure


async def test_a_cancelled_caller_does_not_cancel_the_read_others_wait_for() -> None:
    clock = ManualClock()
    cache: TtlCache[str, int] = TtlCache(5.0, clock=clock)
    gate: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    async def read() -> int:
        return await gate

    first = asyncio.create_task(cache.load("k", read))
    second = asyncio.create_task(cache.load("k", read))
    await asyncio.sleep(0)
    first.cancel()
    await asyncio.sleep(0)
    gate.set_result(3)
    assert await second == (3, clock.now + 5.0)
    assert first.cancelled()
    assert cache.lookup("k") == (3, clock.now + 5.0)


async def test_an_expiry_counts_from_before_the_read_and_refused_values_are_not_kept() -> None:
    clock = ManualClock()
    cache: TtlCache[str, int | None] = TtlCache(5.0, clock=clock)

    async def slow() -> int:
        clock.advance(2.0)  # the read took 2 s
        return 1

    assert await cache.load("k", slow) == (1, clock.now + 3.0)

    async def absent() -> None:
        return None

    assert (await cache.load("gone", absent, keep=lambda v: v is not None))[0] is None
    assert cache.lookup("gone") is None
