"""A circuit breaker per node, so one slow or dead node does not stall the others.

Each request to a node has its own timeout; a node whose requests keep failing (timeouts,
a connection that will not dial) is *open* for a cool-down: requests for partitions it
leads fail at once with ``unavailable`` (and a ``retry_after_s``) instead of queueing
behind it, while partitions led elsewhere carry on. After the cool-down one trial request
goes through (*half-open*); its success closes the breaker, its failure opens it again for
twice as long (up to a cap). Store errors (``queue_not_found``, ``invalid_receipt``) are
answers, not failures: only transport trouble counts.

A request for a term newer than every one that failed (its epoch, an etcd revision, is
higher) goes through as the trial at once: the node won a campaign since, so it is back (a
restart) or was never down. Without that a node that came back and led again was refused
for the rest of a cool-down that had doubled while it was dead (found by the random-fault
test, seed 9, session 31: a leader killed for 0.66 s led again 2.2-2.8 s after the kill,
and its partition's sends waited up to 4.0 s for the breaker).

A request refused while a trial is out waits for the trial's verdict (:meth:`Breaker.verdict`),
not for the cool-down alone: a node back in a newer term was tried by one request, which
succeeded at once, while another, refused 3 ms before, slept out the rest of a doubled
cool-down, 1.8 s (simulation seed ``minority`` 401977, session 39).

A trial that ends without a verdict (given up because the map shows a newer leader, or
cancelled by its caller) hands the trial on (:meth:`Breaker.abandon`). Before, it kept
``trial_out`` set for good: the breaker stayed open, and every partition the node led was
refused by that gateway until it restarted (simulation seeds ``restore`` 30325 and 30355,
session 33, found once the simulation ran the production request loop).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ...errors import Unavailable


class NodeUnavailable(Unavailable):
    """The node's breaker is open (it failed recently); the request was not sent."""


@dataclass(slots=True)
class BreakerSettings:
    failures_to_open: int = 3
    cooldown_s: float = 0.5
    max_cooldown_s: float = 5.0


@dataclass(slots=True)
class Breaker:
    """One node's breaker: closed, open until ``open_until``, or half-open (one trial out)."""

    settings: BreakerSettings
    clock: Callable[[], float] = time.monotonic
    failures: int = 0
    cooldown_s: float = 0.0
    open_until: float = 0.0
    trial_out: bool = False
    opened: int = field(default=0)
    # The newest epoch (term) a failed request was for.
    failed_epoch: int = 0
    _verdict: asyncio.Event | None = None

    @property
    def state(self) -> str:
        if self.failures < self.settings.failures_to_open:
            return "closed"
        return "open" if self.clock() < self.open_until or self.trial_out else "half_open"

    def before_request(self, node_id: str, epoch: int = 0) -> bool:
        """Raise :class:`NodeUnavailable` if the request, for a term of ``epoch``, may not go
        to the node now; else return whether it goes as the trial (its verdict, or
        :meth:`abandon`, is then due)."""
        state = self.state
        if state == "closed":
            return False
        if state == "half_open" or (epoch > self.failed_epoch and not self.trial_out):
            self.trial_out = True  # this request is the trial; the others wait for its verdict
            return True
        error = NodeUnavailable(f"node {node_id} is failing; not sending to it for now")
        error.retry_after_s = max(0.05, self.open_until - self.clock())
        raise error

    def verdict(self) -> asyncio.Event:
        """Set at the next verdict on the node (or a trial given up): what a refused request
        waits for besides its ``retry_after_s``, to ask :meth:`before_request` again."""
        if self._verdict is None:
            self._verdict = asyncio.Event()
        return self._verdict

    def _heard(self) -> None:
        event, self._verdict = self._verdict, None
        if event is not None:
            event.set()

    def abandon(self) -> None:
        """The trial ended without a verdict: the next request may be the trial."""
        self.trial_out = False
        self._heard()

    def succeeded(self) -> None:
        self.failures = 0
        self.cooldown_s = 0.0
        self.trial_out = False
        self._heard()

    def failed(self, epoch: int = 0) -> None:
        self.failed_epoch = max(self.failed_epoch, epoch)
        self.failures += 1
        self.trial_out = False
        self._heard()
        if self.failures >= self.settings.failures_to_open:
            self.cooldown_s = (
                self.settings.cooldown_s
                if self.cooldown_s == 0
                else min(self.cooldown_s * 2, self.settings.max_cooldown_s)
            )
            self.open_until = self.clock() + self.cooldown_s
            self.opened += 1


class NodeHealth:
    """The breakers of every node this gateway talks to, by node id."""

    def __init__(
        self, settings: BreakerSettings | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.settings = settings or BreakerSettings()
        self._clock = clock
        self._breakers: dict[str, Breaker] = {}

    def breaker(self, node_id: str) -> Breaker:
        breaker = self._breakers.get(node_id)
        if breaker is None:
            breaker = self._breakers[node_id] = Breaker(self.settings, self._clock)
        return breaker

    def states(self) -> dict[str, str]:
        return {node: b.state for node, b in sorted(self._breakers.items())}
