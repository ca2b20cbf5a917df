"""One window of one rule: a sliding window counter's state and its arithmetic, in plain Python.

The sliding window counter keeps two numbers per window length ``w``: the count of the
current fixed window (``[start, start + w)``) and of the one before it. A request at time
``t`` sees ``previous * (start + w - t) / w + current`` as used (the previous window's hits
assumed spread evenly) and passes if that plus its cost is at most the amount. O(1) state
per counter whatever the rate; its error (a burst at a window's end counted as if spread)
is the one documented in docs/throttling.md.

The same class is the whole counter in memory (``LocalCounters``) and the mirror of a
Redis counter (``SharedBudget``'s ``Share``, which adds the units it holds). Times are the
caller's clock, in seconds; in a mirror, ``start`` is the Redis window's start translated
to this process's clock (``end`` is kept beside it: ``start + window_s``).
"""

from __future__ import annotations

import math


class WindowCounter:
    """A sliding window counter: ``amount`` per ``window_s`` seconds."""

    __slots__ = ("amount", "current", "end", "policy", "previous", "start", "window_s")

    def __init__(self, policy: str, amount: int, window_s: int, now: float) -> None:
        self.policy = policy
        self.amount = amount
        self.window_s = window_s
        # Windows aligned on multiples of their length, so a minute window is a clock minute.
        self.start = now - now % window_s
        self.end = self.start + window_s
        self.current = 0
        self.previous = 0

    def roll(self, now: float) -> None:
        """Move to the fixed window holding ``now`` (call when ``now >= start + window_s``)."""
        window_s = self.window_s
        passed = (now - self.start) // window_s
        self.previous = self.current if passed == 1 else 0
        self.current = 0
        self.start += passed * window_s
        self.end = self.start + window_s

    def room(self, now: float) -> float:
        """How much more the window takes at ``now`` (rolled first): may be fractional or negative."""
        if now >= self.end:
            self.roll(now)
        return self.amount - self.current - self.previous * (self.end - now) / self.window_s

    def wait_s(self, now: float, need: int) -> float:
        """Seconds from ``now`` until the window has room for ``need`` more, if nothing else is counted.

        Within the current window the previous one's weight falls linearly; if the current
        count alone leaves no room, the next window must start and let it fall in turn.
        """
        window_s = self.window_s
        free = self.amount - need
        if free < 0:
            return float(window_s)  # more than the whole quota: never; say a window
        end = self.end
        if self.current <= free:
            if self.previous <= 0:
                return 0.0
            return max(0.0, end - (free - self.current) * window_s / self.previous - now)
        return end + window_s - free * window_s / self.current - now

    def reset_s(self, now: float, remaining: int, need: int) -> int:
        """The IETF ``t``: with room left, seconds until the current fixed window ends;
        without, seconds until there is room for ``need`` again, at most one window.

        Between 1 and the window's length. The cap matters only when the current fixed
        window's own hits fill the quota: room then comes back up to a window after it
        ends (the hits, now the previous window's, must lose enough weight); a client that
        retries after one window is told the rest by the next answer.
        """
        if remaining >= need:
            return max(1, math.ceil(self.end - now))
        return max(1, min(self.window_s, math.ceil(self.wait_s(now, need))))
