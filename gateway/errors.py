"""The one place where errors become HTTP problem documents (RFC 9457).

Every error the gateway answers with is a :class:`~backend_store.errors.PushgateError`
with a stable ``code`` (the tree is drawn in ``backend_store/errors.py``; the three
HTTP-only codes are defined below). :data:`STATUS_BY_CODE` maps codes to statuses;
:func:`problem_response` builds the response. Unexpected exceptions become a bare 500
without details (logged, never shown).
"""

from __future__ import annotations

import math
from typing import Any

import orjson
from starlette.responses import Response

from backend_store.errors import PushgateError, RateLimited

PROBLEM_TYPE_BASE = "https://pushgate.dev/problems/"

STATUS_BY_CODE: dict[str, int] = {
    "invalid_request": 400,
    "invalid_receipt": 400,
    "unauthorized": 401,
    "forbidden": 403,
    "queue_not_found": 404,
    "not_found": 404,
    "method_not_allowed": 405,
    "queue_exists": 409,
    "queue_full": 409,
    "quota_exceeded": 409,
    "message_too_large": 413,
    "request_too_large": 413,
    "unsupported_media_type": 415,
    "rate_limited": 429,
    "internal_error": 500,
    "unavailable": 503,
    "configuration_error": 503,
    # Cluster internals that can surface while a partition moves: retry shortly.
    "replication_gap": 503,
    "stale_epoch": 503,
}

TITLES: dict[str, str] = {
    "invalid_request": "Invalid request",
    "invalid_receipt": "Invalid receipt",
    "unauthorized": "Unauthorized",
    "forbidden": "Forbidden",
    "queue_not_found": "Queue not found",
    "not_found": "Not found",
    "method_not_allowed": "Method not allowed",
    "queue_exists": "Queue exists",
    "queue_full": "Queue full",
    "quota_exceeded": "Quota exceeded",
    "message_too_large": "Message too large",
    "request_too_large": "Request too large",
    "unsupported_media_type": "Unsupported media type",
    "rate_limited": "Rate limited",
    "internal_error": "Internal error",
    "unavailable": "Service unavailable",
    "configuration_error": "Service unavailable",
    "replication_gap": "Service unavailable",
    "stale_epoch": "Service unavailable",
}


class MethodNotAllowed(PushgateError):
    """Wrong method for a path; ``allow`` lists the methods it serves (the Allow header)."""

    code = "method_not_allowed"

    def __init__(self, detail: str = "", allow: str = "") -> None:
        super().__init__(detail)
        self.allow = allow


class RequestTooLarge(PushgateError):
    code = "request_too_large"


class UnsupportedMediaType(PushgateError):
    code = "unsupported_media_type"


class RateLimitedWithFields(RateLimited):
    """A 429 that also carries the IETF ``RateLimit-Policy`` / ``RateLimit`` fields (gateway/limits)."""

    def __init__(self, detail: str, retry_after_s: float, fields: list[tuple[bytes, bytes]]) -> None:
        super().__init__(detail, retry_after_s)
        self.fields = fields


def problem(code: str, detail: str) -> dict[str, Any]:
    """The problem document for a code."""
    status = STATUS_BY_CODE.get(code, 500)
    return {
        "type": PROBLEM_TYPE_BASE + code,
        "title": TITLES.get(code, "Error"),
        "status": status,
        "detail": detail,
        "code": code,
    }


def problem_for(exc: PushgateError) -> dict[str, Any]:
    return problem(exc.code, exc.detail)


def problem_response(exc: PushgateError) -> Response:
    """Build the HTTP response for an error with a code."""
    doc = problem_for(exc)
    headers: dict[str, str] = {}
    if exc.code == "unauthorized":
        headers["WWW-Authenticate"] = "Bearer"
    if isinstance(exc, MethodNotAllowed) and exc.allow:
        headers["Allow"] = exc.allow
    if isinstance(exc, RateLimitedWithFields):
        headers.update((name.decode("latin-1"), value.decode("latin-1")) for name, value in exc.fields)
    if exc.retry_after_s is not None:
        # Whole seconds, rounded up (RFC 9110 delay-seconds).
        headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after_s)))
    return Response(
        orjson.dumps(doc),
        status_code=doc["status"],
        media_type="application/problem+json",
        headers=headers,
    )
