"""Rates in the ``limits`` library's notation: ``100/second``, several joined by ``;``.

A :class:`Rate` keeps the text it was written as (normalized), the parsed ``limits``
items (for the moving-window strategy) and each window as plain numbers (amount, seconds)
for the limiter's own counters, so a limits document round-trips and the limiter never
parses on the hot path. Parsing is ``limits``' public ``parse_many``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from limits import RateLimitItem, parse_many

from .errors import InvalidLimit

# The granularities API.md promises; `limits` also knows month and year, which make no
# sense for a message gateway's counters (and would keep Redis keys for a year).
GRANULARITIES = ("second", "minute", "hour", "day")
MAX_RATE_CHARS = 200


class RateWindow(NamedTuple):
    """One window of a rate: at most ``amount`` per ``window_s`` seconds."""

    amount: int
    window_s: int


@dataclass(frozen=True, slots=True)
class Rate:
    """One or more windows that all apply (``10/second;500/minute``)."""

    text: str
    items: tuple[RateLimitItem, ...]
    windows: tuple[RateWindow, ...]

    def __str__(self) -> str:
        return self.text


def parse_rate(text: object) -> Rate:
    """Parse ``N/second|minute|hour|day`` (``;``-joined); :class:`InvalidLimit` otherwise."""
    if not isinstance(text, str) or not 0 < len(text) <= MAX_RATE_CHARS:
        raise InvalidLimit(f"a rate is a string like '100/second', got {text!r}")
    try:
        items = parse_many(text)
    except ValueError:
        raise InvalidLimit(f"cannot parse rate {text!r}: expected N/second|minute|hour|day") from None
    for item in items:
        if item.GRANULARITY.name not in GRANULARITIES:
            raise InvalidLimit(f"rate {text!r}: only second, minute, hour and day windows are supported")
        if item.amount < 1:
            raise InvalidLimit(f"rate {text!r}: the amount must be at least 1")
    normalized = ";".join(_format(item) for item in items)
    return Rate(
        normalized, tuple(items), tuple(RateWindow(item.amount, window_seconds(item)) for item in items)
    )


def _format(item: RateLimitItem) -> str:
    unit = item.GRANULARITY.name
    return f"{item.amount}/{unit}" if item.multiples == 1 else f"{item.amount}/{item.multiples} {unit}s"


def window_seconds(item: RateLimitItem) -> int:
    """The length of an item's window in seconds."""
    return int(item.get_expiry())
