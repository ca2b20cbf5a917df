"""Reconnect delays: exponential with full jitter, reset after a healthy connection."""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass(slots=True)
class Backoff:
    initial_s: float = 0.1
    max_s: float = 10.0
    factor: float = 2.0
    _attempt: int = field(default=0, init=False)

    def next_delay(self) -> float:
        """The delay before the next attempt; full jitter spreads a herd of reconnects."""
        ceiling = min(self.max_s, self.initial_s * self.factor**self._attempt)
        self._attempt += 1
        return random.uniform(ceiling / 2, ceiling)

    def reset(self) -> None:
        self._attempt = 0
