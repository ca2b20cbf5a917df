"""The one observe point for request and delivery outcomes, and its fan-out to sinks.

Every outcome (an HTTP or WebSocket send, a receive, a push to a stream, an ack, a nack,
a connection, a refusal by a rate limit, a failure by code, and the store's dead-letter
moves and expiries) is reported once, to one :class:`Observer`: the gateway builds an
:class:`Observers` with its sinks (the usage aggregator, ``gateway/usage/aggregator.py``,
and the Prometheus message counts, ``gateway/metrics_messages.py``) and hands it to the
push engine and the routes. ``push`` may not import ``gateway``, so the interface lives
here. Calls are made on the event loop, once per outcome kind per request or delivered
batch, never per frame parsed; sinks must be cheap and must not block.

Arguments: ``operation`` is one of :data:`OPERATIONS` and ``transport`` one of
:data:`TRANSPORTS` (plain strings, the values ``gateway.usage.record`` writes);
``outcome`` is :data:`OK` or an error code; ``count`` is messages (connections for
``connect``, requests for ``throttled``); ``nbytes`` is message body bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

OK = "ok"

SEND = "send"  # messages stored; latency: the request
DEDUPLICATED = "deduplicated"  # sends answered as duplicates (nothing stored)
RECEIVE = "receive"  # messages returned by an HTTP receive (pull, long-poll)
PUSH = "push"  # messages written to a WebSocket or SSE stream; latency: sent -> pushed
ACK = "ack"  # messages acked (by the client, or by the gateway for auto-ack streams)
NACK = "nack"  # messages made visible again by the client
CONNECT = "connect"  # WebSocket connections and SSE streams opened
THROTTLED = "throttled"  # requests, frames, connections refused by a rate limit
DEAD_LETTERED = "dead_lettered"  # moved to the dead-letter queue (reported by the store)
EXPIRED = "expired"  # dropped past the queue's retention (reported by the store)
OPERATIONS = (SEND, DEDUPLICATED, RECEIVE, PUSH, ACK, NACK, CONNECT, THROTTLED, DEAD_LETTERED, EXPIRED)

HTTP, WS, SSE, STORE = "http", "ws", "sse", "store"  # STORE: no client asked (dead letters, expiry)
SQS = "sqs"  # the SQS API (gateway/sqs/) on the gateway's own port
TRANSPORTS = (HTTP, WS, SSE, STORE, SQS)


class Observer(Protocol):
    """A sink of outcomes (or the fan-out to several)."""

    def observe(
        self,
        tenant: str,
        queue: str,
        operation: str,
        transport: str,
        outcome: str = OK,
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
        latencies_s: Sequence[float],
    ) -> None:
        """Record one successful unit per latency (a batch of pushed messages, each with its
        age; single-message sends, each with its request's latency)."""


class Observers:
    """The observe point: an :class:`Observer` that forwards each outcome to its sinks.

    With no sink it records nothing (push tested alone); with one it adds one call.
    """

    __slots__ = ("sinks",)

    def __init__(self, sinks: Sequence[Observer] = ()) -> None:
        self.sinks = tuple(sinks)

    def add(self, sink: Observer) -> None:
        self.sinks = (*self.sinks, sink)

    def observe(
        self,
        tenant: str,
        queue: str,
        operation: str,
        transport: str,
        outcome: str = OK,
        count: int = 1,
        nbytes: int = 0,
        latency_s: float | None = None,
    ) -> None:
        for sink in self.sinks:
            sink.observe(tenant, queue, operation, transport, outcome, count, nbytes, latency_s)

    def observe_latencies(
        self,
        tenant: str,
        queue: str,
        operation: str,
        transport: str,
        nbytes: int,
        latencies_s: Sequence[float],
    ) -> None:
        for sink in self.sinks:
            sink.observe_latencies(tenant, queue, operation, transport, nbytes, latencies_s)
