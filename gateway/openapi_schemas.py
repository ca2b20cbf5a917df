"""The JSON Schemas of the HTTP API's bodies (OpenAPI ``components.schemas``).

Shared by the OpenAPI document (openapi.py) and the AsyncAPI one (asyncapi.py). Request
schemas say exactly what the validators accept, response schemas what the handlers return.
"""

from __future__ import annotations

from typing import Any

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
from .routes.operator import MAX_REDRIVE

Schema = dict[str, Any]


def ref(name: str) -> Schema:
    """A reference to one of :data:`SCHEMAS`."""
    return {"$ref": f"#/components/schemas/{name}"}


def _obj(properties: dict[str, Schema], required: tuple[str, ...] = (), **extra: Any) -> Schema:
    return {
        "type": "object",
        "properties": properties,
        "required": list(required),
        "additionalProperties": False,
        **extra,
    }


def num(low: float, high: float, *, integer: bool = False, nullable: bool = False, **extra: Any) -> Schema:
    kind: Any = "integer" if integer else "number"
    return {"type": [kind, "null"] if nullable else kind, "minimum": low, "maximum": high, **extra}


ID = {"type": "string", "minLength": 1, "maxLength": MAX_ID_CHARS}
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
        **{name: num(low, high, integer=True, nullable=True) for name, (low, high) in QUOTA_BOUNDS.items()},
    }
    return _obj(fields, tuple(fields) if output else ())


RECEIPT = {"type": "string", "minLength": 1, "maxLength": MAX_RECEIPT_CHARS}
_RECEIPTS = {"type": "array", "items": RECEIPT, "minItems": 1, "maxItems": MAX_RECEIPTS}
_BASE64 = "^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"
_EPOCH = {"type": "number", "description": "Unix epoch seconds"}

_ATTRIBUTES_IN: dict[str, Schema] = {
    "max_message_bytes": num(1, 1048576, integer=True, default=262144),
    "max_messages": num(1, 10**9, integer=True, nullable=True, default=None),
    "visibility_timeout_s": num(0, MAX_VISIBILITY_S, default=30),
    "retention_s": num(60, 1209600, default=345600),
    "delay_s": num(0, MAX_DELAY_S, default=0),
    "receive_wait_s": num(0, MAX_WAIT_S, default=0),
    "max_receives": num(1, 1000, integer=True, nullable=True, default=None),
    "dead_letter_queue": {
        "type": ["string", "null"],
        "pattern": QUEUE_NAME.pattern,
        "default": None,
        "description": "An existing queue of the same tenant; required with max_receives.",
    },
    "ordering": {"enum": ["best_effort", "fifo"], "default": "best_effort"},
    "dedupe_window_s": num(0, 86400, default=300),
    "content_dedupe": {"type": "boolean", "default": False},
    "replication_factor": num(1, 5, integer=True, default=1),
    "replication_mode": {"enum": ["sync", "async"], "default": "sync"},
    "partitions": num(1, 64, integer=True, default=1),
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
    "group_id": ID,
    "dedupe_id": ID,
    "delay_s": num(0, MAX_DELAY_S),
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
            "attributes": ref("QueueAttributes"),
            "stats": ref("QueueStats"),
        },
        ("name", "created_at", "attributes", "stats"),
    ),
    "QueueList": _obj(
        {"queues": {"type": "array", "items": ref("Queue")}, "next_cursor": {"type": "string"}}, ("queues",)
    ),
    "Purged": _obj({"purged": {"type": "integer", "minimum": 0}}, ("purged",)),
    "Message": {
        **_obj(_MESSAGE_PROPERTIES),
        "oneOf": [{"required": ["body"]}, {"required": ["body_base64"]}],
        "description": "Exactly one of body and body_base64.",
    },
    "MessageBatch": _obj(
        {"messages": {"type": "array", "items": ref("Message"), "minItems": 1, "maxItems": MAX_BATCH}},
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
                "items": {"oneOf": [ref("SendResult"), _obj({"error": ref("Problem")}, ("error",))]},
            }
        },
        ("results",),
    ),
    "ReceiveRequest": _obj(
        {
            "max": num(1, MAX_BATCH, integer=True, default=1),
            "wait_s": num(0, MAX_WAIT_S, description="long-poll wait; default: the queue's receive_wait_s"),
            "visibility_timeout_s": num(0, MAX_VISIBILITY_S),
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
    "ReceiveResponse": _obj({"messages": {"type": "array", "items": ref("ReceivedMessage")}}, ("messages",)),
    "AckRequest": _obj({"receipts": _RECEIPTS}, ("receipts",)),
    "NackRequest": _obj(
        {"receipts": _RECEIPTS, "delay_s": num(0, MAX_VISIBILITY_S, default=0)}, ("receipts",)
    ),
    "ReceiptFailure": _obj({"receipt": {"type": "string"}, "code": {"type": "string"}}, ("receipt", "code")),
    "AckResponse": _obj(
        {"acked": {"type": "integer"}, "failed": {"type": "array", "items": ref("ReceiptFailure")}},
        ("acked", "failed"),
    ),
    "NackResponse": _obj(
        {"nacked": {"type": "integer"}, "failed": {"type": "array", "items": ref("ReceiptFailure")}},
        ("nacked", "failed"),
    ),
    "VisibilityRequest": _obj(
        {"receipt": RECEIPT, "timeout_s": num(0, MAX_VISIBILITY_S)}, ("receipt", "timeout_s")
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
    "PeekResponse": _obj({"messages": {"type": "array", "items": ref("PeekedMessage")}}, ("messages",)),
    "RedriveRequest": _obj(
        {
            "to": {
                "type": "string",
                "pattern": QUEUE_NAME.pattern,
                "description": "the queue to move them to",
            },
            "max": num(1, MAX_REDRIVE, integer=True, default=1000),
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
            "threshold": num(0, 1e12),
            "queue": {"type": ["string", "null"], "pattern": "^[A-Za-z0-9_*?-]{1,80}$"},
            "for_s": num(0, 86400, default=0),
            "clear": num(
                0, 1e12, nullable=True, description="resolve at or below this (default 80% of threshold)"
            ),
            "window_s": num(1, 86400, default=300),
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
    "AlertRuleList": _obj({"rules": {"type": "array", "items": ref("AlertRule")}}, ("rules",)),
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
            "active": {"type": "array", "items": ref("Alert")},
            "history": {"type": "array", "items": ref("AlertEvent")},
        },
        ("active", "history"),
    ),
    "TokenRequest": _obj(
        {
            "scope": {
                "type": "string",
                "description": "space-separated scopes, at most the key's (default: all of them)",
            },
            "ttl_s": num(1, 86400, default=900),
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
                        "strays": {
                            "type": "array",
                            "description": "replicas it keeps but does not serve (never deleted without a "
                            "tombstone: docs/cluster.md, section 11)",
                            "items": _obj(
                                {"partition": {"type": "integer"}, "reason": {"type": "string"}},
                                ("partition", "reason"),
                            ),
                        },
                        "refusal": {
                            "type": ["string", "null"],
                            "description": "why the node serves nothing (its etcd holds no cluster or another)",
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
                        "learners": {
                            "type": "array",
                            "items": {"type": "string"},
                            "description": "replicas catching up, not yet voting (a move in progress)",
                        },
                        "leaving": {
                            "type": "array",
                            "items": {"type": "string"},
                            "description": "voters being removed once the new set has taken over",
                        },
                        "successor": {
                            "type": ["string", "null"],
                            "description": "the node the leader is handing over to",
                        },
                    },
                    ("id", "tenant", "queue", "index", "leader", "followers", "epoch", "lsn", "mode"),
                ),
            },
            "cluster": _obj(
                {
                    "id": {"type": ["string", "null"]},
                    "trusted": {"type": "boolean"},
                    "refusal": {"type": ["string", "null"]},
                },
                ("id", "trusted", "refusal"),
                description="the cluster's identity as this gateway judges etcd (docs/cluster.md, section 11)",
            ),
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
