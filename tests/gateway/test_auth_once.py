"""A browser request's bearer token is verified once: the CORS middleware verifies it (it
needs the tenant for the origin rule) and leaves the outcome in the ASGI scope, where the
route (and the SSE handler) take it instead of verifying again.

The two halves, each on the gateway's real authenticator and store: the middleware notes
what it verified; a route given a noted outcome uses it (shown with a token that would not
verify at all). Browser requests end to end: tests/browser/test_cors_http.py."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.requests import Request
from starlette.types import Message, Receive, Scope, Send

from backend_store.errors import Unauthorized
from gateway.auth.principal import Principal
from gateway.cors import CorsMiddleware
from gateway.routes.access import authenticate
from push.principal import AUTHENTICATED, authenticate_once, note_authenticated

from .conftest import RunningGateway

ORIGIN = "https://app.example"


def browser_scope(token: str, origin: str = ORIGIN) -> dict[str, Any]:
    return {
        "type": "http",
        "method": "GET",
        "path": "/v1/queues",
        "query_string": b"",
        "headers": [
            (b"host", b"gateway.test"),
            (b"origin", origin.encode()),
            (b"authorization", f"Bearer {token}".encode()),
        ],
    }


async def no_body() -> Message:
    return {"type": "http.request", "body": b"", "more_body": False}


async def through_cors(gateway: RunningGateway, scope: dict[str, Any]) -> list[Scope]:
    """Run the gateway's CORS middleware in front of an app that keeps the scopes it gets."""
    reached: list[Scope] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        reached.append(scope)
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def sent(message: Message) -> None:
        pass

    services = gateway.services
    await CorsMiddleware(app, services.authenticator, services.origin_rule)(scope, no_body, sent)
    return reached


@pytest.fixture(scope="module")
def browser_key(gateway: RunningGateway) -> tuple[str, str]:
    tenant = gateway.make_tenant()
    gateway.call(gateway.services.authenticator.tenants.set_origins(tenant, [ORIGIN]))
    return tenant, gateway.make_key("receive:*", tenant)


def test_the_middleware_leaves_what_it_verified_for_the_route(
    gateway: RunningGateway, browser_key: tuple[str, str]
) -> None:
    tenant, key = browser_key
    (scope,) = gateway.call(through_cors(gateway, browser_scope(key)))
    token, principal = scope[AUTHENTICATED]
    assert token == key and isinstance(principal, Principal) and principal.tenant == tenant
    # A token that proves nothing: its refusal is left for the route to answer.
    (scope,) = gateway.call(through_cors(gateway, browser_scope("pg_bogus")))
    token, refusal = scope[AUTHENTICATED]
    assert token == "pg_bogus" and isinstance(refusal, Unauthorized)


def test_the_route_and_the_sse_handler_take_the_noted_outcome(
    gateway: RunningGateway, browser_key: tuple[str, str]
) -> None:
    _, key = browser_key
    principal = gateway.call(gateway.services.authenticator.authenticate(key))
    # A token no authenticator would accept: only the note can make it pass.
    scope = browser_scope("not-a-token-at-all")
    note_authenticated(scope, "not-a-token-at-all", principal)
    assert gateway.call(authenticate(gateway.services, Request(scope))) is principal
    assert gateway.call(authenticate_once(scope, "not-a-token-at-all", _never)) is principal
    # A note for another token is ignored: the route verifies its own.
    scope = browser_scope(key)
    note_authenticated(scope, "another-token", Unauthorized("not this one"))
    assert gateway.call(authenticate(gateway.services, Request(scope))) == principal
    # A noted refusal is raised as the route's answer.
    scope = browser_scope("pg_bogus")
    note_authenticated(scope, "pg_bogus", Unauthorized("invalid API key"))
    with pytest.raises(Unauthorized, match="invalid API key"):
        gateway.call(authenticate(gateway.services, Request(scope)))


async def _never(token: str) -> Principal:
    raise AssertionError("verified a second time")
