"""The sliding window counter's arithmetic, on a clock the test moves (``memory://``).

What docs/throttling.md promises: the previous window's hits weigh as the part of it that
still overlaps; ``Retry-After`` is when there is room again (at most one window); a
counter starts afresh when its rate changes or both its windows are over.
"""

from __future__ import annotations

from tests.conftest import ManualClock
from throttling import Decision, Limiter, Rule, SharedStateHealth, Window, parse_rate, parse_shared_state_url
from throttling.local_counters import PRUNE_FIRST_AT, LocalCounters

# Midnight UTC: minute, hour and day windows all start here.
START = 86_400.0 * 19_675


def rule(rate: str, *ids: str) -> Rule:
    return Rule("tenant-send", parse_rate(rate), ids or ("t",))


def limiter(clock: ManualClock) -> Limiter:
    return Limiter(parse_shared_state_url("memory://"), SharedStateHealth("memory"), clock=clock)


async def hits(limiter: Limiter, r: Rule, count: int) -> list[Decision]:
    return [await limiter.check([r]) for _ in range(count)]


async def test_the_previous_windows_hits_weigh_as_much_of_it_as_still_overlaps() -> None:
    clock = ManualClock(START)
    lim, r = limiter(clock), rule("10/minute")
    decisions = await hits(lim, r, 10)
    assert all(d.allowed for d in decisions)
    assert [d.windows[0].remaining for d in decisions] == list(range(9, -1, -1))
    assert not (await lim.check([r])).allowed

    # The next minute: the 10 hits still weigh 10 at its start, 9 after 6 s, 5 at its middle.
    clock.now = START + 60
    refused = await lim.check([r])
    assert not refused.allowed and refused.retry_after_s == 6
    clock.now = START + 66
    (allowed, again) = await hits(lim, r, 2)
    assert allowed.allowed and allowed.windows[0].remaining == 0
    # 1 hit now and 10 * (54 / 60) = 9 before: room for one more when the old weigh 8, at 72 s.
    assert not again.allowed and again.retry_after_s == 6
    clock.now = START + 90
    decisions = await hits(lim, r, 5)
    assert [d.allowed for d in decisions] == [True] * 4 + [False]
    assert [d.windows[0].remaining for d in decisions[:4]] == [3, 2, 1, 0]

    # Both windows over: a fresh counter.
    clock.now = START + 180
    decisions = await hits(lim, r, 11)
    assert [d.allowed for d in decisions] == [True] * 10 + [False]


async def test_retry_after_is_when_there_is_room_at_most_one_window() -> None:
    clock = ManualClock(START)
    lim, r = limiter(clock), rule("3/hour")
    decisions = await hits(lim, r, 4)
    # Allowed with room: t is the current hour's end.
    assert [(w.remaining, w.reset_s) for d in decisions[:2] for w in d.windows] == [(2, 3600), (1, 3600)]
    # The hour's own hits fill it: room comes back a third of the next hour after it ends
    # (3 hits weigh 2 then); the answer says one window, and the next answer the rest.
    assert not decisions[3].allowed and decisions[3].retry_after_s == 3600
    clock.now = START + 1800
    refused = await lim.check([r])
    assert not refused.allowed and refused.retry_after_s == 1800 + 1200
    assert refused.windows[0].reset_s == 3000 and refused.windows[0].remaining == 0
    clock.now = START + 3600 + 1199
    assert not (await lim.check([r])).allowed
    clock.now = START + 3600 + 1200
    allowed = await lim.check([r])
    assert allowed.allowed and allowed.windows[0].remaining == 0


async def test_every_window_of_a_rate_counts_and_the_longest_wait_is_the_answer() -> None:
    clock = ManualClock(START)
    lim, r = limiter(clock), rule("2/second;3/minute")
    decisions = await hits(lim, r, 3)
    assert [d.allowed for d in decisions] == [True, True, False]
    second, minute = decisions[2].windows
    assert (second.policy, minute.policy) == ("tenant-send-1s", "tenant-send-60s")
    # The second refused; the minute allowed, and what a window allows is spent.
    assert decisions[2].retry_after_s == 1 and minute.remaining == 0
    clock.now = START + 2
    refused = await lim.check([r])
    # The minute is full of its own hits: one window, as above.
    assert not refused.allowed and refused.retry_after_s == 60


async def test_a_changed_rate_starts_its_counters_afresh() -> None:
    clock = ManualClock(START)
    lim = limiter(clock)
    assert [d.allowed for d in await hits(lim, rule("2/hour"), 3)] == [True, True, False]
    fresh = await lim.check([rule("3/hour")])
    assert fresh.allowed and fresh.windows[0].remaining == 2


async def test_a_request_costing_more_than_is_left_is_refused_and_counts_nothing() -> None:
    clock = ManualClock(START)
    lim, r = limiter(clock), rule("10/minute")
    assert (await lim.check([r], cost=7)).windows[0].remaining == 3
    refused = await lim.check([r], cost=4)
    assert not refused.allowed and refused.windows[0].remaining == 3
    assert (await lim.check([r], cost=3)).allowed


def test_counters_past_both_their_windows_are_forgotten() -> None:
    clock = ManualClock(START)
    counters = LocalCounters(clock)
    for n in range(PRUNE_FIRST_AT):
        counters.check([rule("5/second", str(n))], 1)
    assert len(counters) == PRUNE_FIRST_AT
    clock.now = START + 1.5  # every counter still in its previous window: kept
    counters.check([rule("5/second", "late")], 1)
    assert len(counters) == PRUNE_FIRST_AT + 1
    clock.now = START + 2  # now both windows of the first ones are over
    for n in range(PRUNE_FIRST_AT):
        counters.check([rule("5/second", f"new-{n}")], 1)
    assert len(counters) <= PRUNE_FIRST_AT + 1


def test_a_decision_reports_its_windows_as_counted_whenever_they_are_read() -> None:
    """Windows are built when read (throttling/decision.py, ``CountedWindows``): a decision
    read after later checks still says what its own check counted."""
    counters = LocalCounters(ManualClock(START))
    rules = (rule("10/minute"),)
    first = counters.check(rules, 1)
    assert type(first.report) is list  # nothing built at the check
    later = [counters.check(rules, 1) for _ in range(3)]
    assert first.windows == first.windows == (Window("tenant-send", 10, 60, 9, 60),)
    assert [d.windows[0].remaining for d in later] == [8, 7, 6]
    # A window left without room is built at the check (its reset reads the counter then).
    for _ in range(6):
        counters.check(rules, 1)
    refused = counters.check(rules, 1)
    assert not refused.allowed and refused.windows == (Window("tenant-send", 10, 60, 0, 60),)


def test_tuples_of_rules_share_their_counters_with_every_other_caller() -> None:
    """A tuple's counters are remembered by its identity; one rule is still one counter."""
    counters = LocalCounters(ManualClock(START))
    r = rule("5/hour", "shared")
    first, twin = (r,), (rule("5/hour", "shared"),)
    remaining = [counters.check(c, 1).windows[0].remaining for c in (first, twin, [r], first)]
    assert remaining == [4, 3, 2, 1]


def test_a_remembered_tuple_lets_its_counters_go_with_clear_and_with_a_prune() -> None:
    clock = ManualClock(START)
    counters = LocalCounters(clock)
    r = rule("5/second", "kept")
    remembered = (r,)
    assert [counters.check(remembered, 1).windows[0].remaining for _ in range(2)] == [4, 3]
    counters.clear(r)
    assert counters.check(remembered, 1).windows[0].remaining == 4  # afresh
    clock.now = START + 2  # both its windows over: the next prune drops its counter
    for n in range(PRUNE_FIRST_AT):
        counters.check([rule("5/second", f"other-{n}")], 1)
    # The tuple and a list of the same rule count on one counter again (a tuple left on
    # the counter the prune dropped would count apart from the list: 4 and 4).
    assert [counters.check(c, 1).windows[0].remaining for c in (remembered, [r])] == [4, 3]
