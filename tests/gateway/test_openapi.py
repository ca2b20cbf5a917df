"""The OpenAPI document matches the server: schemathesis drives every operation with generated
(valid and invalid) requests and checks that nothing is a 5xx and every response fits the schema."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import Case, GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from starlette.routing import Route

from gateway.openapi import openapi_document

from .conftest import RunningGateway

# The served document equals openapi_document() (checked below), so the cases come from it
# directly. schemathesis' pytest plugin (from_fixture) does not run on pytest 9, hence
# one hypothesis test per operation and generation mode, written out here.
SCHEMA = schemathesis.openapi.from_dict(openapi_document())
NO_LIMITS = {"send": None, "receive": None, "connect": None, "per_key": None, "per_queue": None}
NO_LIMITS |= {"max_queues": None, "max_stored_messages": None}
# Negative cases (invalid on purpose) exist only for operations that take some input.
OPERATIONS = [
    (path, method, mode)
    for path, item in openapi_document()["paths"].items()
    for method, op in item.items()
    if method != "parameters" and not path.endswith("/events")  # an endless stream: tests/push covers it
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
    if mode is GenerationMode.POSITIVE or "parameters" in item or "parameters" in op or "requestBody" in op
]


@pytest.mark.slow
@pytest.mark.parametrize(("path", "method", "mode"), OPERATIONS)
def test_server_matches_openapi(
    gateway: RunningGateway, path: str, method: str, mode: GenerationMode
) -> None:
    operation = SCHEMA[path][method]
    headers = {"Authorization": f"Bearer {gateway.admin_key}"}

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=25, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    def check(case: Case[Any]) -> None:  # as_strategy() yields Case[Any]
        if case.path.endswith("/receive") and (case.body is None or isinstance(case.body, dict)):
            # Long-polls would make this test take minutes; their timing has its own tests.
            case.body = {**(case.body or {}), "wait_s": 0}
        case.call_and_validate(
            base_url=gateway.url,
            headers=headers,
            checks=[
                not_a_server_error,
                status_code_conformance,
                content_type_conformance,
                response_schema_conformance,
            ],
        )
        if case.path == "/v1/limits" and case.method.upper() == "PUT":
            # A generated "1/day" would throttle every later test on this shared gateway.
            httpx.put(f"{gateway.url}/v1/limits", headers=headers, json=NO_LIMITS)

    check()


def test_document_is_openapi_31_and_covers_every_route(gateway: RunningGateway) -> None:
    doc = httpx.get(f"{gateway.url}/openapi.json").json()
    assert doc == openapi_document()
    assert doc["openapi"].startswith("3.1")
    app_routes = {(r.path, m) for r in _routes(gateway) for m in r.methods or () if m != "HEAD"}
    documented = {(p, m.upper()) for p, item in doc["paths"].items() for m in item if m != "parameters"}
    assert documented - SELF_DESCRIPTION <= app_routes
    assert app_routes - SELF_DESCRIPTION - OTHER_PROTOCOLS <= documented


# Endpoints of another protocol, described by its own specification, not by this document:
# the SQS API (AWS JSON 1.0, `POST /`, docs/sqs.md; tests/sqs covers it with boto3).
OTHER_PROTOCOLS = {("/", "POST")}


def _routes(gateway: RunningGateway) -> list[Route]:
    return [r for r in gateway.app.routes if isinstance(r, Route)]


# Routes that describe the API rather than being part of it (tests/browser covers them).
SELF_DESCRIPTION = {
    ("/openapi.json", "GET"),
    ("/docs", "GET"),
    ("/docs/init.js", "GET"),
    ("/docs/assets/{name}", "GET"),
    ("/asyncapi.json", "GET"),
    ("/client/{name}", "GET"),
}
