"""CORS and the origin rule for HTTP, in one ASGI middleware (see docs/browser.md).

Only requests with an ``Origin`` header (browsers) pay for anything here; the others go
straight through. For a browser request:

- its own origin (a page the gateway serves): straight through;
- a preflight (``OPTIONS`` with ``Access-Control-Request-Method``): it carries no
  credentials, so the tenant is unknown; it is answered 204 with the allowed methods and
  headers when *some* tenant allows the origin, and 403 otherwise;
- a request with a bearer token (``Authorization`` or ``?access_token=``): the token is
  authenticated once, here (the outcome is left in the scope under
  ``push.principal.AUTHENTICATED`` and the route takes it from there) and the origin checked against
  the token's tenant; a foreign origin gets 403 ``forbidden`` before the route runs, so
  nothing is sent, received, acked or minted; an allowed one gets
  ``Access-Control-Allow-Origin: <origin>`` and ``Vary: Origin`` on its response;
- a request that proves no tenant (no token, or a bad one): the route answers (a 401, or
  a public resource such as the JS client) with ``Access-Control-Allow-Origin: *``,
  which lets a page read that its token expired and reveals nothing else.

Credentials are bearer tokens, never cookies, so ``Access-Control-Allow-Credentials`` is
never sent (and ``*`` is never combined with it).
"""

from __future__ import annotations

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from backend_store.errors import PushgateError
from push.principal import note_authenticated
from push.ws_handler import bearer_token, header

from .auth.authenticator import Authenticator
from .errors import problem
from .origins import OriginRule, same_origin

ALLOWED_METHODS = "GET, HEAD, POST, PUT, PATCH, DELETE"
ALLOWED_HEADERS = "Authorization, Content-Type, Idempotency-Key, Last-Event-ID, Accept"
# Response headers a page may read besides the CORS-safelisted ones.
# (RateLimit and RateLimit-Policy are the IETF draft's fields that gateway/limits sends.)
EXPOSED_HEADERS = "Retry-After, WWW-Authenticate, Location, RateLimit, RateLimit-Policy"
# How long a browser may cache a preflight answer (Chromium caps it at 7200 s).
PREFLIGHT_MAX_AGE_S = 600


def _refusal(detail: str, extra: list[tuple[bytes, bytes]] | None = None) -> tuple[Message, Message]:
    body = orjson.dumps(problem("forbidden", detail))
    headers = [
        (b"content-type", b"application/problem+json"),
        (b"content-length", str(len(body)).encode()),
        (b"vary", b"Origin"),
        *(extra or []),
    ]
    return (
        {"type": "http.response.start", "status": 403, "headers": headers},
        {"type": "http.response.body", "body": body},
    )


class CorsMiddleware:
    """Answers preflights, refuses foreign origins, and adds CORS headers to what it lets through."""

    def __init__(self, app: ASGIApp, authenticator: Authenticator, rule: OriginRule) -> None:
        self.app = app
        self.authenticator = authenticator
        self.rule = rule

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)  # WebSockets: the handler asks the same rule
            return
        origin = header(scope, b"origin")
        if origin is None:
            await self.app(scope, receive, send)
            return
        host = header(scope, b"host")
        if same_origin(origin, host):
            await self.app(scope, receive, send)
            return
        if scope["method"] == "OPTIONS" and header(scope, b"access-control-request-method") is not None:
            await self._preflight(origin, host, send)
            return
        token = bearer_token(scope)
        principal = None
        if token is not None:
            try:
                principal = await self.authenticator.authenticate(token)
            except PushgateError as exc:
                note_authenticated(scope, token, exc)  # the route answers the error itself
            else:
                # The route takes the principal from here: one verification per request.
                note_authenticated(scope, token, principal)
        if principal is None:
            await self.app(scope, receive, _with_headers(send, [(b"access-control-allow-origin", b"*")]))
            return
        if not await self.rule.allows(principal.tenant, origin, host):
            for message in _refusal(f"this tenant does not allow browser requests from origin {origin!r}"):
                await send(message)
            return
        added = [
            (b"access-control-allow-origin", origin.encode("latin-1")),
            (b"access-control-expose-headers", EXPOSED_HEADERS.encode()),
        ]
        await self.app(scope, receive, _with_headers(send, added, vary=True))

    async def _preflight(self, origin: str, host: str | None, send: Send) -> None:
        if not await self.rule.any_tenant_allows(origin, host):
            for message in _refusal(f"no tenant allows browser requests from origin {origin!r}"):
                await send(message)
            return
        headers = [
            (b"access-control-allow-origin", origin.encode("latin-1")),
            (b"access-control-allow-methods", ALLOWED_METHODS.encode()),
            (b"access-control-allow-headers", ALLOWED_HEADERS.encode()),
            (b"access-control-max-age", str(PREFLIGHT_MAX_AGE_S).encode()),
            (b"vary", b"Origin"),
            (b"content-length", b"0"),
        ]
        await send({"type": "http.response.start", "status": 204, "headers": headers})
        await send({"type": "http.response.body", "body": b""})


def _with_headers(send: Send, added: list[tuple[bytes, bytes]], *, vary: bool = False) -> Send:
    async def send_with_headers(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = list(message.get("headers", []))
            if vary:
                merged = False
                for i, (name, value) in enumerate(headers):
                    if name.lower() == b"vary":
                        headers[i] = (name, value + b", Origin")
                        merged = True
                if not merged:
                    headers.append((b"vary", b"Origin"))
            headers.extend(added)
            message = {**message, "headers": headers}
        await send(message)

    return send_with_headers
