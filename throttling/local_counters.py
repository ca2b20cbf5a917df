"""The sliding window counters of one process (``memory://``): a dict and arithmetic, no awaits.

The hot path is written out in one loop (a multiplication per window, a snapshot per window
reported, built into a ``Window`` only if read: :data:`~throttling.decision.CountedWindows`):
about a microsecond per counter, where ``limits``' memory storage, called through its public
strategy API, cost 15-20 (bench/throttle_bench.py).

A request's rules come as one tuple the gateway keeps for every request of its kind
(``gateway/limits/enforcer.py``), so the counters of a tuple of rules are looked up once and
remembered by the tuple's identity (the memo holds the tuple, so the identity cannot be
reused while remembered; a tuple cannot change). Rules in a list are looked up each time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from .decision import CountedWindows, Decision, Rule, Window, policy_name
from .window_counter import WindowCounter

# Prune counters whose windows are both over once this many exist, then at twice what is left.
PRUNE_FIRST_AT = 10_000
# Tuples of rules whose counters are remembered; all forgotten when full, or when counters go.
MAX_REMEMBERED = 10_000

GroupKey = tuple[tuple[str, ...], str]
# A named tuple built without its generated __new__ (a Python call): half the cost.
_decision = tuple.__new__


class LocalCounters:
    """Counters by (identifiers, rate): changing a rate starts its counters afresh."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._groups: dict[GroupKey, tuple[WindowCounter, ...]] = {}
        self._prune_at = PRUNE_FIRST_AT
        # id(rules) -> (rules, their counters in order): see the module docstring.
        self._remembered: dict[int, tuple[Sequence[Rule], tuple[WindowCounter, ...]]] = {}

    def check(self, rules: Sequence[Rule], cost: int) -> Decision:
        """Count ``cost`` against every window of every rule (each its own counter)."""
        now = self._clock()
        known = self._remembered.get(id(rules))
        if known is None or known[0] is not rules:
            known = self._counters(rules, now)
        counted: CountedWindows = []
        allowed = True
        retry_after = 0
        for counter in known[1]:
            end = counter.end
            if now >= end:
                counter.roll(now)
                end = counter.end
            room = counter.amount - counter.current - counter.previous * (end - now) / counter.window_s
            if room >= cost:
                counter.current += cost
                room -= cost
                if room >= cost:
                    # The common case: room left; its window is built only if read.
                    counted.append((counter, room, end - now))
                    continue
                remaining = int(room) if room > 0 else 0
                reset = counter.reset_s(now, remaining, cost)
            else:
                remaining = int(room) if room > 0 else 0
                reset = counter.reset_s(now, remaining, cost)
                allowed = False
                retry_after = max(retry_after, reset)
            counted.append(Window(counter.policy, counter.amount, counter.window_s, remaining, reset))
        return _decision(Decision, (allowed, counted, retry_after, False))

    def _counters(
        self, rules: Sequence[Rule], now: float
    ) -> tuple[Sequence[Rule], tuple[WindowCounter, ...]]:
        """The counters of ``rules``, in order (made if new), remembered for a tuple."""
        if len(self._groups) + len(rules) >= self._prune_at:
            self._prune(now)  # before the lookups: a counter looked up is never dropped after
        counters: list[WindowCounter] = []
        for rule in rules:
            group = self._groups.get((rule.identifiers, rule.rate.text))
            if group is None:
                group = self._groups[(rule.identifiers, rule.rate.text)] = tuple(
                    WindowCounter(policy_name(rule, window.window_s), window.amount, window.window_s, now)
                    for window in rule.rate.windows
                )
            counters.extend(group)
        known = (rules, tuple(counters))
        if type(rules) is tuple:
            if len(self._remembered) >= MAX_REMEMBERED:
                self._remembered.clear()
            self._remembered[id(rules)] = known
        return known

    def _prune(self, now: float) -> None:
        """Drop counters past both their windows (a fresh counter says the same)."""
        self._groups = {
            key: group
            for key, group in self._groups.items()
            if any(now - counter.start < 2 * counter.window_s for counter in group)
        }
        self._prune_at = max(PRUNE_FIRST_AT, 2 * len(self._groups))
        self._remembered.clear()  # they may hold counters dropped here

    def clear(self, rule: Rule) -> None:
        """Forget a rule's counters."""
        self._groups.pop((rule.identifiers, rule.rate.text), None)
        self._remembered.clear()

    def __len__(self) -> int:
        return len(self._groups)
