"""What the limiter is asked (rules) and what it answers (a decision with its windows).

``Rule``, ``Window`` and ``Decision`` are named tuples rather than frozen dataclasses: a
request under three counters builds three rules, three windows and a decision, and a frozen
dataclass's ``__init__`` (one ``object.__setattr__`` per field) cost 0.6-2 us each here,
more than the counting itself. They are as immutable; read them by field name (a named tuple is always truthy:
test ``decision.allowed``, never the decision).

A decision's windows are built when read (:data:`CountedWindows`): building a
``Window`` (a named tuple), its ``remaining`` and its ``reset_s`` cost more than counting
(3 of 7 us per check with three rules, bench/throttle_bench.py), and only an HTTP response
reads them, for its header fields; a WebSocket frame or an SSE stream asks only whether it
may go on. What they need is kept at the count: a counter's name, quota and window never
change, and its room and time left are numbers taken then.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, NamedTuple

from .rates import Rate

if TYPE_CHECKING:
    from .window_counter import WindowCounter


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


_window = tuple.__new__  # a named tuple built without its generated __new__ (a Python call)
_ceil = math.ceil


# A decision's windows as counted, each built into a Window when read: an entry is a
# ``Window`` already (the uncommon case: a window left without room, whose ``reset_s`` reads
# the counter's state, is built at the count), or ``(counter, room, seconds left in its
# fixed window)`` taken at the count, whose ``remaining`` is the room rounded down and
# ``reset_s`` the seconds left rounded up. A plain list: a check fills it with no call.
CountedWindows = list["Window | tuple[WindowCounter, float, float]"]


class Decision(NamedTuple):
    """Allowed or not; ``retry_after_s`` > 0 only when refused.

    ``degraded``: the shared store did not answer and the limiter fails open, so the
    request was allowed without being counted (no windows to report).

    ``report`` is the windows as the limiter left them: a tuple of :class:`Window`, or a
    :data:`CountedWindows` list whose entries are built into windows when read. Read
    :attr:`windows`.
    """

    allowed: bool
    report: tuple[Window, ...] | CountedWindows = ()
    retry_after_s: int = 0
    degraded: bool = False

    @property
    def windows(self) -> tuple[Window, ...]:
        """The state of every window after the request (the IETF fields' numbers)."""
        report = self.report
        if type(report) is tuple:
            return report
        out: list[Window] = []
        for entry in report:
            if isinstance(entry, Window):
                out.append(entry)
                continue
            counter, room, left = entry
            out.append(
                _window(Window, (counter.policy, counter.amount, counter.window_s, int(room), _ceil(left)))
            )
        return tuple(out)


ALLOWED = Decision(True)
DEGRADED = Decision(True, degraded=True)


def policy_name(rule: Rule, window_s: int) -> str:
    """The policy a window reports under: the rule's, with the window appended when its rate has several."""
    return rule.policy if len(rule.rate.windows) == 1 else f"{rule.policy}-{window_s}s"
