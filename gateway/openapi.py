"""The OpenAPI 3.1 description of the HTTP API (``/openapi.json``; ``/docs`` shows it in Swagger UI).

Written by hand next to the routes, and checked against the running server by a
schemathesis test (tests/gateway/test_openapi.py): request schemas (openapi_schemas.py) say
exactly what the validators accept, response schemas what the handlers return. Every error
is the ``default`` response, an RFC 9457 problem document.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import orjson

from backend_store.attributes import QUEUE_NAME
from backend_store.limits import MAX_VISIBILITY_S

from .openapi_schemas import ID, RECEIPT, SCHEMAS, Schema, num, ref
from .routes.operator import MAX_PEEK

_QUEUE_PARAM = {
    "name": "queue",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "pattern": QUEUE_NAME.pattern},
}
_ERROR = {
    "description": "An error: an RFC 9457 problem document with a stable `code`.",
    "content": {"application/problem+json": {"schema": ref("Problem")}},
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
                {"200": _json(ref("QueueList"))},
                params=[
                    {
                        "name": "limit",
                        "in": "query",
                        "required": False,
                        "schema": {"type": "integer", "minimum": 1, "maximum": 1000, "default": 1000},
                    },
                    {"name": "cursor", "in": "query", "required": False, "schema": {"type": "string"}},
                ],
                description="Only queues the token has some scope on, by name, a page of up to `limit` "
                "at a time. `next_cursor` is there only when more queues follow: pass it as `cursor` for "
                "the next page. A page is read before the token's scopes filter it, so it may hold fewer "
                "than `limit` queues (even none) while `next_cursor` is there.",
                tag="queues",
            )
        },
        "/v1/queues/{queue}": {
            "parameters": queue_param,
            "put": _op(
                "Create a queue",
                {
                    "201": _json(ref("Queue"), "Created"),
                    "200": _json(ref("Queue"), "It exists with these attributes"),
                },
                body=ref("QueueAttributesInput"),
                body_required=False,
                description="409 `queue_exists` if it exists with other attributes. Creating needs `manage:` "
                "on the queue; finding it as it is (200) needs any scope on it. A `dead_letter_queue` must "
                "be one the token may `manage:` or `send:` to.",
                tag="queues",
            ),
            "get": _op("Read a queue with its stats", {"200": _json(ref("Queue"))}, tag="queues"),
            "patch": _op(
                "Change mutable attributes",
                {"200": _json(ref("Queue"))},
                body=ref("QueueAttributesInput"),
                description="Needs `manage:` on the queue (and `manage:` or `send:` on a new "
                "`dead_letter_queue`). `ordering` is immutable.",
                tag="queues",
            ),
            "delete": _op(
                "Delete a queue and its messages",
                {"204": {"description": "Deleted"}},
                description="Needs `manage:` on the queue (or `admin`).",
                tag="queues",
            ),
        },
        "/v1/queues/{queue}/purge": {
            "parameters": queue_param,
            "post": _op(
                "Delete every message of a queue",
                {"200": _json(ref("Purged"))},
                description="Needs `manage:` on the queue (or `admin`).",
                tag="queues",
            ),
        },
        "/v1/queues/{queue}/messages": {
            "parameters": queue_param,
            "post": _op(
                "Send one message or a batch",
                {
                    "201": _json(ref("SendResult"), "Stored durably"),
                    "200": _json(
                        {"oneOf": [ref("SendResult"), ref("BatchResult")]},
                        "A duplicate inside the dedupe window, or a batch (one result per entry)",
                    ),
                },
                body={"oneOf": [ref("Message"), ref("MessageBatch")]},
                params=[
                    {
                        "name": "Idempotency-Key",
                        "in": "header",
                        "required": False,
                        "schema": ID,
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
                {"200": _json(ref("ReceiveResponse"))},
                body=ref("ReceiveRequest"),
                body_required=False,
                description="With `wait_s` > 0 returns as soon as a message is available. Needs `receive:<queue>`.",
            ),
        },
        "/v1/queues/{queue}/ack": {
            "parameters": queue_param,
            "post": _op(
                "Delete received messages", {"200": _json(ref("AckResponse"))}, body=ref("AckRequest")
            ),
        },
        "/v1/queues/{queue}/messages/{receipt}": {
            "parameters": [
                *queue_param,
                {"name": "receipt", "in": "path", "required": True, "schema": RECEIPT},
            ],
            "delete": _op("Delete one received message", {"204": {"description": "Deleted"}}),
        },
        "/v1/queues/{queue}/nack": {
            "parameters": queue_param,
            "post": _op(
                "Give received messages back",
                {"200": _json(ref("NackResponse"))},
                body=ref("NackRequest"),
                description="They become visible after `delay_s`.",
            ),
        },
        "/v1/queues/{queue}/visibility": {
            "parameters": queue_param,
            "post": _op(
                "Keep a received message invisible longer",
                {"200": _json(ref("VisibilityResponse"))},
                body=ref("VisibilityRequest"),
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
                        "schema": num(1, 1000, integer=True, default=10),
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
                        "schema": num(0, MAX_VISIBILITY_S),
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
                {"201": _json(ref("TokenResponse"), "Created")},
                body=ref("TokenRequest"),
                body_required=False,
                tag="auth",
            ),
        },
        "/v1/limits": {
            "get": _op(
                "The tenant's rate limits and quotas",
                {"200": _json(ref("Limits"))},
                description="Rates in `limits` notation; null: no limit. A request past a rate gets 429 "
                "`rate_limited` with `Retry-After`, `RateLimit-Policy` and `RateLimit`; past a quota, "
                "409 `quota_exceeded`.",
                tag="limits",
            ),
            "put": _op(
                "Change the tenant's rate limits and quotas",
                {"200": _json(ref("Limits"))},
                body=ref("LimitsInput"),
                description="Needs `admin`. Fields left out keep their value; null removes a limit.",
                tag="limits",
            ),
        },
        "/healthz": {"get": _op("Liveness", {"200": _json(ref("Status"))}, public=True, tag="operations")},
        "/readyz": {
            "get": _op(
                "Readiness: the store takes writes (cluster mode: every partition has a leader)",
                {"200": _json(ref("Readiness"))},
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
                {"200": _json(ref("Cluster"))},
                description="Needs `admin`; cluster mode only (`404 not_found` on the embedded store). "
                "The operator tenant's admins see every partition, others their tenant's. See docs/cluster.md.",
                tag="operations",
            )
        },
        "/v1/queues/{queue}/peek": {
            "parameters": queue_param,
            "get": _op(
                "Look at a queue's messages without changing anything",
                {"200": _json(ref("PeekResponse"))},
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
                {"200": _json(ref("Redriven"))},
                body=ref("RedriveRequest"),
                description="Moves up to `max` visible messages, each exactly once (one atomic step "
                "per batch), as new sends with their body, attributes and group. Needs `admin`.",
                tag="dead letters",
            ),
        },
        "/v1/alerts": {
            "get": _op(
                "The tenant's firing alerts and recent transitions",
                {"200": _json(ref("Alerts"))},
                description="Needs `admin`. History is newest first and kept in memory (a short window).",
                tag="alerts",
            )
        },
        "/v1/alerts/rules": {
            "get": _op("The tenant's alert rules", {"200": _json(ref("AlertRuleList"))}, tag="alerts"),
            "post": _op(
                "Add an alert rule",
                {"201": _json(ref("AlertRule"), "Created")},
                body=ref("AlertRuleInput"),
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
