"""The observe point push delivery reports outcomes to (usage, and later metrics).

``push`` may not import ``gateway``, so the interface lives here and the gateway hands
an implementation in (``gateway/usage/observe.py``). Calls are made on the event loop,
once per outcome or per delivered batch, never per frame parsed; implementations must
be cheap and must not block.

Arguments: ``operation`` and ``transport`` are the values of
``gateway.usage.record.Operation`` / ``Transport`` (plain strings here, so push needs
no import from the gateway); ``outcome`` is ``"ok"`` or an error code; ``count`` is
messages (or connections, requests); ``nbytes`` is message body bytes.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol


class Observer(Protocol):
    def observe(
        self,
        tenant: str,
        queue: str,
        operation: str,
        transport: str,
        outcome: str = "ok",
        count: int = 1,
        nbytes: int = 0,
        latency_s: float | None = None,
    ) -> None:
        """Record ``count`` units of ``operation`` and at most one latency observation."""

    def observe_latencies(
        self,
        tenant: str,
        queue: str,
        operation: str,
        transport: str,
        nbytes: int,
        latencies_s: Iterable[float],
    ) -> None:
        """Record one successful unit per latency (a batch of delivered messages)."""


class NullObserver:
    """Records nothing (usage recording off, tests of push alone)."""

    def observe(
        self,
        tenant: str,
        queue: str,
        operation: str,
        transport: str,
        outcome: str = "ok",
        count: int = 1,
        nbytes: int = 0,
        latency_s: float | None = None,
    ) -> None:
        return None

    def observe_latencies(
        self,
        tenant: str,
        queue: str,
        operation: str,
        transport: str,
        nbytes: int,
        latencies_s: Iterable[float],
    ) -> None:
        return None
