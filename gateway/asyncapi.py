"""The AsyncAPI 3.0 description of the push protocols, served at ``/asyncapi.json``.

OpenAPI describes request and response; the WebSocket protocol (``pushgate.v1`` frames in
both directions) and the SSE stream are what AsyncAPI is for. The document describes the
gateway as the application: it *receives* the client's frames and *sends* deliveries and
replies. Schemas it shares with the HTTP API (a received message, a send result) are the
OpenAPI components themselves, so the two documents cannot disagree; close codes come
from :mod:`push.close_codes`, limits from :class:`push.settings.PushSettings`.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import orjson

from backend_store.attributes import QUEUE_NAME_RULE
from backend_store.limits import MAX_ID_CHARS, MAX_RECEIPTS, MAX_VISIBILITY_S
from push.close_codes import CloseCode
from push.settings import PushSettings

from .openapi_schemas import SCHEMAS

Schema = dict[str, Any]
ASYNCAPI_VERSION = "3.0.0"


def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def _frame(op: str, properties: dict[str, Schema], required: tuple[str, ...] = (), **extra: Any) -> Schema:
    return {
        "type": "object",
        "properties": {"op": {"const": op}, **properties},
        "required": ["op", *required],
        **extra,
    }


_ID: Schema = {
    "description": "Optional request id (string or integer); the reply carries it.",
    "oneOf": [{"type": "string", "maxLength": MAX_ID_CHARS}, {"type": "integer"}],
}
_RECEIPTS: Schema = {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": MAX_RECEIPTS}


def _client_frames(settings: PushSettings) -> dict[str, tuple[str, Schema]]:
    """Frames a client sends: message name -> (summary, payload schema)."""
    return {
        "auth": (
            "Authenticate (first frame, within the auth timeout) or refresh a token before it expires",
            _frame("auth", {"id": _ID, "token": {"type": "string"}}, ("token",)),
        ),
        "subscribe": (
            "Start deliveries from a queue (needs receive:<queue>)",
            _frame(
                "subscribe",
                {
                    "id": _ID,
                    "queue": {"type": "string"},
                    "prefetch": {
                        "type": "integer",
                        "minimum": 1,
                        "maximum": settings.max_prefetch,
                        "default": settings.default_prefetch,
                    },
                    "ack": {"enum": ["manual", "auto"], "default": "manual"},
                    "visibility_timeout_s": {"type": "number", "minimum": 0, "maximum": MAX_VISIBILITY_S},
                    "batch": {"type": "integer", "minimum": 1, "maximum": settings.max_batch, "default": 1},
                },
                ("queue",),
            ),
        ),
        "unsubscribe": (
            "Stop deliveries; unacked messages become visible again",
            _frame("unsubscribe", {"id": _ID, "queue": {"type": "string"}}, ("queue",)),
        ),
        "ack": (
            "Delete delivered messages",
            _frame("ack", {"id": _ID, "receipts": _RECEIPTS}, ("receipts",)),
        ),
        "nack": (
            "Give delivered messages back, visible after delay_s",
            _frame(
                "nack",
                {
                    "id": _ID,
                    "receipts": _RECEIPTS,
                    "delay_s": {"type": "number", "minimum": 0, "maximum": 900},
                },
                ("receipts",),
            ),
        ),
        "send": (
            "Send one message (fields as in the HTTP send) or a batch under messages (needs send:<queue>)",
            {
                "allOf": [
                    _frame("send", {"id": _ID, "queue": {"type": "string"}}, ("queue",)),
                    {"oneOf": [_ref("Message"), _ref("MessageBatch")]},
                ]
            },
        ),
        "ping": ("Ask for a pong", _frame("ping", {"id": _ID})),
    }


def _server_frames() -> dict[str, tuple[str, Schema]]:
    """Frames the gateway sends: message name -> (summary, payload schema)."""
    queue = {"type": "string"}
    return {
        "message": (
            "One delivery",
            _frame("message", {"queue": queue, "message": _ref("ReceivedMessage")}, ("queue", "message")),
        ),
        "messages": (
            "Several deliveries in one frame (only to a subscription with batch > 1)",
            _frame(
                "messages",
                {"queue": queue, "messages": {"type": "array", "items": _ref("ReceivedMessage")}},
                ("queue", "messages"),
            ),
        ),
        "ok": (
            "A request succeeded; auth: {expires_at}; subscribe/unsubscribe: {queue}; ack/nack: "
            "{acked, failed}; send: {result} or {results}",
            _frame(
                "ok",
                {
                    "id": _ID,
                    "expires_at": {"type": ["number", "null"]},
                    "queue": queue,
                    "acked": {"type": "integer"},
                    "failed": {"type": "array", "items": _ref("ReceiptFailure")},
                    "result": _ref("SendResult"),
                    "results": {"type": "array"},
                },
                ("id",),
            ),
        ),
        "error": (
            "A request failed; the connection stays open",
            _frame(
                "error",
                {"id": _ID, "code": {"type": "string"}, "message": {"type": "string"}},
                ("code", "message"),
            ),
        ),
        "pong": ("The answer to ping", _frame("pong", {"id": _ID})),
    }


def close_codes() -> list[dict[str, Any]]:
    """Every close code the gateway sends, what it means and whether to reconnect."""
    return [
        {
            "code": int(code),
            "name": code.name.lower(),
            "description": code.description,
            "reconnect": code.reconnect,
        }
        for code in CloseCode
    ]


def _messages(frames: dict[str, tuple[str, Schema]], prefix: str) -> dict[str, Any]:
    return {
        prefix + name: {
            "name": name,
            "summary": summary,
            "contentType": "application/json",
            "payload": payload,
        }
        for name, (summary, payload) in frames.items()
    }


@cache
def _document_bytes() -> bytes:
    settings = PushSettings()
    client = _messages(_client_frames(settings), "client_")
    server = _messages(_server_frames(), "server_")
    sse_close = {
        "name": "close",
        "summary": "The last event of a stream the server ends: why, and whether to come back",
        "contentType": "application/json",
        "payload": {
            "type": "object",
            "properties": {
                "code": {"enum": [int(c) for c in CloseCode]},
                "reason": {"type": "string"},
                "reconnect": {"type": "boolean"},
            },
            "required": ["code", "reason", "reconnect"],
        },
    }
    sse_message = {
        "name": "message",
        "summary": "One delivery; the SSE id is <stream-id>.<n> (send it back as Last-Event-ID)",
        "contentType": "application/json",
        "payload": _ref("ReceivedMessage"),
    }

    def refs(channel: str, names: list[str]) -> list[dict[str, str]]:
        return [{"$ref": f"#/channels/{channel}/messages/{name}"} for name in names]

    doc: dict[str, Any] = {
        "asyncapi": ASYNCAPI_VERSION,
        "info": {
            "title": "Pushgate push protocols",
            "version": "1",
            "description": "The pushgate.v1 WebSocket protocol and the SSE stream. Every frame is a JSON "
            "text frame with an op. The full reference with examples is docs/api.md in the repository; "
            "the HTTP API is /openapi.json.",
        },
        "channels": {
            "ws": {
                "address": "/v1/ws",
                "title": "WebSocket, subprotocol pushgate.v1",
                "description": "Authenticate with an Authorization header, an access_token query "
                "parameter, or a first auth frame. Browsers are checked against the tenant's origins.",
                "messages": {**client, **server},
                "bindings": {
                    "ws": {
                        "method": "GET",
                        "query": {
                            "type": "object",
                            "properties": {"access_token": {"type": "string"}},
                        },
                        "headers": {
                            "type": "object",
                            "properties": {
                                "Sec-WebSocket-Protocol": {"const": settings.subprotocol},
                                "Authorization": {"type": "string"},
                            },
                        },
                    }
                },
                "x-close-codes": close_codes(),
            },
            "sse": {
                "address": "/v1/queues/{queue}/events",
                "title": "Server-Sent Events",
                "description": "GET with Accept: text/event-stream; query prefetch, ack (manual or auto), "
                "visibility_timeout_s, access_token, last_event_id. Acks go to POST "
                "/v1/queues/{queue}/ack. A comment ping keeps the stream alive.",
                "parameters": {"queue": {"description": f"Queue name: {QUEUE_NAME_RULE}."}},
                "messages": {"message": sse_message, "close": sse_close},
            },
        },
        "operations": {
            "receiveClientFrames": {
                "action": "receive",
                "channel": {"$ref": "#/channels/ws"},
                "summary": "Frames a client sends",
                "messages": refs("ws", list(client)),
            },
            "sendServerFrames": {
                "action": "send",
                "channel": {"$ref": "#/channels/ws"},
                "summary": "Deliveries and replies the gateway sends",
                "messages": refs("ws", list(server)),
            },
            "sendEvents": {
                "action": "send",
                "channel": {"$ref": "#/channels/sse"},
                "summary": "Deliveries of one queue as events",
                "messages": refs("sse", ["message", "close"]),
            },
        },
        "components": {
            "schemas": SCHEMAS,
            "securitySchemes": {
                "bearer": {"type": "httpBearer", "description": "An API key or a JWT."},
            },
        },
    }
    return orjson.dumps(doc)


def asyncapi_bytes() -> bytes:
    return _document_bytes()


def asyncapi_document() -> dict[str, Any]:
    """A fresh copy of the document."""
    doc: dict[str, Any] = orjson.loads(_document_bytes())
    return doc
