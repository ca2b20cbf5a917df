"""Reconnect delays: exponential with full jitter, reset after a healthy connection."""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass(slots=True)
class Backoff:
    initial_s: float = 0.1
    max_s: float = 10.0
    factor: float = 2.0
    # Injectable for tests (a seeded ``random.Random``); by default a fresh, unseeded one.
    rng: random.Random = field(default_factory=random.Random, repr=False)
    _attempt: int = field(default=0, init=False)

    def next_delay(self) -> float:
        """The delay before the next attempt: uniform in [0, ceiling] ("full jitter", as in
        AWS's backoff study), so a herd of clients cut at once spreads over the whole window
        instead of its upper half."""
        ceiling = min(self.max_s, self.initial_s * self.factor**self._attempt)
        self._attempt += 1
        return self.rng.uniform(0, ceiling)

    def reset(self) -> None:
        self._attempt = 0
