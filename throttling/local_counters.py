"""The sliding window counters of one process (``memory://``): a dict and arithmetic, no awaits.

The hot path is written out in one loop (a dict lookup per rule, a multiplication per
window, a tuple per window reported): about a microsecond per counter, where ``limits``'
memory storage, called through its public strategy API, cost 15-20 (bench/throttle_bench.py).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

from .decision import Decision, Rule, Window, policy_name
from .window_counter import WindowCounter

# Prune counters whose windows are both over once this many exist, then at twice what is left.
PRUNE_FIRST_AT = 10_000

GroupKey = tuple[tuple[str, ...], str]
# Named tuples built without their generated __new__ (a Python call): half the cost.
_window = tuple.__new__
_decision = tuple.__new__
_ceil = math.ceil


class LocalCounters:
    """Counters by (identifiers, rate): changing a rate starts its counters afresh."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._groups: dict[GroupKey, tuple[WindowCounter, ...]] = {}
        self._prune_at = PRUNE_FIRST_AT

    def check(self, rules: Sequence[Rule], cost: int) -> Decision:
        """Count ``cost`` against every window of every rule (each its own counter)."""
        now = self._clock()
        groups = self._groups
        windows: list[Window] = []
        allowed = True
        retry_after = 0
        for rule in rules:
            group = groups.get((rule.identifiers, rule.rate.text))
            if group is None:
                group = self._add(rule, now)
            for counter in group:
                end = counter.end
                if now >= end:
                    counter.roll(now)
                    end = counter.end
                window_s = counter.window_s
                room = counter.amount - counter.current - counter.previous * (end - now) / window_s
                if room >= cost:
                    counter.current += cost
                    room -= cost
                    if room >= cost:
                        # The common case, without a call: room left, t is the window's end.
                        windows.append(
                            _window(
                                Window,
                                (counter.policy, counter.amount, window_s, int(room), _ceil(end - now)),
                            )
                        )
                        continue
                    remaining = int(room) if room > 0 else 0
                    reset = counter.reset_s(now, remaining, cost)
                else:
                    remaining = int(room) if room > 0 else 0
                    reset = counter.reset_s(now, remaining, cost)
                    allowed = False
                    retry_after = max(retry_after, reset)
                windows.append(Window(counter.policy, counter.amount, window_s, remaining, reset))
        return _decision(Decision, (allowed, tuple(windows), retry_after, False))

    def _add(self, rule: Rule, now: float) -> tuple[WindowCounter, ...]:
        if len(self._groups) >= self._prune_at:
            self._prune(now)
        group = tuple(
            WindowCounter(policy_name(rule, window.window_s), window.amount, window.window_s, now)
            for window in rule.rate.windows
        )
        self._groups[(rule.identifiers, rule.rate.text)] = group
        return group

    def _prune(self, now: float) -> None:
        """Drop counters past both their windows (a fresh counter says the same)."""
        self._groups = {
            key: group
            for key, group in self._groups.items()
            if any(now - counter.start < 2 * counter.window_s for counter in group)
        }
        self._prune_at = max(PRUNE_FIRST_AT, 2 * len(self._groups))

    def clear(self, rule: Rule) -> None:
        """Forget a rule's counters."""
        self._groups.pop((rule.identifiers, rule.rate.text), None)

    def __len__(self) -> int:
        return len(self._groups)
