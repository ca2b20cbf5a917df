"""Turning delivery-path outcomes into :class:`~push.observer.Observer` calls.

Shared by the WebSocket path (here, through the engine) and the gateway's HTTP routes,
so a send, an ack or a delivery counts the same whichever way it came. Each function
makes one observer call per outcome kind, never one per message.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from backend_store.errors import PushgateError
from backend_store.types import AckResult, NewMessage, ReceivedMessage, SendResult

from .batching import AckReply
from .observer import ACK, DEDUPLICATED, OK, PUSH, SEND, Observer


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


def record_settled(
    observer: Observer,
    tenant: str,
    operation: str,
    transport: str,
    receipts: Sequence[str],
    queue_of: Mapping[str, str],
    result: AckResult | BaseException,
) -> None:
    """An ack or nack's outcome, per queue: ``queue_of`` maps a receipt to its queue (the
    gateway knows the queue of the receipts it delivered; others count under ``default``)."""
    if isinstance(result, BaseException):
        code = error_code(result)
        for queue, n in Counter(queue_of.get(r, "") for r in receipts).items():
            observer.observe(tenant, queue, operation, transport, code, n)
        return
    if not result.failed:
        # Every receipt settled: counts per queue only (an ack frame per 20 messages passes here).
        for queue, n in Counter([queue_of.get(r, "") for r in receipts]).items():
            observer.observe(tenant, queue, operation, transport, OK, n)
        return
    failed = {f.receipt: f.code for f in result.failed}
    counts: Counter[tuple[str, str]] = Counter((queue_of.get(r, ""), failed.get(r, OK)) for r in receipts)
    for (queue, outcome), n in counts.items():
        observer.observe(tenant, queue, operation, transport, outcome, n)


def observed_ack_reply(
    observer: Observer,
    tenant: str,
    operation: str,
    transport: str,
    receipts: Sequence[str],
    queue_of: Mapping[str, str],
    reply: AckReply | None,
) -> AckReply:
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


def observed_auto_ack(
    observer: Observer, tenant: str, queue: str, transport: str, receipts: Sequence[str]
) -> AckReply:
    """The gateway's own ack of messages pushed to an auto-ack stream, recorded as ``ack``
    on that stream's transport once the store answers (as SQS counts a receive and a delete,
    and as the store's ``acked_total`` counts it)."""

    def observed(result: AckResult | BaseException) -> None:
        record_settled(observer, tenant, ACK, transport, receipts, dict.fromkeys(receipts, queue), result)

    return observed
