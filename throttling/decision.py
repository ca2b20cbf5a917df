"""What the limiter is asked (rules) and what it answers (a decision with its windows)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from limits import RateLimitItem

from .rates import Rate, window_seconds


@dataclass(frozen=True, slots=True)
class Rule:
    """One counter a request passes through: a named policy, its rate, and whose counter it is."""

    policy: str
    rate: Rate
    identifiers: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Window:
    """The state of one window after a request (the IETF fields' numbers)."""

    policy: str
    quota: int
    window_s: int
    remaining: int
    # Seconds until the window has room again (rounded up).
    reset_s: int


@dataclass(frozen=True, slots=True)
class Decision:
    """Allowed or not; ``retry_after_s`` > 0 only when refused.

    ``degraded``: the shared store did not answer and the limiter fails open, so the
    request was allowed without being counted (no windows to report).
    """

    allowed: bool
    windows: tuple[Window, ...] = ()
    retry_after_s: int = 0
    degraded: bool = False


ALLOWED = Decision(True)
DEGRADED = Decision(True, degraded=True)


def window_state(rule: Rule, item: RateLimitItem, remaining: int, reset_time: float) -> Window:
    """A :class:`Window` from a window's remaining count and reset time (epoch seconds)."""
    policy = rule.policy if len(rule.rate.items) == 1 else f"{rule.policy}-{window_seconds(item)}s"
    window_s = window_seconds(item)
    now = time.time()
    reset_s = math.ceil(reset_time - now)
    if reset_s <= 0:
        # The sliding window counter's reset time is "when the next hit frees", which is
        # now for a window with room: report when its current counter rolls over instead.
        reset_s = math.ceil(window_s - now % window_s)
    return Window(policy, item.amount, window_s, remaining, reset_s)
