"""What the limiter is asked (rules) and what it answers (a decision with its windows).

``Rule``, ``Window`` and ``Decision`` are named tuples rather than frozen dataclasses: a
request under three counters builds three rules, three windows and a decision, and a frozen
dataclass's ``__init__`` (one ``object.__setattr__`` per field) cost 0.6-2 us each here,
more than the counting itself. They are as immutable; read them by field name (a named tuple is always truthy:
test ``decision.allowed``, never the decision).
"""

from __future__ import annotations

from typing import NamedTuple

from .rates import Rate


class Rule(NamedTuple):
    """One counter a request passes through: a named policy, its rate, and whose counter it is."""

    policy: str
    rate: Rate
    identifiers: tuple[str, ...]


class Window(NamedTuple):
    """The state of one window after a request (the IETF fields' numbers)."""

    policy: str
    quota: int
    window_s: int
    remaining: int
    # Seconds until the window has room again when it has none; otherwise until its
    # current fixed window ends. At least 1.
    reset_s: int


class Decision(NamedTuple):
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


def policy_name(rule: Rule, window_s: int) -> str:
    """The policy a window reports under: the rule's, with the window appended when its rate has several."""
    return rule.policy if len(rule.rate.windows) == 1 else f"{rule.policy}-{window_s}s"
