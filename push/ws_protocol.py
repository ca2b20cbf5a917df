"""The ``pushgate.v1`` WebSocket frame protocol, without I/O, in both directions.

As ``websockets.protocol.Protocol`` does, :class:`WsProtocol` owns the whole conversation
of one connection and never touches a socket:

- in: :meth:`WsProtocol.receive_text` turns a client frame into a typed request that this
  principal may make, or answers it itself: a bad request gets an error frame and the
  connection goes on; a malformed frame (4400), a frame too big (1009), a request before
  authentication (4001) or beyond the token's scopes (4003) fails the connection;
- out: replies (:meth:`~WsProtocol.ok`, :meth:`~WsProtocol.error`,
  :meth:`~WsProtocol.pong`) queue frames that :meth:`~WsProtocol.data_to_send` hands
  over; :meth:`~WsProtocol.fail` queues the close and sets the state, after which nothing
  more is sent. Which error ends a connection with which close code is decided in one
  place, :func:`push.close_codes.close_code_for`.

The handler (``ws_handler.py``) only moves frames: text in, requests to the engine,
``data_to_send()`` and the close out. Deliveries bypass the protocol on the hot path:
:func:`delivery_encoder` builds their frames once per batch, straight into the transport.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

import orjson

from backend_store.attributes import check_queue_name
from backend_store.errors import Forbidden, InvalidRequest, PushgateError
from backend_store.limits import MAX_ID_CHARS, MAX_RECEIPT_CHARS, MAX_RECEIPTS, MAX_VISIBILITY_S
from backend_store.types import NewMessage, SendResult

from .close_codes import CloseCode, close_code_for
from .messages import MESSAGE_FIELDS, parse_message, parse_send_body
from .principal import PrincipalLike
from .settings import PushSettings
from .subscription import EncodeFrames

RequestId = str | int | None
_SEND_ENVELOPE = frozenset({"op", "id", "queue"})
# A single-message send frame: the message object and its envelope side by side.
_SINGLE_SEND_FIELDS = MESSAGE_FIELDS | _SEND_ENVELOPE
# How many queue names a connection remembers as checked for sending (see WsProtocol._sendable).
MAX_SENDABLE = 64


class State(Enum):
    AWAITING_AUTH = "awaiting_auth"
    OPEN = "open"
    # fail() was called: the close is queued; nothing more is read or sent.
    CLOSING = "closing"


class _Violation(Exception):
    """Inside the parser: the connection must close with ``close_code``."""

    def __init__(self, close_code: CloseCode, reason: str) -> None:
        super().__init__(reason)
        self.close_code = close_code
        self.reason = reason


# Requests are built once per client frame and never changed; not frozen only because a
# frozen dataclass's __init__ costs three times as much (object.__setattr__ per field).
@dataclass(slots=True)
class AuthRequest:
    id: RequestId
    token: str


@dataclass(slots=True)
class SubscribeRequest:
    id: RequestId
    queue: str
    prefetch: int
    auto_ack: bool
    visibility_timeout_s: float | None
    batch: int


@dataclass(slots=True)
class UnsubscribeRequest:
    id: RequestId
    queue: str


@dataclass(slots=True)
class AckRequest:
    id: RequestId
    receipts: list[str]


@dataclass(slots=True)
class NackRequest:
    id: RequestId
    receipts: list[str]
    delay_s: float


@dataclass(slots=True)
class SendRequest:
    id: RequestId
    queue: str
    # A bad batch entry is its error, so the other entries still go (as over HTTP).
    entries: list[NewMessage | PushgateError]
    is_batch: bool


@dataclass(slots=True)
class PingRequest:
    id: RequestId


Request = (
    AuthRequest | SubscribeRequest | UnsubscribeRequest | AckRequest | NackRequest | SendRequest | PingRequest
)


def _number(raw: dict[str, Any], name: str, low: float, high: float, default: float | None) -> float | None:
    value = raw.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidRequest(f"{name} must be a number")
    if not low <= value <= high:
        raise InvalidRequest(f"{name} must be between {low:g} and {high:g}")
    return float(value)


def _integer(raw: dict[str, Any], name: str, low: int, high: int, default: int) -> int:
    value = raw.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequest(f"{name} must be an integer")
    if not low <= value <= high:
        raise InvalidRequest(f"{name} must be between {low} and {high}")
    return value


def _queue(raw: dict[str, Any]) -> str:
    queue = raw.get("queue")
    if not isinstance(queue, str):
        raise InvalidRequest("queue is required")
    check_queue_name(queue)
    return queue


def _receipts(raw: dict[str, Any]) -> list[str]:
    receipts = raw.get("receipts")
    if not isinstance(receipts, list) or not 1 <= len(receipts) <= MAX_RECEIPTS:
        raise InvalidRequest(f"receipts must be a list of 1-{MAX_RECEIPTS} receipt strings")
    # A loop, not all() over a generator: an ack frame per message passes here per frame.
    for receipt in receipts:
        if not isinstance(receipt, str) or not 1 <= len(receipt) <= MAX_RECEIPT_CHARS:
            raise InvalidRequest(f"receipts must be a list of 1-{MAX_RECEIPTS} receipt strings")
    return receipts


class WsProtocol:
    """One connection's protocol state: who it is, what it may do, what to send next."""

    __slots__ = (
        "_may_settle",
        "_sendable",
        "close_code",
        "close_reason",
        "outgoing",
        "principal",
        "refusals",
        "settings",
        "state",
    )

    def __init__(self, settings: PushSettings) -> None:
        self.settings = settings
        self.state = State.AWAITING_AUTH
        self.principal: PrincipalLike | None = None
        # Frames queued and not handed out yet (data_to_send); most client frames queue none.
        self.outgoing: list[bytes] = []
        self.close_code: CloseCode | None = None
        self.close_reason = ""
        # Requests refused by a rate limit in a row (see refused()).
        self.refusals = 0
        # Queue names this principal was found allowed to send to, name checked too: a
        # producer sending a frame per message to one queue is checked once, not per frame.
        self._sendable: set[str] = set()
        # Whether this principal may ack and nack (the receive scope), once asked: a consumer
        # acking every message frame is checked once, not per frame (None: not asked yet).
        self._may_settle: bool | None = None

    # In ----------------------------------------------------------------------

    def receive_bytes(self, data: bytes) -> None:
        # pushgate.v1 is JSON text frames; a binary frame is not one of ours.
        self.fail(CloseCode.MALFORMED, "binary frames are not part of pushgate.v1")

    def receive_text(self, text: str) -> Request | None:
        """Parse one text frame into a request the principal may make.

        None when there is nothing for the engine to do: the protocol answered the frame
        itself (an error frame) or failed the connection (see :attr:`state`).
        """
        if self.state is State.CLOSING:
            return None
        try:
            return self._parse(text)
        # Two names, not one ``exc``: mypyc gives a name one type, so a second except
        # clause binding the same name to another class raises TypeError when compiled.
        except _Violation as violation:
            self.fail(violation.close_code, violation.reason)
        except PushgateError as refused:
            request_id = refused.request_id if isinstance(refused, _RequestError) else None
            if refused.code in ("unauthorized", "forbidden"):
                self.fail_with(refused)
            else:
                self.error(request_id, refused)
        return None

    def _parse(self, text: str) -> Request:
        # Characters bound bytes from below; the exact byte count only matters near the limit.
        if len(text) > self.settings.max_frame_bytes or (
            len(text) * 4 > self.settings.max_frame_bytes
            and len(text.encode()) > self.settings.max_frame_bytes
        ):
            raise _Violation(CloseCode.MESSAGE_TOO_BIG, "frame too large")
        try:
            raw = orjson.loads(text)
        except orjson.JSONDecodeError:
            raise _Violation(CloseCode.MALFORMED, "frame is not JSON") from None
        if not isinstance(raw, dict):
            raise _Violation(CloseCode.MALFORMED, "frame is not a JSON object")
        request_id = raw.get("id")
        if request_id is not None and (
            isinstance(request_id, bool)
            or not isinstance(request_id, (str, int))
            or (isinstance(request_id, str) and len(request_id) > MAX_ID_CHARS)
        ):
            raise _Violation(CloseCode.MALFORMED, "id must be a short string or an integer")
        op = raw.get("op")
        parse = _PARSERS.get(op) if isinstance(op, str) else None
        if parse is None:
            raise _Violation(CloseCode.MALFORMED, "unknown op")
        if self.state is State.AWAITING_AUTH and op not in ("auth", "ping"):
            raise _Violation(CloseCode.AUTH_FAILED, "authenticate first")
        try:
            request = parse(self, raw, request_id)
        except InvalidRequest as exc:
            raise _RequestError(request_id, exc) from None
        self._check_scope(request)
        return request

    def _check_scope(self, request: Request) -> None:
        principal = self.principal
        if principal is None:
            return  # auth and ping only, checked above
        if isinstance(request, SendRequest):
            queue = request.queue
            if queue in self._sendable:
                return
            if not principal.can("send", queue):
                raise Forbidden(f"forbidden: the token cannot send to {queue}")
            if len(self._sendable) >= MAX_SENDABLE:
                self._sendable.clear()
            self._sendable.add(queue)
        elif isinstance(request, SubscribeRequest):
            if not principal.can("receive", request.queue):
                raise Forbidden(f"forbidden: the token cannot receive from {request.queue}")
        elif isinstance(request, (AckRequest, NackRequest)):
            if self._may_settle is None:
                self._may_settle = principal.can("receive")
            if not self._may_settle:
                raise Forbidden("forbidden: the token has no receive scope")

    # Authentication ----------------------------------------------------------------

    def authenticated(
        self, principal: PrincipalLike, request_id: RequestId = None, subscribed: Iterable[str] = ()
    ) -> bool:
        """A token was verified (at connect, in an auth frame, or a refresh). Returns whether
        the connection goes on: a refresh must keep the tenant and every subscribed queue."""
        refresh = self.principal is not None
        if self.principal is not None:
            if principal.tenant != self.principal.tenant:
                self.fail(CloseCode.AUTH_FAILED, "a refreshed token must be for the same tenant")
                return False
            lost = [queue for queue in subscribed if not principal.can("receive", queue)]
            if lost:
                self.fail(CloseCode.FORBIDDEN, f"forbidden: the new token cannot receive from {lost[0]}")
                return False
        self.principal = principal
        self._sendable.clear()  # new scopes: checked again
        self._may_settle = None
        if self.state is State.AWAITING_AUTH:
            self.state = State.OPEN
        if request_id is not None or refresh:
            self.ok(request_id, {"expires_at": principal.expires_at})
        return True

    def authentication_failed(self, exc: PushgateError, request_id: RequestId = None) -> None:
        """A token was refused: fatal at first, one failed request on a refresh (the old
        credentials hold until they expire)."""
        if self.principal is None:
            self.fail(close_code_for(exc, CloseCode.AUTH_FAILED), exc.detail)
        else:
            self.error(request_id, exc)

    # Out ------------------------------------------------------------------------

    def ok(self, request_id: RequestId, extra: dict[str, Any] | None = None) -> None:
        if self.state is State.CLOSING:
            return
        frame: dict[str, Any] = {"op": "ok", "id": request_id}
        if extra:
            frame.update(extra)
        self.outgoing.append(orjson.dumps(frame))

    def sent_many(self, ids: Sequence[RequestId], results: Sequence[SendResult | PushgateError]) -> None:
        """The replies of single-message sends, ``results[i]`` answering ``ids[i]``, in order;
        a send without an id gets none."""
        if self.state is State.CLOSING:
            return
        outgoing = self.outgoing
        for request_id, result in zip(ids, results, strict=True):
            if request_id is None:
                continue  # fire and forget
            if isinstance(result, SendResult):
                outgoing.append(
                    orjson.dumps(
                        {
                            "op": "ok",
                            "id": request_id,
                            "result": {"id": result.id, "seq": result.seq, "duplicate": result.duplicate},
                        }
                    )
                )
            else:
                self.error(request_id, result)

    def error(self, request_id: RequestId, exc: PushgateError, queue: str | None = None) -> None:
        """One request failed (or, with ``queue``, a subscription ended); the connection goes on."""
        if self.state is State.CLOSING:
            return
        frame: dict[str, Any] = {"op": "error", "id": request_id, "code": exc.code, "message": exc.detail}
        if queue is not None:
            frame["queue"] = queue
        if exc.retry_after_s is not None:
            frame["retry_after_s"] = exc.retry_after_s
        self.outgoing.append(orjson.dumps(frame))

    def refused(self, request_id: RequestId, exc: PushgateError) -> None:
        """A rate limit refused a request: an error frame with ``retry_after_s``, and once
        ``rate_limited_frames`` refusals come in a row, the close (4008)."""
        self.refusals += 1
        if self.refusals >= self.settings.rate_limited_frames:
            self.fail(CloseCode.POLICY, f"rate limit abuse: {self.refusals} requests refused in a row")
        else:
            self.error(request_id, exc)

    def admitted(self) -> None:
        """A rate limit allowed a request: the client backs off as told, so forget its refusals."""
        self.refusals = 0

    def pong(self, request_id: RequestId) -> None:
        if self.state is State.CLOSING:
            return
        self.outgoing.append(
            b'{"op":"pong"}' if request_id is None else orjson.dumps({"op": "pong", "id": request_id})
        )

    def fail(self, code: CloseCode, reason: str) -> None:
        """End the connection: queue the close; frames queued before it still go first."""
        if self.state is State.CLOSING:
            return
        self.state = State.CLOSING
        self.close_code = code
        self.close_reason = reason

    def fail_with(self, exc: PushgateError) -> None:
        """End the connection for an error, with its close code."""
        self.fail(close_code_for(exc), exc.detail)

    def data_to_send(self) -> Sequence[bytes]:
        """The frames queued since the last call, in order (UTF-8 JSON text frames)."""
        frames = self.outgoing
        if not frames:
            return ()  # most client frames queue nothing (a send's ok comes later)
        self.outgoing = []
        return frames

    # Parsers ----------------------------------------------------------------------

    def _auth(self, raw: dict[str, Any], request_id: RequestId) -> Request:
        token = raw.get("token")
        if not isinstance(token, str) or not token:
            raise InvalidRequest("token is required")
        return AuthRequest(request_id, token)

    def _subscribe(self, raw: dict[str, Any], request_id: RequestId) -> Request:
        settings = self.settings
        ack = raw.get("ack", "manual")
        if ack not in ("manual", "auto"):
            raise InvalidRequest("ack must be manual or auto")
        return SubscribeRequest(
            request_id,
            _queue(raw),
            _integer(raw, "prefetch", 1, settings.max_prefetch, settings.default_prefetch),
            ack == "auto",
            _number(raw, "visibility_timeout_s", 0, MAX_VISIBILITY_S, None),
            _integer(raw, "batch", 1, settings.max_batch, 1),
        )

    def _unsubscribe(self, raw: dict[str, Any], request_id: RequestId) -> Request:
        return UnsubscribeRequest(request_id, _queue(raw))

    def _ack(self, raw: dict[str, Any], request_id: RequestId) -> Request:
        return AckRequest(request_id, _receipts(raw))

    def _nack(self, raw: dict[str, Any], request_id: RequestId) -> Request:
        delay = _number(raw, "delay_s", 0, MAX_VISIBILITY_S, 0.0)
        return NackRequest(request_id, _receipts(raw), delay or 0.0)

    def _send(self, raw: dict[str, Any], request_id: RequestId) -> Request:
        queue = raw.get("queue")
        if not (isinstance(queue, str) and queue in self._sendable):
            queue = _queue(raw)  # a name seen before passed this check already
        if "messages" in raw:
            extra = set(raw) - _SEND_ENVELOPE - {"messages"}
            if extra:
                raise InvalidRequest(f"a batch send has no field {', '.join(sorted(extra))}")
            entries, is_batch = parse_send_body({"messages": raw["messages"]})
            return SendRequest(request_id, queue, entries, is_batch)
        # The frame is the message with its envelope: parsed as it is, without a copy.
        return SendRequest(request_id, queue, [parse_message(raw, None, _SINGLE_SEND_FIELDS)], False)

    def _ping(self, raw: dict[str, Any], request_id: RequestId) -> Request:
        return PingRequest(request_id)


class _RequestError(InvalidRequest):
    """An invalid request, with the id to answer it under."""

    def __init__(self, request_id: RequestId, cause: InvalidRequest) -> None:
        super().__init__(cause.detail)
        self.request_id = request_id


_PARSERS = {
    "auth": WsProtocol._auth,
    "subscribe": WsProtocol._subscribe,
    "unsubscribe": WsProtocol._unsubscribe,
    "ack": WsProtocol._ack,
    "nack": WsProtocol._nack,
    "send": WsProtocol._send,
    "ping": WsProtocol._ping,
}

# Deliveries --------------------------------------------------------------------
# A message's JSON is encoded once by the dispatcher; its frame wraps it in a constant
# envelope: bytes are concatenated, never parsed and dumped again.


def delivery_encoder(queue: str, batch: int = 1) -> EncodeFrames:
    """The frames of one subscription's deliveries: ``message`` frames, or ``messages``
    frames of up to ``batch`` messages when the subscription asked for batches."""
    single = b'{"op":"message","queue":' + orjson.dumps(queue) + b',"message":'
    many = b'{"op":"messages","queue":' + orjson.dumps(queue) + b',"messages":['

    def encode(payloads: Sequence[bytes], first_n: int) -> list[bytes]:
        if batch <= 1 or len(payloads) == 1:
            return [single + payload + b"}" for payload in payloads]
        frames = []
        for start in range(0, len(payloads), batch):
            chunk = payloads[start : start + batch]
            if len(chunk) == 1:
                frames.append(single + chunk[0] + b"}")
            else:
                frames.append(many + b",".join(chunk) + b"]}")
        return frames

    return encode


__all__ = [
    "AckRequest",
    "AuthRequest",
    "NackRequest",
    "PingRequest",
    "Request",
    "RequestId",
    "SendRequest",
    "State",
    "SubscribeRequest",
    "UnsubscribeRequest",
    "WsProtocol",
    "delivery_encoder",
]
