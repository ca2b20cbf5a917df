"""The OpenAPI 3.1 description of the HTTP API (``/openapi.json``; ``/docs`` shows it in Swagger UI).

Written by hand next to the routes, and checked against the running server by a
schemathesis test (tests/gateway/test_openapi.py): request schemas say exactly what the
validators accept, response schemas what the handlers return. Every error is the
``default`` response, an RFC 9457 problem document.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import orjson

from backend_store.attributes import QUEUE_NAME
from backend_store.limits import (
    MAX_ATTRIBUTE_CHARS,
    MAX_ATTRIBUTES,
    MAX_BATCH,
    MAX_DELAY_S,
    MAX_ID_CHARS,
    MAX_RECEIPT_CHARS,
    MAX_RECEIPTS,
    MAX_VISIBILITY_S,
    MAX_WAIT_S,
)
from throttling.rates import MAX_RATE_CHARS
from web_console.alerts import KINDS, THRESHOLD_MEANING

from .errors import STATUS_BY_CODE
from .limits.document import OPERATIONS, QUEUE_OPERATIONS, QUOTA_BOUNDS
from .routes.operator import MAX_PEEK, MAX_REDRIVE

Schema = dict[str, Any]


def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def _obj(properties: dict[str, Schema], required: tuple[str, ...] = (), **extra: Any) -> Schema:
    return {
        "type": "object",
        "properties": properties,
        "required": list(required),
        "additionalProperties": False,
        **extra,
    }


def _num(low: float, high: float, *, integer: bool = False, nullable: bool = False, **extra: Any) -> Schema:
    kind: Any = "integer" if integer else "number"
    return {"type": [kind, "null"] if nullable else kind, "minimum": low, "maximum": high, **extra}


_ID = {"type": "string", "minLength": 1, "maxLength": MAX_ID_CHARS}
_RATE_ITEM = r"[1-9][0-9]{0,8}/(second|minute|hour|day)"
_RATE: Schema = {
    "type": ["string", "null"],
    "pattern": f"^{_RATE_ITEM}(;{_RATE_ITEM})*$",
    "maxLength": MAX_RATE_CHARS,
    "description": "limits notation, e.g. `100/second` or `10/second;500/minute`; null: no limit",
}


def _limits_schema(*, output: bool) -> Schema:
    """``GET/PUT /v1/limits`` (gateway/limits/document.py); a PUT may leave any field out."""

    def rates(operations: tuple[str, ...]) -> Schema:
        schema = _obj({op: _RATE for op in operations}, operations if output else ())
        return schema if output else {**schema, "type": ["object", "null"]}

    fields: dict[str, Schema] = {
        **{op: _RATE for op in OPERATIONS},
        "per_key": rates(OPERATIONS),
        "per_queue": rates(QUEUE_OPERATIONS),
        **{name: _num(low, high, integer=True, nullable=True) for name, (low, high) in QUOTA_BOUNDS.items()},
    }
    return _obj(fields, tuple(fields) if output else ())


_RECEIPT = {"type": "string", "minLength": 1, "maxLength": MAX_RECEIPT_CHARS}
_RECEIPTS = {"type": "array", "items": _RECEIPT, "minItems": 1, "maxItems": MAX_RECEIPTS}
_BASE64 = "^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"
_EPOCH = {"type": "number", "description": "Unix epoch seconds"}

_ATTRIBUTES_IN: dict[str, Schema] = {
    "max_message_bytes": _num(1, 1048576, integer=True, default=262144),
    "max_messages": _num(1, 10**9, integer=True, nullable=True, default=None),
    "visibility_timeout_s": _num(0, MAX_VISIBILITY_S, default=30),
    "retention_s": _num(60, 1209600, default=345600),
    "delay_s": _num(0, MAX_DELAY_S, default=0),
    "receive_wait_s": _num(0, MAX_WAIT_S, default=0),
    "max_receives": _num(1, 1000, integer=True, nullable=True, default=None),
    "dead_letter_queue": {
        "type": ["string", "null"],
        "pattern": QUEUE_NAME.pattern,
        "default": None,
        "description": "An existing queue of the same tenant; required with max_receives.",
    },
    "ordering": {"enum": ["best_effort", "fifo"], "default": "best_effort"},
    "dedupe_window_s": _num(0, 86400, default=300),
    "content_dedupe": {"type": "boolean", "default": False},
    "replication_factor": _num(1, 5, integer=True, default=1),
    "replication_mode": {"enum": ["sync", "async"], "default": "sync"},
    "partitions": _num(1, 64, integer=True, default=1),
}

_MESSAGE_PROPERTIES: dict[str, Schema] = {
    "body": {"type": "string", "description": "UTF-8 text"},
    "body_base64": {"type": "string", "pattern": _BASE64, "description": "binary payload, base64"},
    "attributes": {
        "type": "object",
        "maxProperties": MAX_ATTRIBUTES,
        "propertyNames": {"minLength": 1, "maxLength": 256},
        "additionalProperties": {"type": "string", "maxLength": MAX_ATTRIBUTE_CHARS},
    },
    "group_id": _ID,
    "dedupe_id": _ID,
    "delay_s": _num(0, MAX_DELAY_S),
}

SCHEMAS: dict[str, Schema] = {
    "Problem": {
        "type": "object",
        "description": "RFC 9457 problem document; clients switch on `code`.",
        "properties": {
            "type": {"type": "string"},
            "title": {"type": "string"},
            "status": {"type": "integer"},
            "detail": {"type": "string"},
            "code": {"enum": sorted(STATUS_BY_CODE)},
        },
        "required": ["type", "title", "status", "detail", "code"],
    },
    "QueueAttributesInput": _obj(_ATTRIBUTES_IN, description="Queue attributes; every one optional."),
    "QueueAttributes": _obj(
        {name: {k: v for k, v in s.items() if k != "default"} for name, s in _ATTRIBUTES_IN.items()},
        tuple(_ATTRIBUTES_IN),
    ),
    "QueueStats": _obj(
        {
            "visible": {"type": "integer"},
            "in_flight": {"type": "integer"},
            "delayed": {"type": "integer"},
            "oldest_age_s": {"type": ["number", "null"]},
            "consumers": {"type": "integer"},
            "sent_total": {"type": "integer"},
            "acked_total": {"type": "integer"},
            "dead_lettered_total": {"type": "integer"},
        },
        (
            "visible",
            "in_flight",
            "delayed",
            "oldest_age_s",
            "consumers",
            "sent_total",
            "acked_total",
            "dead_lettered_total",
        ),
    ),
    "Queue": _obj(
        {
            "name": {"type": "string"},
            "created_at": _EPOCH,
            "attributes": _ref("QueueAttributes"),
            "stats": _ref("QueueStats"),
        },
        ("name", "created_at", "attributes", "stats"),
    ),
    "QueueList": _obj({"queues": {"type": "array", "items": _ref("Queue")}}, ("queues",)),
    "Purged": _obj({"purged": {"type": "integer", "minimum": 0}}, ("purged",)),
    "Message": {
        **_obj(_MESSAGE_PROPERTIES),
        "oneOf": [{"required": ["body"]}, {"required": ["body_base64"]}],
        "description": "Exactly one of body and body_base64.",
    },
    "MessageBatch": _obj(
        {"messages": {"type": "array", "items": _ref("Message"), "minItems": 1, "maxItems": MAX_BATCH}},
        ("messages",),
    ),
    "SendResult": _obj(
        {"id": {"type": "string"}, "seq": {"type": "integer"}, "duplicate": {"type": "boolean"}},
        ("id", "seq", "duplicate"),
    ),
    "BatchResult": _obj(
        {
            "results": {
                "type": "array",
                "items": {"oneOf": [_ref("SendResult"), _obj({"error": _ref("Problem")}, ("error",))]},
            }
        },
        ("results",),
    ),
    "ReceiveRequest": _obj(
        {
            "max": _num(1, MAX_BATCH, integer=True, default=1),
            "wait_s": _num(0, MAX_WAIT_S, description="long-poll wait; default: the queue's receive_wait_s"),
            "visibility_timeout_s": _num(0, MAX_VISIBILITY_S),
        }
    ),
    "ReceivedMessage": {
        **_obj(
            {
                "id": {"type": "string"},
                "seq": {"type": "integer"},
                "receipt": {"type": "string"},
                "body": {"type": "string"},
                "body_base64": {"type": "string"},
                "attributes": {"type": "object", "additionalProperties": {"type": "string"}},
                "group_id": {"type": ["string", "null"]},
                "sent_at": _EPOCH,
                "receive_count": {"type": "integer", "minimum": 1},
            },
            ("id", "seq", "receipt", "attributes", "group_id", "sent_at", "receive_count"),
        ),
        "oneOf": [{"required": ["body"]}, {"required": ["body_base64"]}],
    },
    "ReceiveResponse": _obj({"messages": {"type": "array", "items": _ref("ReceivedMessage")}}, ("messages",)),
    "AckRequest": _obj({"receipts": _RECEIPTS}, ("receipts",)),
    "NackRequest": _obj(
        {"receipts": _RECEIPTS, "delay_s": _num(0, MAX_VISIBILITY_S, default=0)}, ("receipts",)
    ),
    "ReceiptFailure": _obj({"receipt": {"type": "string"}, "code": {"type": "string"}}, ("receipt", "code")),
    "AckResponse": _obj(
        {"acked": {"type": "integer"}, "failed": {"type": "array", "items": _ref("ReceiptFailure")}},
        ("acked", "failed"),
    ),
    "NackResponse": _obj(
        {"nacked": {"type": "integer"}, "failed": {"type": "array", "items": _ref("ReceiptFailure")}},
        ("nacked", "failed"),
    ),
    "VisibilityRequest": _obj(
        {"receipt": _RECEIPT, "timeout_s": _num(0, MAX_VISIBILITY_S)}, ("receipt", "timeout_s")
    ),
    "VisibilityResponse": _obj(
        {"receipt": {"type": "string"}, "visible_at": _EPOCH}, ("receipt", "visible_at")
    ),
    "PeekedMessage": {
        **_obj(
            {
                "id": {"type": "string"},
                "seq": {"type": "integer"},
                "body": {"type": "string"},
                "body_base64": {"type": "string"},
                "attributes": {"type": "object", "additionalProperties": {"type": "string"}},
                "group_id": {"type": ["string", "null"]},
                "sent_at": _EPOCH,
                "receive_count": {"type": "integer", "minimum": 0},
                "state": {"enum": ["visible", "delayed", "in_flight"]},
            },
            ("id", "seq", "attributes", "group_id", "sent_at", "receive_count", "state"),
        ),
        "oneOf": [{"required": ["body"]}, {"required": ["body_base64"]}],
    },
    "PeekResponse": _obj({"messages": {"type": "array", "items": _ref("PeekedMessage")}}, ("messages",)),
    "RedriveRequest": _obj(
        {
            "to": {
                "type": "string",
                "pattern": QUEUE_NAME.pattern,
                "description": "the queue to move them to",
            },
            "max": _num(1, MAX_REDRIVE, integer=True, default=1000),
        },
        ("to",),
    ),
    "Redriven": _obj({"moved": {"type": "integer", "minimum": 0}}, ("moved",)),
    "AlertRuleInput": _obj(
        {
            "kind": {
                "enum": list(KINDS),
                "description": "; ".join(f"`{k}`: {THRESHOLD_MEANING[k]}" for k in KINDS),
            },
            "threshold": _num(0, 1e12),
            "queue": {"type": ["string", "null"], "pattern": "^[A-Za-z0-9_*?-]{1,80}$"},
            "for_s": _num(0, 86400, default=0),
            "clear": _num(
                0, 1e12, nullable=True, description="resolve at or below this (default 80% of threshold)"
            ),
            "window_s": _num(1, 86400, default=300),
            "description": {"type": "string", "maxLength": 500},
        },
        ("kind",),
    ),
    "AlertRule": _obj(
        {
            "id": {"type": "string"},
            "tenant": {"type": "string"},
            "kind": {"enum": list(KINDS)},
            "threshold": {"type": "number"},
            "queue": {"type": ["string", "null"]},
            "for_s": {"type": "number"},
            "clear": {"type": ["number", "null"]},
            "window_s": {"type": "number"},
            "description": {"type": "string"},
            "created_at": _EPOCH,
        },
        (
            "id",
            "tenant",
            "kind",
            "threshold",
            "queue",
            "for_s",
            "clear",
            "window_s",
            "description",
            "created_at",
        ),
    ),
    "AlertRuleList": _obj({"rules": {"type": "array", "items": _ref("AlertRule")}}, ("rules",)),
    "Alert": _obj(
        {
            "rule_id": {"type": "string"},
            "kind": {"enum": list(KINDS)},
            "tenant": {"type": "string"},
            "subject": {"type": "string", "description": "tenant/queue, node/<id> or store"},
            "value": {"type": "number"},
            "threshold": {"type": "number"},
            "since": _EPOCH,
            "description": {"type": "string"},
        },
        ("rule_id", "kind", "tenant", "subject", "value", "threshold", "since", "description"),
    ),
    "AlertEvent": _obj(
        {
            "at": _EPOCH,
            "state": {"enum": ["fired", "resolved"]},
            "rule_id": {"type": "string"},
            "kind": {"enum": list(KINDS)},
            "tenant": {"type": "string"},
            "subject": {"type": "string"},
            "value": {"type": "number"},
            "threshold": {"type": "number"},
            "description": {"type": "string"},
        },
        ("at", "state", "rule_id", "kind", "tenant", "subject", "value", "threshold", "description"),
    ),
    "Alerts": _obj(
        {
            "active": {"type": "array", "items": _ref("Alert")},
            "history": {"type": "array", "items": _ref("AlertEvent")},
        },
        ("active", "history"),
    ),
    "TokenRequest": _obj(
        {
            "scope": {
                "type": "string",
                "description": "space-separated scopes, at most the key's (default: all of them)",
            },
            "ttl_s": _num(1, 86400, default=900),
        }
    ),
    "TokenResponse": _obj({"token": {"type": "string"}, "expires_at": _EPOCH}, ("token", "expires_at")),
    "Status": _obj({"status": {"type": "string"}}, ("status",)),
    "Cluster": _obj(
        {
            "nodes": {
                "type": "array",
                "items": _obj(
                    {
                        "id": {"type": "string"},
                        "address": {"type": "string", "description": "host:port of the node protocol"},
                        "state": {
                            "type": "string",
                            "description": "up, draining, or down (its lease expired)",
                        },
                        "lag": {
                            "type": "integer",
                            "description": "log entries its follower replicas lack behind their leaders",
                        },
                        "storage": {
                            "oneOf": [
                                {"type": "null"},
                                _obj(
                                    {
                                        "used_bytes": {"type": "integer"},
                                        "map_size": {"type": "integer"},
                                        "max_map_size": {"type": "integer"},
                                        "environments": {"type": "integer"},
                                        "map_used_ratio": {
                                            "type": "number",
                                            "description": "its fullest partition environment's use "
                                            "of its maximum map (0..1)",
                                        },
                                        "disk_free_bytes": {"type": "integer"},
                                        "disk_total_bytes": {"type": "integer"},
                                    },
                                    (
                                        "used_bytes",
                                        "map_size",
                                        "max_map_size",
                                        "environments",
                                        "map_used_ratio",
                                        "disk_free_bytes",
                                        "disk_total_bytes",
                                    ),
                                ),
                            ],
                            "description": "disk and map use as the node last published it; "
                            "null: not yet, or down",
                        },
                    },
                    ("id", "address", "state", "lag"),
                ),
            },
            "partitions": {
                "type": "array",
                "items": _obj(
                    {
                        "id": {"type": "integer"},
                        "tenant": {"type": "string"},
                        "queue": {"type": "string"},
                        "index": {"type": "integer"},
                        "leader": {"type": ["string", "null"], "description": "node id; null: being elected"},
                        "followers": {"type": "array", "items": {"type": "string"}},
                        "epoch": {"type": "integer", "description": "the leader's term"},
                        "lsn": {"type": "integer", "description": "the leader's last log position"},
                        "mode": {"enum": ["sync", "async"]},
                    },
                    ("id", "tenant", "queue", "index", "leader", "followers", "epoch", "lsn", "mode"),
                ),
            },
        },
        ("nodes", "partitions"),
    ),
    "Readiness": _obj(
        {
            "status": {"type": "string"},
            "shared_state": _obj(
                {
                    "url": {"type": "string"},
                    "status": {"enum": ["up", "down"]},
                    "since": {"type": ["number", "null"]},
                    "error": {"type": ["string", "null"]},
                },
                ("url", "status"),
                description="Redis (or memory://) behind rate limits and wake-ups; down: serving without it",
            ),
        },
        ("status",),
    ),
    "Limits": _limits_schema(output=True),
    "LimitsInput": _limits_schema(output=False),
}

_QUEUE_PARAM = {
    "name": "queue",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "pattern": QUEUE_NAME.pattern},
}
_ERROR = {
    "description": "An error: an RFC 9457 problem document with a stable `code`.",
    "content": {"application/problem+json": {"schema": _ref("Problem")}},
}


def _json(schema: Schema, description: str = "OK") -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _op(
    summary: str,
    responses: dict[str, Any],
    *,
    body: Schema | None = None,
    body_required: bool = True,
    params: list[dict[str, Any]] | None = None,
    description: str = "",
    public: bool = False,
    tag: str = "messages",
) -> dict[str, Any]:
    op: dict[str, Any] = {
        "summary": summary,
        "tags": [tag],
        "responses": {**responses, "default": _ERROR},
    }
    if description:
        op["description"] = description
    if params:
        op["parameters"] = params
    if body is not None:
        op["requestBody"] = {"required": body_required, "content": {"application/json": {"schema": body}}}
    if public:
        op["security"] = []
    return op


def _paths() -> dict[str, Any]:
    queue_param = [_QUEUE_PARAM]
    return {
        "/v1/queues": {
            "get": _op(
                "List the tenant's queues",
                {"200": _json(_ref("QueueList"))},
                description="Only queues the token has some scope on.",
                tag="queues",
            )
        },
        "/v1/queues/{queue}": {
            "parameters": queue_param,
            "put": _op(
                "Create a queue",
                {
                    "201": _json(_ref("Queue"), "Created"),
                    "200": _json(_ref("Queue"), "It exists with these attributes"),
                },
                body=_ref("QueueAttributesInput"),
                body_required=False,
                description="409 `queue_exists` if it exists with other attributes. Needs a scope on the queue.",
                tag="queues",
            ),
            "get": _op("Read a queue with its stats", {"200": _json(_ref("Queue"))}, tag="queues"),
            "patch": _op(
                "Change mutable attributes",
                {"200": _json(_ref("Queue"))},
                body=_ref("QueueAttributesInput"),
                description="`ordering` is immutable.",
                tag="queues",
            ),
            "delete": _op(
                "Delete a queue and its messages",
                {"204": {"description": "Deleted"}},
                description="Needs the `admin` scope.",
                tag="queues",
            ),
        },
        "/v1/queues/{queue}/purge": {
            "parameters": queue_param,
            "post": _op(
                "Delete every message of a queue",
                {"200": _json(_ref("Purged"))},
                description="Needs the `admin` scope.",
                tag="queues",
            ),
        },
        "/v1/queues/{queue}/messages": {
            "parameters": queue_param,
            "post": _op(
                "Send one message or a batch",
                {
                    "201": _json(_ref("SendResult"), "Stored durably"),
                    "200": _json(
                        {"oneOf": [_ref("SendResult"), _ref("BatchResult")]},
                        "A duplicate inside the dedupe window, or a batch (one result per entry)",
                    ),
                },
                body={"oneOf": [_ref("Message"), _ref("MessageBatch")]},
                params=[
                    {
                        "name": "Idempotency-Key",
                        "in": "header",
                        "required": False,
                        "schema": _ID,
                        "description": "The same as `dedupe_id` (single messages).",
                    }
                ],
                description="Needs `send:<queue>`. 2xx means stored durably (fsynced).",
            ),
        },
        "/v1/queues/{queue}/receive": {
            "parameters": queue_param,
            "post": _op(
                "Receive messages (pull or long-poll)",
                {"200": _json(_ref("ReceiveResponse"))},
                body=_ref("ReceiveRequest"),
                body_required=False,
                description="With `wait_s` > 0 returns as soon as a message is available. Needs `receive:<queue>`.",
            ),
        },
        "/v1/queues/{queue}/ack": {
            "parameters": queue_param,
            "post": _op(
                "Delete received messages", {"200": _json(_ref("AckResponse"))}, body=_ref("AckRequest")
            ),
        },
        "/v1/queues/{queue}/messages/{receipt}": {
            "parameters": [
                *queue_param,
                {"name": "receipt", "in": "path", "required": True, "schema": _RECEIPT},
            ],
            "delete": _op("Delete one received message", {"204": {"description": "Deleted"}}),
        },
        "/v1/queues/{queue}/nack": {
            "parameters": queue_param,
            "post": _op(
                "Give received messages back",
                {"200": _json(_ref("NackResponse"))},
                body=_ref("NackRequest"),
                description="They become visible after `delay_s`.",
            ),
        },
        "/v1/queues/{queue}/visibility": {
            "parameters": queue_param,
            "post": _op(
                "Keep a received message invisible longer",
                {"200": _json(_ref("VisibilityResponse"))},
                body=_ref("VisibilityRequest"),
            ),
        },
        "/v1/queues/{queue}/events": {
            "parameters": queue_param,
            "get": _op(
                "Push deliveries as Server-Sent Events",
                {
                    "200": {
                        "description": "An endless event stream: `event: message`, `id: <stream-id>.<n>`, "
                        "`data: <message JSON as in receive>`; `: ping` comments at least every 15 s.",
                        "content": {"text/event-stream": {"schema": {"type": "string"}}},
                    }
                },
                params=[
                    {
                        "name": "prefetch",
                        "in": "query",
                        "required": False,
                        "schema": _num(1, 1000, integer=True, default=10),
                    },
                    {
                        "name": "ack",
                        "in": "query",
                        "required": False,
                        "schema": {"enum": ["manual", "auto"], "default": "manual"},
                    },
                    {
                        "name": "visibility_timeout_s",
                        "in": "query",
                        "required": False,
                        "schema": _num(0, MAX_VISIBILITY_S),
                    },
                    {
                        "name": "Last-Event-ID",
                        "in": "header",
                        "required": False,
                        "schema": {"type": "string"},
                    },
                ],
                description="Needs `receive:<queue>`. `ack=manual`: ack over HTTP, at most `prefetch` unacked "
                "per stream. `ack=auto` deletes a message once written (at-most-once). The WebSocket "
                "protocol at `/v1/ws` is in `/asyncapi.json` and docs/api.md.",
                tag="push",
            ),
        },
        "/v1/tokens": {
            "post": _op(
                "Mint a JWT from an API key",
                {"201": _json(_ref("TokenResponse"), "Created")},
                body=_ref("TokenRequest"),
                body_required=False,
                tag="auth",
            ),
        },
        "/v1/limits": {
            "get": _op(
                "The tenant's rate limits and quotas",
                {"200": _json(_ref("Limits"))},
                description="Rates in `limits` notation; null: no limit. A request past a rate gets 429 "
                "`rate_limited` with `Retry-After`, `RateLimit-Policy` and `RateLimit`; past a quota, "
                "409 `quota_exceeded`.",
                tag="limits",
            ),
            "put": _op(
                "Change the tenant's rate limits and quotas",
                {"200": _json(_ref("Limits"))},
                body=_ref("LimitsInput"),
                description="Needs `admin`. Fields left out keep their value; null removes a limit.",
                tag="limits",
            ),
        },
        "/healthz": {"get": _op("Liveness", {"200": _json(_ref("Status"))}, public=True, tag="operations")},
        "/readyz": {
            "get": _op(
                "Readiness: the store takes writes (cluster mode: every partition has a leader)",
                {"200": _json(_ref("Readiness"))},
                public=True,
                tag="operations",
            )
        },
        "/metrics": {
            "get": _op(
                "Prometheus metrics",
                {
                    "200": {
                        "description": "Prometheus text format",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    }
                },
                description="Needs the `metrics` scope (`admin` includes it); see docs/metrics.md. "
                "`--metrics-listen` serves it without a token on a private address.",
                tag="operations",
            )
        },
        "/v1/cluster": {
            "get": _op(
                "The cluster's nodes and partitions",
                {"200": _json(_ref("Cluster"))},
                description="Needs `admin`; cluster mode only (`404 not_found` on the embedded store). "
                "The operator tenant's admins see every partition, others their tenant's. See docs/cluster.md.",
                tag="operations",
            )
        },
        "/v1/queues/{queue}/peek": {
            "parameters": queue_param,
            "get": _op(
                "Look at a queue's messages without changing anything",
                {"200": _json(_ref("PeekResponse"))},
                params=[
                    {
                        "name": "max",
                        "in": "query",
                        "required": False,
                        "schema": {"type": "integer", "minimum": 1, "maximum": MAX_PEEK, "default": 10},
                    }
                ],
                description="Messages in send order (visible, delayed and in flight), without receipts. "
                "Needs `admin` or `receive:` on the queue.",
                tag="dead letters",
            ),
        },
        "/v1/queues/{queue}/redrive": {
            "parameters": queue_param,
            "post": _op(
                "Move messages of a dead-letter queue back to a source queue",
                {"200": _json(_ref("Redriven"))},
                body=_ref("RedriveRequest"),
                description="Moves up to `max` visible messages, each exactly once (one atomic step "
                "per batch), as new sends with their body, attributes and group. Needs `admin`.",
                tag="dead letters",
            ),
        },
        "/v1/alerts": {
            "get": _op(
                "The tenant's firing alerts and recent transitions",
                {"200": _json(_ref("Alerts"))},
                description="Needs `admin`. History is newest first and kept in memory (a short window).",
                tag="alerts",
            )
        },
        "/v1/alerts/rules": {
            "get": _op("The tenant's alert rules", {"200": _json(_ref("AlertRuleList"))}, tag="alerts"),
            "post": _op(
                "Add an alert rule",
                {"201": _json(_ref("AlertRule"), "Created")},
                body=_ref("AlertRuleInput"),
                description="Needs `admin`. `map_use`, `node_down` and `replication_lag` rules are for "
                "the operator tenant's admins only. See docs/console.md.",
                tag="alerts",
            ),
        },
        "/v1/alerts/rules/{rule_id}": {
            "parameters": [{"name": "rule_id", "in": "path", "required": True, "schema": {"type": "string"}}],
            "delete": _op(
                "Delete an alert rule",
                {"204": {"description": "Deleted"}},
                description="Needs `admin`.",
                tag="alerts",
            ),
        },
    }


@cache
def _document_bytes() -> bytes:
    doc = {
        "openapi": "3.1.0",
        "info": {
            "title": "Pushgate",
            "version": "1",
            "description": "Push messaging gateway over a durable queue. Authenticate with "
            "`Authorization: Bearer <API key or JWT>` (the Authorize button). The WebSocket and SSE "
            "push protocols are in `/asyncapi.json`; the full reference, with examples, is docs/api.md "
            "in the repository. The browser client is served at `/client/pushgate.js`.",
        },
        "paths": _paths(),
        "components": {
            "schemas": SCHEMAS,
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer", "description": "An API key or a JWT."}
            },
        },
        "security": [{"bearer": []}],
    }
    return orjson.dumps(doc)


def openapi_document() -> dict[str, Any]:
    """A fresh copy of the document (callers may not share nested dicts)."""
    doc: dict[str, Any] = orjson.loads(_document_bytes())
    return doc


def openapi_bytes() -> bytes:
    return _document_bytes()
