"""The ``pushgate.v1`` WebSocket frame protocol, without I/O.

:class:`WsProtocol` turns the text of a client frame into a typed request, checks it
against the connection's state, and builds the server's frames. It never touches a
socket, so every rule here is tested by feeding it strings.

Two kinds of failure:

- :class:`ProtocolViolation`: the connection must close with its close code (malformed
  frame 4400, frame too big 1009, a request before authentication 4001).
- :class:`FrameError`: one request is wrong; the server answers ``{"op": "error", "id", ...}``
  and the connection goes on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import Any

import orjson

from backend_store.attributes import check_queue_name
from backend_store.errors import InvalidRequest
from backend_store.types import NewMessage

from .close_codes import CloseCode
from .messages import MAX_BATCH, parse_send_body
from .settings import PushSettings

RequestId = str | int | None
MAX_REQUEST_ID_CHARS = 128
MAX_RECEIPTS = 1000
MAX_VISIBILITY_S = 43200
_SEND_ENVELOPE = frozenset({"op", "id", "queue"})


class State(Enum):
    AWAITING_AUTH = "awaiting_auth"
    OPEN = "open"
    CLOSED = "closed"


class ProtocolViolation(Exception):
    """The connection must close with ``close_code``; ``reason`` is safe to show."""

    def __init__(self, close_code: CloseCode, reason: str) -> None:
        super().__init__(reason)
        self.close_code = close_code
        self.reason = reason


class FrameError(Exception):
    """One request is invalid; answer with an error frame carrying ``code``."""

    def __init__(self, request_id: RequestId, code: str, detail: str) -> None:
        super().__init__(detail)
        self.request_id = request_id
        self.code = code
        self.detail = detail


@dataclass(frozen=True, slots=True)
class AuthRequest:
    id: RequestId
    token: str


@dataclass(frozen=True, slots=True)
class SubscribeRequest:
    id: RequestId
    queue: str
    prefetch: int
    auto_ack: bool
    visibility_timeout_s: float | None
    batch: int


@dataclass(frozen=True, slots=True)
class UnsubscribeRequest:
    id: RequestId
    queue: str


@dataclass(frozen=True, slots=True)
class AckRequest:
    id: RequestId
    receipts: list[str]


@dataclass(frozen=True, slots=True)
class NackRequest:
    id: RequestId
    receipts: list[str]
    delay_s: float


@dataclass(frozen=True, slots=True)
class SendRequest:
    id: RequestId
    queue: str
    # A bad batch entry is its error, so the other entries still go (as over HTTP).
    entries: list[NewMessage | InvalidRequest]
    is_batch: bool


@dataclass(frozen=True, slots=True)
class PingRequest:
    id: RequestId


Request = (
    AuthRequest | SubscribeRequest | UnsubscribeRequest | AckRequest | NackRequest | SendRequest | PingRequest
)


def _number(raw: dict[str, Any], name: str, low: float, high: float, default: float | None) -> float | None:
    value = raw.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
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
    if (
        not isinstance(receipts, list)
        or not 1 <= len(receipts) <= MAX_RECEIPTS
        or not all(isinstance(r, str) and r for r in receipts)
    ):
        raise InvalidRequest(f"receipts must be a list of 1-{MAX_RECEIPTS} receipt strings")
    return receipts


class WsProtocol:
    """Parses client frames for one connection and tracks whether it is authenticated."""

    __slots__ = ("settings", "state")

    def __init__(self, settings: PushSettings, *, authenticated: bool = False) -> None:
        self.settings = settings
        self.state = State.OPEN if authenticated else State.AWAITING_AUTH

    # State ------------------------------------------------------------------

    def authenticated(self) -> None:
        if self.state is State.AWAITING_AUTH:
            self.state = State.OPEN

    def closed(self) -> None:
        self.state = State.CLOSED

    # Parsing ----------------------------------------------------------------

    def receive_bytes(self, data: bytes) -> Request:
        # pushgate.v1 is JSON text frames; a binary frame is not one of ours.
        raise ProtocolViolation(CloseCode.MALFORMED, "binary frames are not part of pushgate.v1")

    def receive_text(self, text: str) -> Request:
        """Parse one text frame. Raises :class:`ProtocolViolation` or :class:`FrameError`."""
        if self.state is State.CLOSED:
            raise ProtocolViolation(CloseCode.NORMAL, "connection closed")
        # Characters bound bytes from below; the exact byte count only matters near the limit.
        if len(text) > self.settings.max_frame_bytes or (
            len(text) * 4 > self.settings.max_frame_bytes
            and len(text.encode()) > self.settings.max_frame_bytes
        ):
            raise ProtocolViolation(CloseCode.MESSAGE_TOO_BIG, "frame too large")
        try:
            raw = orjson.loads(text)
        except orjson.JSONDecodeError:
            raise ProtocolViolation(CloseCode.MALFORMED, "frame is not JSON") from None
        if not isinstance(raw, dict):
            raise ProtocolViolation(CloseCode.MALFORMED, "frame is not a JSON object")
        request_id = raw.get("id")
        if request_id is not None and (
            isinstance(request_id, bool)
            or not isinstance(request_id, str | int)
            or (isinstance(request_id, str) and len(request_id) > MAX_REQUEST_ID_CHARS)
        ):
            raise ProtocolViolation(CloseCode.MALFORMED, "id must be a short string or an integer")
        op = raw.get("op")
        parse = _PARSERS.get(op) if isinstance(op, str) else None
        if parse is None:
            raise ProtocolViolation(CloseCode.MALFORMED, "unknown op")
        if self.state is State.AWAITING_AUTH and op not in ("auth", "ping"):
            raise ProtocolViolation(CloseCode.AUTH_FAILED, "authenticate first")
        try:
            return parse(self, raw, request_id)
        except InvalidRequest as exc:
            raise FrameError(request_id, exc.code, exc.detail) from None

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
        queue = _queue(raw)
        if "messages" in raw:
            body: dict[str, Any] = {"messages": raw["messages"]}
            extra = set(raw) - _SEND_ENVELOPE - {"messages"}
            if extra:
                raise InvalidRequest(f"a batch send has no field {', '.join(sorted(extra))}")
        else:
            body = {k: v for k, v in raw.items() if k not in _SEND_ENVELOPE}
        entries, is_batch = parse_send_body(body)
        return SendRequest(request_id, queue, entries, is_batch)

    def _ping(self, raw: dict[str, Any], request_id: RequestId) -> Request:
        return PingRequest(request_id)


_PARSERS = {
    "auth": WsProtocol._auth,
    "subscribe": WsProtocol._subscribe,
    "unsubscribe": WsProtocol._unsubscribe,
    "ack": WsProtocol._ack,
    "nack": WsProtocol._nack,
    "send": WsProtocol._send,
    "ping": WsProtocol._ping,
}

# Building ---------------------------------------------------------------------
# Deliveries wrap a message's JSON, encoded once by the dispatcher, in a constant
# envelope: bytes are concatenated, never parsed and dumped again.


def message_prefix(queue: str) -> bytes:
    """The bytes before a message's JSON in a ``message`` frame (built once per subscription)."""
    return b'{"op":"message","queue":' + orjson.dumps(queue) + b',"message":'


def messages_prefix(queue: str) -> bytes:
    return b'{"op":"messages","queue":' + orjson.dumps(queue) + b',"messages":['


def message_frame(prefix: bytes, payload: bytes) -> str:
    return (prefix + payload + b"}").decode()


def messages_frame(prefix: bytes, payloads: list[bytes]) -> str:
    return (prefix + b",".join(payloads) + b"]}").decode()


def ok_frame(request_id: RequestId, extra: dict[str, Any] | None = None) -> str:
    frame: dict[str, Any] = {"op": "ok", "id": request_id}
    if extra:
        frame.update(extra)
    return orjson.dumps(frame).decode()


def error_frame(request_id: RequestId, code: str, message: str, queue: str | None = None) -> str:
    frame: dict[str, Any] = {"op": "error", "id": request_id, "code": code, "message": message}
    if queue is not None:
        frame["queue"] = queue
    return orjson.dumps(frame).decode()


def pong_frame(request_id: RequestId) -> str:
    if request_id is None:
        return '{"op":"pong"}'
    return orjson.dumps({"op": "pong", "id": request_id}).decode()


__all__ = [
    "MAX_BATCH",
    "AckRequest",
    "AuthRequest",
    "FrameError",
    "NackRequest",
    "PingRequest",
    "ProtocolViolation",
    "Request",
    "RequestId",
    "SendRequest",
    "State",
    "SubscribeRequest",
    "UnsubscribeRequest",
    "WsProtocol",
    "error_frame",
    "message_frame",
    "message_prefix",
    "messages_frame",
    "messages_prefix",
    "ok_frame",
    "pong_frame",
]
