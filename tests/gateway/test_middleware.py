"""The error edge as a function: what an unexpected exception becomes (no server needed)."""

from __future__ import annotations

import logging

import orjson
import pytest
from starlette.exceptions import HTTPException

from backend_store.errors import Forbidden, QueueFull
from gateway.middleware import error_response

SCOPE = {"type": "http", "method": "POST", "path": "/v1/queues/q/messages"}


def test_unexpected_exception_is_a_bare_logged_500(caplog: pytest.LogCaptureFixture) -> None:
    try:
        raise RuntimeError("secret internals: /etc/passwd")
    except RuntimeError as exc:
        with caplog.at_level(logging.ERROR, logger="pushgate.gateway"):
            response = error_response(exc, SCOPE)
    assert response.status_code == 500
    assert response.media_type == "application/problem+json"
    doc = orjson.loads(response.body)
    assert doc["code"] == "internal_error" and "secret" not in doc["detail"]
    assert "secret internals" in caplog.text  # logged with its traceback, not shown


def test_errors_with_codes_keep_them() -> None:
    assert error_response(QueueFull("full"), SCOPE).status_code == 409
    forbidden = error_response(Forbidden("no"), SCOPE)
    assert orjson.loads(forbidden.body)["code"] == "forbidden"
    not_allowed = error_response(HTTPException(405, headers={"Allow": "GET"}), SCOPE)
    assert not_allowed.status_code == 405 and not_allowed.headers["allow"] == "GET"
