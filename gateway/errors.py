"""The one place where errors become HTTP problem documents (RFC 9457).

Every error the gateway answers with has a stable ``code``: the store's
:class:`~backend_store.errors.StoreError` subclasses and the gateway's own
:class:`GatewayError` subclasses below. :data:`STATUS_BY_CODE` maps codes to statuses;
:func:`problem_response` builds the response. Unexpected exceptions become a bare 500
without details (logged, never shown).
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import Response

from backend_store.errors import StoreError

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
}


class GatewayError(Exception):
    """Root of the gateway's own errors; ``headers`` are added to the HTTP response."""

    code: str = "internal_error"

    def __init__(self, detail: str = "", headers: dict[str, str] | None = None) -> None:
        super().__init__(detail or self.code)
        self.detail = detail or TITLES.get(self.code, self.code)
        self.headers = headers or {}


class Unauthorized(GatewayError):
    code = "unauthorized"


class Forbidden(GatewayError):
    code = "forbidden"


class NotFound(GatewayError):
    code = "not_found"


class MethodNotAllowed(GatewayError):
    code = "method_not_allowed"


class RequestTooLarge(GatewayError):
    code = "request_too_large"


class UnsupportedMediaType(GatewayError):
    code = "unsupported_media_type"


class RateLimited(GatewayError):
    code = "rate_limited"


class InvalidRequest(GatewayError):
    code = "invalid_request"


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


def problem_for(exc: GatewayError | StoreError) -> dict[str, Any]:
    return problem(exc.code, exc.detail)


def problem_response(exc: GatewayError | StoreError) -> Response:
    """Build the HTTP response for an error with a code."""
    doc = problem_for(exc)
    headers = dict(exc.headers) if isinstance(exc, GatewayError) else {}
    if exc.code == "unauthorized":
        headers.setdefault("WWW-Authenticate", "Bearer")
    if exc.code in ("unavailable", "configuration_error"):
        headers.setdefault("Retry-After", "1")
    return Response(
        orjson.dumps(doc),
        status_code=doc["status"],
        media_type="application/problem+json",
        headers=headers,
    )
