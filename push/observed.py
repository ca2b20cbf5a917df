"""Turning delivery-path outcomes into :class:`~push.observer.Observer` calls.

Shared by the WebSocket path (here, through the engine) and the gateway's HTTP routes,
so a send, an ack or a delivery counts the same whichever way it came. Each function
makes one observer call per outcome kind, never one per message.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence

from backend_store.errors import PushgateError
from backend_store.types import AckResult, NewMessage, ReceivedMessage, SendResult

from .observer import DEDUPLICATED, OK, PUSH, SEND, Observer

# What an ack or nack request hears back: its own share of the combined call, or the call's error.
AckReply = Callable[[AckResult | BaseException], None]


def error_code(exc: BaseException) -> str:
    return exc.code if isinstance(exc, PushgateError) else "internal_error"


def record_sends(
    observer: Observer,
    tenant: str,
    queue: str,
    transport: str,
    entries: Sequence[NewMessage | PushgateError],
    results: Sequence[SendResult | PushgateError],
    latency_s: float | None,
) -> int:
    """One send request's outcome; ``results[i]`` answers ``entries[i]``. Stored messages
    count as ``send`` (with the request's latency), duplicates as ``deduplicated``, refused
    entries as ``send`` with their error code. Returns how many were stored."""
    sent = sent_bytes = duplicates = duplicate_bytes = 0
    # Built only when an entry failed: a send per WebSocket frame passes here per message.
    errors: dict[str, int] | None = None
    for entry, result in zip(entries, results, strict=True):
        if isinstance(result, SendResult):
            size = len(entry.body) if isinstance(entry, NewMessage) else 0
            if result.duplicate:
                duplicates += 1
                duplicate_bytes += size
            else:
                sent += 1
                sent_bytes += size
        else:
            if errors is None:
                errors = {}
            errors[result.code] = errors.get(result.code, 0) + 1
    if sent:
        observer.observe(tenant, queue, SEND, transport, OK, sent, sent_bytes, latency_s)
    if duplicates:
        observer.observe(tenant, queue, DEDUPLICATED, transport, OK, duplicates, duplicate_bytes)
    if errors is not None:
        for code, n in errors.items():
            observer.observe(tenant, queue, SEND, transport, code, n)
    return sent


def record_group_sends(
    observer: Observer,
    tenant: str,
    queue: str,
    transport: str,
    entries: Sequence[NewMessage | PushgateError],
    started: Sequence[float],
    results: Sequence[SendResult | PushgateError],
    now: float,
) -> int:
    """Single-message sends answered together (a :class:`~push.send_group.SendGroup`):
    ``results[i]`` answers the request that came at ``started[i]``, each recorded as a
    request of its own would be. Returns how many were stored."""
    latencies: list[float] = []
    sent_bytes = 0
    others: list[NewMessage | PushgateError] = []
    other_results: list[SendResult | PushgateError] = []
    for entry, result, began in zip(entries, results, started, strict=True):
        if isinstance(result, SendResult) and not result.duplicate and isinstance(entry, NewMessage):
            latencies.append(now - began)
            sent_bytes += len(entry.body)
        else:
            others.append(entry)
            other_results.append(result)
    if latencies:
        observer.observe_latencies(tenant, queue, SEND, transport, sent_bytes, latencies)
    if others:
        # Duplicates and refusals carry no latency: counted as record_sends counts them.
        record_sends(observer, tenant, queue, transport, others, other_results, None)
    return len(latencies)


# Each receipt's queue (the gateway knows the queue of the receipts it delivered; others
# count under ``""``), or one queue for all of them.
QueueOf = Mapping[str, str] | str


class SettledTally:
    """Acks or nacks of one tenant counted per queue, transport and outcome, then reported
    in one observer call per count: the requests answered by one store call are counted
    together (an ack frame per message would otherwise cost a few observer calls a frame)."""

    __slots__ = ("_counts", "operation", "tenant")

    def __init__(self, tenant: str, operation: str) -> None:
        self.tenant = tenant
        self.operation = operation
        self._counts: dict[tuple[str, str, str], int] = {}

    def add(
        self, transport: str, receipts: Sequence[str], queue_of: QueueOf, failed: Mapping[str, str]
    ) -> None:
        """A request's receipts, each settled unless ``failed`` maps it to its error code."""
        if failed:
            counts = self._counts
            for receipt in receipts:
                queue = queue_of if isinstance(queue_of, str) else queue_of.get(receipt, "")
                key = (queue, transport, failed.get(receipt, OK))
                counts[key] = counts.get(key, 0) + 1
            return
        self._add_all(transport, receipts, queue_of, OK)

    def add_error(
        self, transport: str, receipts: Sequence[str], queue_of: QueueOf, error: BaseException
    ) -> None:
        """A request whose store call failed: every receipt counts under the error's code."""
        self._add_all(transport, receipts, queue_of, error_code(error))

    def _add_all(self, transport: str, receipts: Sequence[str], queue_of: QueueOf, outcome: str) -> None:
        counts = self._counts
        if isinstance(queue_of, str) or len(receipts) == 1:
            # One queue (the common case, and every ack frame of one receipt): no per-receipt count.
            queue = queue_of if isinstance(queue_of, str) else queue_of.get(receipts[0], "")
            key = (queue, transport, outcome)
            counts[key] = counts.get(key, 0) + len(receipts)
            return
        for queue, n in Counter([queue_of.get(r, "") for r in receipts]).items():
            key = (queue, transport, outcome)
            counts[key] = counts.get(key, 0) + n

    def report(self, observer: Observer) -> None:
        tenant, operation = self.tenant, self.operation
        for (queue, transport, outcome), n in self._counts.items():
            observer.observe(tenant, queue, operation, transport, outcome, n)
        self._counts = {}


def record_settled(
    observer: Observer,
    tenant: str,
    operation: str,
    transport: str,
    receipts: Sequence[str],
    queue_of: QueueOf,
    result: AckResult | BaseException,
) -> None:
    """One ack or nack request's outcome, per queue (see :class:`SettledTally`)."""
    tally = SettledTally(tenant, operation)
    if isinstance(result, BaseException):
        tally.add_error(transport, receipts, queue_of, result)
    else:
        tally.add(transport, receipts, queue_of, {f.receipt: f.code for f in result.failed})
    tally.report(observer)


def observed_ack_reply(
    observer: Observer,
    tenant: str,
    operation: str,
    transport: str,
    receipts: Sequence[str],
    queue_of: QueueOf,
    reply: AckReply | None,
) -> AckReply:
    """``reply``, recording the request's outcome first (a request the ack batcher splits
    across shards is counted once, when its parts are joined)."""

    def observed(result: AckResult | BaseException) -> None:
        record_settled(observer, tenant, operation, transport, receipts, queue_of, result)
        if reply is not None:
            reply(result)

    return observed


def record_delivered(
    observer: Observer,
    tenant: str,
    queue: str,
    transport: str,
    messages: Sequence[ReceivedMessage],
    now: float,
) -> None:
    """Messages pushed to one subscriber: one ``push`` latency (sent -> now) per message."""
    nbytes = 0
    latencies: list[float] = []
    for m in messages:
        nbytes += len(m.body)
        latencies.append(max(0.0, now - m.sent_at))
    observer.observe_latencies(tenant, queue, PUSH, transport, nbytes, latencies)
