"""The limiter on both storages: counts, windows, retry-after, several rules, fail open or closed."""

from __future__ import annotations

import pytest

from tests.conftest import wait_for
from tests.fixtures.redis_server import RedisServer
from throttling import Decision, InvalidLimit, Rule, SharedState, SharedStateUnavailable, parse_rate


def rule(policy: str, rate: str, *ids: str) -> Rule:
    return Rule(policy, parse_rate(rate), ids)


async def test_no_rules_is_allowed_without_windows(state: SharedState) -> None:
    decision = await state.limiter.check([])
    assert decision.allowed and decision.windows == () and not decision.degraded


async def test_counts_down_then_refuses_with_retry_after(state: SharedState, unique: str) -> None:
    r = rule("tenant-send", "3/hour", unique)
    remaining = []
    for _ in range(3):
        decision = await state.limiter.check([r])
        assert decision.allowed
        (window,) = decision.windows
        assert (window.policy, window.quota, window.window_s) == ("tenant-send", 3, 3600)
        remaining.append(window.remaining)
        assert 0 < window.reset_s <= 3600
    assert remaining == [2, 1, 0]
    refused = await state.limiter.check([r])
    assert not refused.allowed
    assert refused.windows[0].remaining == 0
    assert 1 <= refused.retry_after_s <= 3600


async def test_counters_are_separate_per_identifier(state: SharedState, unique: str) -> None:
    assert (await state.limiter.check([rule("key-send", "1/hour", unique, "a")])).allowed
    assert (await state.limiter.check([rule("key-send", "1/hour", unique, "b")])).allowed
    assert not (await state.limiter.check([rule("key-send", "1/hour", unique, "a")])).allowed


async def test_every_rule_and_window_is_reported_and_the_tightest_refuses(
    state: SharedState, unique: str
) -> None:
    rules = [rule("tenant-send", "100/second;2/hour", unique, "t"), rule("queue-send", "50/minute", unique)]
    first = await state.limiter.check(rules)
    assert [w.policy for w in first.windows] == ["tenant-send-1s", "tenant-send-3600s", "queue-send"]
    assert [w.remaining for w in first.windows] == [99, 1, 49]
    assert (await state.limiter.check(rules)).allowed
    third = await state.limiter.check(rules)
    assert not third.allowed
    # The hour window is the one that refused; its reset is what the client must wait for.
    assert third.retry_after_s > 1


async def test_cost_counts_several(state: SharedState, unique: str) -> None:
    r = rule("tenant-send", "10/hour", unique)
    assert (await state.limiter.check([r], cost=7)).windows[0].remaining == 3
    assert not (await state.limiter.check([r], cost=4)).allowed


@pytest.mark.parametrize("text", ["", "x", "10/year", "0/second", "10/fortnight", 5])
def test_bad_rates_are_refused(text: object) -> None:
    with pytest.raises(InvalidLimit):
        parse_rate(text)


def test_rates_are_normalized() -> None:
    assert parse_rate("10 per second; 5/2 minutes").text == "10/second;5/2 minutes"


def redis_is_up(state: SharedState) -> bool:
    """Read afresh: after ``assert not state.health.up`` mypy would take it as False for good."""
    return state.health.up


async def test_redis_outage_fails_open_logs_once_and_recovers(
    redis_server: RedisServer, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    state = SharedState(redis_server.url, retry_interval_s=0.05, timeout_s=0.2)
    await state.start()
    try:
        r = rule("tenant-send", "2/hour", unique)
        assert (await state.limiter.check([r])).allowed
        redis_server.kill()
        outcomes = [await state.limiter.check([r]) for _ in range(5)]
        assert all(d.allowed and d.degraded for d in outcomes)
        assert not state.health.up and state.detail()["status"] == "down"
        down_logs = [m for m in caplog.messages if "unreachable" in m]
        assert len(down_logs) == 1
        redis_server.restart()  # empty: the counters start again
        decisions: list[Decision] = []

        async def counted_again() -> bool:
            decisions.append(await state.limiter.check([r]))
            return not decisions[-1].degraded

        await wait_for(counted_again, what="the limiter to use Redis again")
        assert decisions[-1].allowed and decisions[-1].windows[0].remaining == 1
        assert redis_is_up(state) and state.detail()["status"] == "up"
    finally:
        await state.close()


async def test_redis_outage_fails_closed_when_asked(redis_server: RedisServer, unique: str) -> None:
    state = SharedState(redis_server.url, fail_closed=True, timeout_s=0.2)
    await state.start()
    try:
        redis_server.kill()
        with pytest.raises(SharedStateUnavailable):
            await state.limiter.check([rule("tenant-send", "2/hour", unique)])
        # No rules: nothing to ask Redis, so nothing to refuse.
        assert (await state.limiter.check([])).allowed
    finally:
        await state.close()


def test_unsupported_urls_are_refused() -> None:
    with pytest.raises(InvalidLimit):
        SharedState("memcached://localhost:11211")
