"""The request edge: errors into problem documents, and per-request metrics.

Three pieces, so that the common path pays for one layer only:

- :class:`~gateway.routes.endpoint.Endpoint` runs the gateway's own handlers: it maps
  their errors and records their metrics itself, with no ``send`` wrapper;
- :class:`GatewayMiddleware` sits around the router and answers what the router
  raises before any endpoint runs (unknown path 404, wrong method 405);
- :class:`GuardedApp` wraps raw ASGI routes (the push engine's SSE endpoint) with the
  same 500 and metrics, since nothing else would.
"""

from __future__ import annotations

import logging
import time

import orjson
from starlette.exceptions import HTTPException
from starlette.responses import Response
from starlette.routing import Route, Router
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from backend_store.errors import NotFound, PushgateError

from .errors import MethodNotAllowed, problem, problem_response
from .metrics import GatewayMetrics

log = logging.getLogger("pushgate.gateway")

_INTERNAL_ERROR = orjson.dumps(problem("internal_error", "an unexpected error occurred"))
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def error_response(exc: Exception, scope: Scope) -> Response:
    """The response for an exception: its problem document, or a logged bare 500."""
    if isinstance(exc, PushgateError):
        return problem_response(exc)
    if isinstance(exc, HTTPException):
        if exc.status_code == 405:
            allow = (exc.headers or {}).get("Allow", "")
            return problem_response(MethodNotAllowed("method not allowed on this resource", allow))
        if exc.status_code == 404:
            return problem_response(NotFound("no such resource"))
    log.exception("unexpected error answering %s %s", scope.get("method"), scope.get("path"))
    return Response(_INTERNAL_ERROR, status_code=500, media_type="application/problem+json")


def allowed_methods(router: Router, path: str) -> str:
    """Every method served on ``path`` (RFC 9110: ``Allow`` lists all of them, not the
    first route's, though Starlette's 405 names only the first route that matched)."""
    methods: set[str] = set()
    for r in router.routes:
        if isinstance(r, Route) and r.methods and r.path_regex.match(path):
            methods |= r.methods
    return ", ".join(sorted(methods))


def method_label(scope: Scope) -> str:
    # Labels stay bounded: odd methods are pooled.
    method: str = scope["method"]
    return method if method in _METHODS else "other"


class GatewayMiddleware:
    """Around the router: its 404 and 405 become problem documents (and are counted)."""

    def __init__(self, app: Router, metrics: GatewayMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            await self.app(scope, receive, send)
        except HTTPException as exc:
            # The router raises before any endpoint has started a response.
            if exc.status_code == 405:
                exc.headers = {"Allow": allowed_methods(self.app, scope["path"])}
            response = error_response(exc, scope)
            await response(scope, receive, send)
            route = getattr(scope.get("route"), "path", "unmatched")
            self.metrics.observe(route, method_label(scope), response.status_code, 0.0)


class GuardedApp:
    """A raw ASGI route app with metrics and a problem-document 500 before its response starts."""

    def __init__(self, app: ASGIApp, route: str, metrics: GatewayMetrics) -> None:
        self.app = app
        self.route = route
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500
        started = False

        async def send_wrapper(message: Message) -> None:
            nonlocal status, started
            if message["type"] == "http.response.start":
                status = message["status"]
                started = True
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        except Exception as exc:
            if started:
                raise  # too late for a problem document; uvicorn logs it and drops the connection
            await error_response(exc, scope)(scope, receive, send_wrapper)
        finally:
            self.metrics.observe(self.route, method_label(scope), status, time.perf_counter() - start)
