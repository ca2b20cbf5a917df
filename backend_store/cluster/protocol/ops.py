"""Backend operations on the node protocol: their names, and their arguments and results as
msgpack-friendly values, in one place shared by the node's dispatcher and the client.

A :class:`~.wire.Request` names one of :data:`OPS` (the ``Backend`` / ``DeadLetters``
method of the same name) and carries its keyword arguments as a map. Records travel as
arrays in a fixed field order (they are the bulk of the traffic), everything else as maps:

=====================  ==========================================================
``NewMessage``         ``[body, is_text, attributes, group_id, dedupe_id, delay_s]``
``SendResult``         ``[id, seq, duplicate]``; a per-entry error ``{code, detail}``
``ReceivedMessage``    ``[queue, id, seq, receipt, body, is_text, attributes,
                       group_id, sent_at, receive_count, visible_at]``
``PeekedMessage``      ``[queue, id, seq, body, is_text, attributes, group_id,
                       sent_at, receive_count, state]``
``AckResult``          ``{acked, failed: [[receipt, code], ...]}``
``QueueInfo``          ``{tenant, name, created_at, attributes: {...}, stats: {...}}``
``queue_stats``        ``{name: {visible, in_flight, ...}, ...}``: the queues asked for
                       that the store holds (one read for a page of queues)
``send_queues``        args ``sends: [[queue, [NewMessage, ...]], ...]``; result a list
                       with, per entry, its ``SendResult`` list or a ``{code, detail}``
                       (that queue refused: ``not_leader``, not applied here yet;
                       ``queue_not_found``, not held). The store's ``send_queues``: one
                       writer operation for a pool partition's batched sends
=====================  ==========================================================

Client side: :func:`encode_args` then, on the reply, :func:`decode_result`. Node side:
:func:`decode_args` (a malformed map raises :class:`~backend_store.errors.InvalidRequest`,
never a crash), the store call, then :func:`encode_result`. :func:`call` does the node's
three steps. Errors travel as ``ErrorReply`` codes; :func:`error_from_reply` rebuilds them,
with :class:`NotLeader` and :class:`StaleLeader` carrying what the node knows of the leader.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...errors import InvalidRequest, PushgateError, StaleEpoch, Unavailable, error_from_code
from ...types import (
    AckResult,
    Epoch,
    MessageId,
    NewMessage,
    PeekedMessage,
    QueueAttributes,
    QueueInfo,
    QueueName,
    QueueStats,
    Receipt,
    ReceiptFailure,
    ReceivedMessage,
    SendResult,
    TenantId,
)

_NO_EPOCH = Epoch(0)


class NotLeader(Unavailable):
    """The node does not lead the partition. ``leader`` (``host:port``) and ``epoch`` are what
    it knows of the current leader (None / 0: nothing): refresh, then retry there."""

    code = "not_leader"

    def __init__(self, detail: str = "", epoch: Epoch = _NO_EPOCH, leader: str | None = None) -> None:
        super().__init__(detail)
        self.epoch = epoch
        self.leader = leader

    def __reduce__(self) -> tuple[type[PushgateError], tuple[str]]:
        return (type(self), (self.detail,))


class StaleLeader(StaleEpoch):
    """The request named an older epoch than the partition's leader has: the sender's map is
    stale. ``epoch`` and ``leader`` are the node's current knowledge."""

    def __init__(self, detail: str = "", epoch: Epoch = _NO_EPOCH, leader: str | None = None) -> None:
        super().__init__(detail)
        self.epoch = epoch
        self.leader = leader

    def __reduce__(self) -> tuple[type[PushgateError], tuple[str]]:
        return (type(self), (self.detail,))


def error_from_reply(code: str, detail: str, epoch: Epoch, leader: str | None) -> PushgateError:
    """The exception an ``ErrorReply`` stands for (unknown codes: a plain PushgateError)."""
    if code == NotLeader.code:
        return NotLeader(detail, epoch, leader)
    if code == StaleEpoch.code:
        return StaleLeader(detail, epoch, leader)
    return error_from_code(code, detail)


# Argument checks: a peer's bug becomes invalid_request, not a TypeError deep in the store.


def _get(
    args: Mapping[str, Any], name: str, kinds: type | tuple[type, ...], *, optional: bool = False
) -> Any:
    if name not in args or args[name] is None:
        if optional:
            return None
        raise InvalidRequest(f"argument {name!r} is missing")
    value = args[name]
    if isinstance(value, bool) and bool not in (kinds if isinstance(kinds, tuple) else (kinds,)):
        raise InvalidRequest(f"argument {name!r} has the wrong type")
    if not isinstance(value, kinds):
        raise InvalidRequest(f"argument {name!r} has the wrong type")
    return value


def _number(args: Mapping[str, Any], name: str, *, optional: bool = False) -> float | None:
    value = _get(args, name, (int, float), optional=optional)
    return None if value is None else float(value)


def _str_list(args: Mapping[str, Any], name: str) -> list[str]:
    value = _get(args, name, list)
    if not all(isinstance(v, str) for v in value):
        raise InvalidRequest(f"argument {name!r} must be a list of strings")
    return list(value)


def _str_map(value: Any, what: str) -> dict[str, str]:
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise InvalidRequest(f"{what} must be a map of strings")
    return dict(value)


# Records -------------------------------------------------------------------------------


def encode_message(m: NewMessage) -> list[Any]:
    return [m.body, m.is_text, m.attributes, m.group_id, m.dedupe_id, m.delay_s]


def decode_message(v: Any) -> NewMessage:
    if not isinstance(v, list) or len(v) != 6:
        raise InvalidRequest("a message must be [body, is_text, attributes, group_id, dedupe_id, delay_s]")
    body, is_text, attributes, group_id, dedupe_id, delay_s = v
    if not isinstance(body, bytes) or not isinstance(is_text, bool):
        raise InvalidRequest("a message's body must be bytes and is_text a boolean")
    for name, value in (("group_id", group_id), ("dedupe_id", dedupe_id)):
        if value is not None and not isinstance(value, str):
            raise InvalidRequest(f"a message's {name} must be a string")
    if delay_s is not None and (isinstance(delay_s, bool) or not isinstance(delay_s, int | float)):
        raise InvalidRequest("a message's delay_s must be a number")
    return NewMessage(
        body=body,
        is_text=is_text,
        attributes=_str_map(attributes, "a message's attributes"),
        group_id=group_id,
        dedupe_id=dedupe_id,
        delay_s=None if delay_s is None else float(delay_s),
    )


def encode_send_result(r: SendResult | PushgateError) -> Any:
    if isinstance(r, PushgateError):
        return {"code": r.code, "detail": r.detail}
    return [r.id, r.seq, r.duplicate]


def decode_send_result(v: Any) -> SendResult | PushgateError:
    if isinstance(v, dict):
        return error_from_code(str(v.get("code")), str(v.get("detail", "")))
    mid, seq, duplicate = v
    return SendResult(MessageId(mid), seq, duplicate)


def encode_received(m: ReceivedMessage) -> list[Any]:
    return [
        m.queue,
        m.id,
        m.seq,
        m.receipt,
        m.body,
        m.is_text,
        m.attributes,
        m.group_id,
        m.sent_at,
        m.receive_count,
        m.visible_at,
    ]


def decode_received(v: Any) -> ReceivedMessage:
    queue, mid, seq, receipt, body, is_text, attributes, group_id, sent_at, count, visible_at = v
    return ReceivedMessage(
        QueueName(queue),
        MessageId(mid),
        seq,
        Receipt(receipt),
        body,
        is_text,
        attributes,
        group_id,
        sent_at,
        count,
        visible_at,
    )


def encode_peeked(m: PeekedMessage) -> list[Any]:
    return [
        m.queue,
        m.id,
        m.seq,
        m.body,
        m.is_text,
        m.attributes,
        m.group_id,
        m.sent_at,
        m.receive_count,
        m.state,
    ]


def decode_peeked(v: Any) -> PeekedMessage:
    queue, mid, seq, body, is_text, attributes, group_id, sent_at, count, state = v
    return PeekedMessage(
        QueueName(queue), MessageId(mid), seq, body, is_text, attributes, group_id, sent_at, count, state
    )


def encode_ack(r: AckResult) -> dict[str, Any]:
    return {"acked": r.acked, "failed": [[f.receipt, f.code] for f in r.failed]}


def decode_ack(v: Any) -> AckResult:
    return AckResult(v["acked"], [ReceiptFailure(receipt, code) for receipt, code in v["failed"]])


def encode_queue(q: QueueInfo) -> dict[str, Any]:
    return {
        "tenant": q.tenant,
        "name": q.name,
        "created_at": q.created_at,
        "attributes": q.attributes.to_dict(),
        "stats": q.stats.to_dict(),
    }


def decode_queue(v: Any) -> QueueInfo:
    return QueueInfo(
        TenantId(v["tenant"]),
        QueueName(v["name"]),
        v["created_at"],
        QueueAttributes(**v["attributes"]),
        QueueStats(**v["stats"]),
    )


# Operations -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Op:
    """One operation: how its keyword arguments and its result cross the wire.

    ``writes``: it changes the store, so the leader replicates before answering (in sync
    mode, to a majority).
    """

    name: str
    writes: bool
    decode_args: Callable[[Mapping[str, Any]], dict[str, Any]]
    encode_result: Callable[[Any], Any]
    decode_result: Callable[[Any], Any]


def _same(v: Any) -> Any:
    return v


def _tq(args: Mapping[str, Any], queue: str = "queue") -> dict[str, Any]:
    return {"tenant": TenantId(_get(args, "tenant", str)), queue: QueueName(_get(args, queue, str))}


def _attrs(args: Mapping[str, Any], name: str) -> dict[str, Any]:
    value = _get(args, name, dict)
    if not all(isinstance(k, str) for k in value):
        raise InvalidRequest(f"argument {name!r} must be a map with string keys")
    return dict(value)


def _send_args(a: Mapping[str, Any]) -> dict[str, Any]:
    messages = _get(a, "messages", list)
    return {**_tq(a), "messages": [decode_message(m) for m in messages]}


def _send_queues_args(a: Mapping[str, Any]) -> dict[str, Any]:
    sends = _get(a, "sends", list)
    decoded: list[tuple[QueueName, list[NewMessage]]] = []
    for entry in sends:
        if not (
            isinstance(entry, list)
            and len(entry) == 2
            and isinstance(entry[0], str)
            and isinstance(entry[1], list)
        ):
            raise InvalidRequest("each of 'sends' must be [queue, messages]")
        decoded.append((QueueName(entry[0]), [decode_message(m) for m in entry[1]]))
    return {"tenant": TenantId(_get(a, "tenant", str)), "sends": decoded}


SendsResult = list[list[SendResult | PushgateError] | PushgateError]


def with_refused(encoded: list[Any], refused: Mapping[int, str]) -> list[Any]:
    """An encoded ``send_queues`` result for the entries served, with ``not_leader`` put back
    at the places of those refused before the store saw them (node side)."""
    served = iter(encoded)
    return [
        {"code": NotLeader.code, "detail": refused[place]} if place in refused else next(served)
        for place in range(len(encoded) + len(refused))
    ]


def _encode_sends(r: SendsResult) -> list[Any]:
    return [
        {"code": x.code, "detail": x.detail}
        if isinstance(x, PushgateError)
        else [encode_send_result(y) for y in x]
        for x in r
    ]


def _decode_sends(v: Any) -> SendsResult:
    return [
        error_from_reply(str(x.get("code")), str(x.get("detail", "")), _NO_EPOCH, None)
        if isinstance(x, dict)
        else [decode_send_result(y) for y in x]
        for x in v
    ]


def _receive_args(a: Mapping[str, Any]) -> dict[str, Any]:
    return {
        **_tq(a),
        "max_messages": _get(a, "max_messages", int),
        "visibility_timeout_s": _number(a, "visibility_timeout_s", optional=True),
    }


def _ack_args(a: Mapping[str, Any]) -> dict[str, Any]:
    queue = _get(a, "queue", str, optional=True)
    return {
        "tenant": TenantId(_get(a, "tenant", str)),
        "receipts": _str_list(a, "receipts"),
        "queue": None if queue is None else QueueName(queue),
    }


def _nack_args(a: Mapping[str, Any]) -> dict[str, Any]:
    return {**_ack_args(a), "delay_s": _number(a, "delay_s", optional=True) or 0.0}


def _visibility_args(a: Mapping[str, Any]) -> dict[str, Any]:
    return {**_tq(a), "receipt": _get(a, "receipt", str), "timeout_s": _number(a, "timeout_s")}


def _peek_args(a: Mapping[str, Any]) -> dict[str, Any]:
    return {**_tq(a), "max_messages": _get(a, "max_messages", int)}


def _redrive_args(a: Mapping[str, Any]) -> dict[str, Any]:
    return {
        **_tq(a),
        "to": QueueName(_get(a, "to", str)),
        "max_messages": _get(a, "max_messages", int),
    }


def _queue_args(a: Mapping[str, Any]) -> dict[str, Any]:
    return _tq(a, "name")


def _queue_stats_args(a: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "tenant": TenantId(_get(a, "tenant", str)),
        "names": [QueueName(n) for n in _str_list(a, "names")],
    }


def _encode_stats(r: Mapping[str, QueueStats]) -> dict[str, Any]:
    return {name: stats.to_dict() for name, stats in r.items()}


def _decode_stats(v: Any) -> dict[QueueName, QueueStats]:
    return {QueueName(name): QueueStats(**stats) for name, stats in v.items()}


def _create_result(r: tuple[QueueInfo, bool]) -> list[Any]:
    return [encode_queue(r[0]), r[1]]


def _decode_create(v: Any) -> tuple[QueueInfo, bool]:
    return decode_queue(v[0]), bool(v[1])


OPS: dict[str, Op] = {
    op.name: op
    for op in (
        Op(
            "send",
            True,
            _send_args,
            lambda r: [encode_send_result(x) for x in r],
            lambda v: [decode_send_result(x) for x in v],
        ),
        Op("send_queues", True, _send_queues_args, _encode_sends, _decode_sends),
        Op(
            "receive",
            True,
            _receive_args,
            lambda r: [encode_received(m) for m in r],
            lambda v: [decode_received(m) for m in v],
        ),
        Op("ack", True, _ack_args, encode_ack, decode_ack),
        Op("nack", True, _nack_args, encode_ack, decode_ack),
        Op("change_visibility", True, _visibility_args, _same, lambda v: None),
        Op("next_visible_at", False, _tq, _same, _same),
        Op("purge_queue", True, _queue_args, _same, int),
        Op(
            "create_queue",
            True,
            lambda a: {**_queue_args(a), "attributes": _attrs(a, "attributes")},
            _create_result,
            _decode_create,
        ),
        Op(
            "update_queue",
            True,
            lambda a: {**_queue_args(a), "changes": _attrs(a, "changes")},
            encode_queue,
            decode_queue,
        ),
        Op("delete_queue", True, _queue_args, _same, lambda v: None),
        Op("get_queue", False, _queue_args, encode_queue, decode_queue),
        Op("queue_stats", False, _queue_stats_args, _encode_stats, _decode_stats),
        Op(
            "peek",
            False,
            _peek_args,
            lambda r: [encode_peeked(m) for m in r],
            lambda v: [decode_peeked(m) for m in v],
        ),
        Op("redrive", True, _redrive_args, _same, int),
    )
}


def encode_args(op: str, **kwargs: Any) -> dict[str, Any]:
    """A call's keyword arguments as the request's ``args`` map (client side)."""
    if op not in OPS:
        raise InvalidRequest(f"unknown operation {op!r}")
    out: dict[str, Any] = {}
    for name, value in kwargs.items():
        if name == "messages":
            out[name] = [encode_message(m) for m in value]
        elif name == "sends":
            out[name] = [[queue, [encode_message(m) for m in messages]] for queue, messages in value]
        elif isinstance(value, Sequence) and not isinstance(value, str | bytes):
            out[name] = list(value)
        elif isinstance(value, Mapping):
            out[name] = dict(value)
        else:
            out[name] = value
    return out


def decode_args(op: str, args: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword arguments to call the store with (node side); ``InvalidRequest`` if malformed."""
    spec = OPS.get(op)
    if spec is None:
        raise InvalidRequest(f"unknown operation {op!r}")
    return spec.decode_args(args)


def encode_result(op: str, result: Any) -> Any:
    return OPS[op].encode_result(result)


def decode_result(op: str, value: Any) -> Any:
    """The result as the ``Backend`` method returns it (client side)."""
    try:
        return OPS[op].decode_result(value)
    except (KeyError, TypeError, ValueError) as exc:
        # A node of another version, or a bug: never hand the caller a half-built record.
        raise Unavailable(f"malformed {op} result from the node: {type(exc).__name__}") from None


async def call(store: Any, op: str, args: Mapping[str, Any]) -> Any:
    """Decode ``args``, call the store's method ``op``, encode its result (node side)."""
    kwargs = decode_args(op, args)
    method = getattr(store, op, None)
    if method is None:
        raise InvalidRequest(f"this store does not support {op!r}")
    return encode_result(op, await method(**kwargs))
