"""The app factory: :func:`create_app` wires services, routes, errors and metrics.

Push transports (WebSocket ``/v1/ws``, SSE ``/v1/queues/{queue}/events``) plug in at
:func:`push_routes`: it gets the same :class:`GatewayServices` as every other route.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.responses import Response
from starlette.routing import BaseRoute, Route, WebSocketRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from backend_store.backend import Backend
from backend_store.errors import StoreError
from push import AckTrackingBackend, PrincipalLike, PushEngine, PushSettings, SseHandler, WebSocketHandler
from push.sse_handler import plain_error_response

from .errors import GatewayError, MethodNotAllowed, NotFound, problem, problem_response
from .metrics import GatewayMetrics
from .routes.messages import MessageRoutes
from .routes.ops import OpsRoutes
from .routes.queues import QueueRoutes
from .routes.tokens import TokenRoutes
from .services import GatewayServices
from .settings import Settings

log = logging.getLogger("pushgate.gateway")

_INTERNAL_ERROR = orjson.dumps(problem("internal_error", "an unexpected error occurred"))
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def push_routes(services: GatewayServices) -> list[BaseRoute]:
    """Routes of the push delivery engine (WebSocket and SSE); see docs/push.md."""
    engine = PushEngine(services.backend, services.hub, PushSettings())
    # HTTP acks and nacks must give SSE streams their credit back, so routes see the
    # backend through a wrapper that tells the engine (every call passes through).
    services.backend = AckTrackingBackend(services.backend, engine.settle)
    services.components.append(engine)  # started after the backend, drained before it closes
    services.consumers = engine.consumers
    authenticator = services.authenticator

    async def origin_allowed(principal: PrincipalLike, origin: str) -> bool:
        return await authenticator.origin_allowed(principal.tenant, origin)

    def error_response(exc: Exception) -> Response:
        return (
            problem_response(exc) if isinstance(exc, GatewayError | StoreError) else plain_error_response(exc)
        )

    return [
        WebSocketRoute("/v1/ws", WebSocketHandler(engine, authenticator.authenticate, origin_allowed)),
        Route(
            "/v1/queues/{queue}/events",
            SseHandler(engine, authenticator.authenticate, error_response),
            methods=["GET"],
        ),
    ]


def create_app(settings: Settings, *, backend: Backend | None = None) -> Starlette:
    """Build the gateway. ``backend`` overrides the one ``settings`` names (tests, embedding)."""
    services = GatewayServices.build(settings, backend)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await services.start()
        try:
            yield
        finally:
            # uvicorn gets here after it stopped accepting and in-flight requests finished.
            await services.close()

    # The router tries routes in order, so the hot message routes go first.
    routes: list[BaseRoute] = [
        *MessageRoutes(services).routes(),
        *QueueRoutes(services).routes(),
        *TokenRoutes(services).routes(),
        *push_routes(services),
        *OpsRoutes(services).routes(),
    ]
    app = GatewayApp(routes=routes, lifespan=lifespan)
    app.metrics = services.metrics
    app.state.services = services
    return app


class GatewayApp(Starlette):
    """Starlette with a shorter middleware stack: :class:`GatewayMiddleware` around the router.

    Starlette's default stack adds ServerErrorMiddleware and ExceptionMiddleware, each with
    its own ``send`` wrapper; GatewayMiddleware already does both jobs (a bare 500 for the
    unexpected, problem documents for the router's 404 and 405), and endpoints map their
    own errors (:class:`~gateway.routes.endpoint.Endpoint`). One layer instead of three on
    every request.
    """

    metrics: GatewayMetrics

    def build_middleware_stack(self) -> ASGIApp:
        return GatewayMiddleware(self.router, self.metrics)


def _error_response(exc: Exception) -> Response | None:
    """The problem document for an error with a meaning; None for the unexpected."""
    if isinstance(exc, GatewayError | StoreError):
        return problem_response(exc)
    if isinstance(exc, HTTPException):
        # Starlette's router raises these for unknown paths (404) and wrong methods (405).
        if exc.status_code == 405:
            return problem_response(
                MethodNotAllowed("method not allowed on this resource", dict(exc.headers or {}))
            )
        if exc.status_code == 404:
            return problem_response(NotFound("no such resource"))
    return None


class GatewayMiddleware:
    """Counts and times every HTTP request; errors become problem documents, the unexpected a bare 500.

    One plain ASGI class (not BaseHTTPMiddleware) to keep the per-request cost small.
    """

    def __init__(self, app: ASGIApp, metrics: GatewayMetrics) -> None:
        self.app = app
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
                raise  # Too late for a problem document; uvicorn logs it and drops the connection.
            response = _error_response(exc)
            if response is None:
                log.exception("unexpected error answering %s %s", scope["method"], scope["path"])
                response = Response(_INTERNAL_ERROR, status_code=500, media_type="application/problem+json")
            await response(scope, receive, send_wrapper)
        finally:
            # Labels stay bounded: a route template, never a raw path; odd methods pooled.
            route = getattr(scope.get("route"), "path", "unmatched")
            method = scope["method"] if scope["method"] in _METHODS else "other"
            self.metrics.observe(route, method, status, time.perf_counter() - start)
