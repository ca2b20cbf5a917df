"""Rate-limit counters in a real Redis, shared by several limiters (one per gateway), spent through local shares.

The promises of docs/throttling.md ("How far a limit can be passed"): together the
gateways let through at most ``N * share`` more than the limit, a gateway that holds
units it does not use gives them back after the lease, small limits are exact, what
concurrent requests ask of Redis goes in one call, and nothing held is spent while
Redis is down. Each limiter here is a gateway's (its own connections and shares); the
same through real ``pushgate serve`` processes is in ``test_two_gateways.py``.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator

import pytest

from tests.conftest import scaled, wait_for
from tests.fixtures.redis_server import RedisServer
from throttling import Limiter, Rule, SharedState, SharedStateUnavailable, parse_rate
from throttling.shared_budget import LOCAL_SHARE, SharedBudget


def rule(rate: str, *ids: str) -> Rule:
    return Rule("queue-send", parse_rate(rate), ids)


def budget(limiter: Limiter) -> SharedBudget:
    shared = limiter.shared_budget
    assert shared is not None
    return shared


@pytest.fixture
async def gateways(redis_url: str) -> AsyncIterator[list[SharedState]]:
    states = [SharedState(redis_url) for _ in range(3)]
    for state in states:
        await state.start()
    try:
        yield states
    finally:
        for state in states:
            await state.close()


async def drain(limiter: Limiter, r: Rule, allowed: list[int]) -> None:
    """Check until refused, counting what was allowed."""
    while True:
        decision = await limiter.check([r])
        if not decision.allowed:
            assert decision.windows[0].remaining == 0 and decision.retry_after_s >= 1
            return
        allowed.append(1)


async def test_gateways_sharing_a_counter_stay_within_the_documented_bound(
    gateways: list[SharedState], unique: str
) -> None:
    r = rule("1000/hour", unique)
    share = math.floor(1000 * LOCAL_SHARE)
    assert share == 10
    allowed: list[int] = []
    # Four concurrent clients on each of three gateways, until every one is refused.
    await asyncio.gather(*(drain(g.limiter, r, allowed) for g in gateways for _ in range(4)))
    bound = len(gateways) * share
    assert 1000 - bound <= len(allowed) <= 1000 + bound, len(allowed)
    calls = sum(budget(g.limiter).calls for g in gateways)
    print(f"\n{len(allowed)} allowed of 1000 through 3 gateways, {calls} Redis calls")
    # The point of the shares: far fewer Redis calls than requests.
    assert calls < len(allowed) / 3


async def test_a_limit_below_a_share_of_one_is_counted_exactly_across_gateways(
    gateways: list[SharedState], unique: str
) -> None:
    r = rule("50/hour", unique)  # 1% of 50 is below one unit: every request asks Redis
    remaining = []
    for n in range(50):
        decision = await gateways[n % 3].limiter.check([r])
        assert decision.allowed
        remaining.append(decision.windows[0].remaining)
    assert remaining == list(range(49, -1, -1))
    for g in gateways:
        assert not (await g.limiter.check([r])).allowed


async def test_what_concurrent_requests_ask_of_redis_goes_in_one_call(
    gateways: list[SharedState], unique: str
) -> None:
    limiter = gateways[0].limiter
    before = budget(limiter).calls
    rules = [rule("10/hour", unique, str(n)) for n in range(50)]  # exact counters, one each
    decisions = await asyncio.gather(*(limiter.check([r]) for r in rules))
    assert all(d.allowed and d.windows[0].remaining == 9 for d in decisions)
    assert budget(limiter).calls - before == 1


async def test_a_refused_counter_does_not_ask_redis_again_before_it_has_room(
    gateways: list[SharedState], unique: str
) -> None:
    limiter = gateways[0].limiter
    r = rule("5/hour", unique)
    for _ in range(5):
        assert (await limiter.check([r])).allowed
    assert not (await limiter.check([r])).allowed
    calls = budget(limiter).calls
    refusals = [await limiter.check([r]) for _ in range(100)]
    assert not any(d.allowed for d in refusals)
    assert all(d.retry_after_s >= 1 for d in refusals)
    # At most one call a second (REFUSED_CACHE_S) while it stays full; this loop is far shorter.
    assert budget(limiter).calls - calls <= 1


async def test_units_an_idle_gateway_holds_go_back_after_the_lease(
    gateways: list[SharedState], unique: str
) -> None:
    a, b = gateways[0].limiter, gateways[1].limiter
    r = rule("1000/hour", unique)
    # A spends a few, fast enough to be given a share, then falls idle.
    for _ in range(20):
        assert (await a.check([r])).allowed
    b_allowed: list[int] = []
    await drain(b, r, b_allowed)
    held_by_a = 1000 - 20 - len(b_allowed)
    assert 0 <= held_by_a <= 1000 * LOCAL_SHARE

    # After the lease (LEASE_S), A's sweeper gives them back: B gets exactly the rest.
    async def b_has_them() -> bool:
        decision = await b.check([r])
        if decision.allowed:
            b_allowed.append(1)
        return decision.allowed

    if held_by_a:
        await wait_for(b_has_them, timeout=scaled(5), what="A's unused units to come back")
        await drain(b, r, b_allowed)
    assert 20 + len(b_allowed) == 1000


async def test_nothing_held_is_spent_while_redis_is_down(redis_server: RedisServer, unique: str) -> None:
    state = SharedState(redis_server.url, fail_closed=True, timeout_s=0.2, retry_interval_s=0.05)
    await state.start()
    try:
        r = rule("100000/hour", unique)
        for _ in range(50):
            assert (await state.limiter.check([r])).allowed
        redis_server.kill()

        async def noticed() -> bool:
            # Down, and past the retry pause: the limiter would ask Redis again now.
            return not state.health.up and state.health.should_try()

        # The broadcaster's subscription sees the connection drop at once.
        await wait_for(noticed, timeout=scaled(5), what="the gateway to notice Redis is gone")
        with pytest.raises(SharedStateUnavailable):
            await state.limiter.check([r])
    finally:
        await state.close()


async def test_windows_are_the_clocks_hours_as_redis_tells_them(
    gateways: list[SharedState], unique: str
) -> None:
    # Redis runs on this machine: its clock is ours. An allowed request's t is the time to the
    # hour's end, whether the answer came from Redis or from the gateway's share.
    r = rule("100000/hour", unique)
    for _ in range(200):
        decision = await gateways[0].limiter.check([r])
        expected = 3600 - time.time() % 3600
        off = abs(decision.windows[0].reset_s - expected)
        assert min(off, 3600 - off) <= 2, (decision.windows[0].reset_s, expected)
    assert budget(gateways[0].limiter).calls < 200  # most came from the share
