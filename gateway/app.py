"""The app factory: :func:`create_app` wires services, routes, errors and metrics.

Push transports (WebSocket ``/v1/ws``, SSE ``/v1/queues/{queue}/events``) plug in at
:func:`push_routes`: it gets the same :class:`GatewayServices` as every other route.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.routing import BaseRoute, Route, WebSocketRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from backend_store.backend import Backend
from backend_store.errors import PushgateError
from push import PrincipalLike, SseHandler, WebSocketHandler

from .cors import CorsMiddleware
from .errors import problem_response
from .metrics import GatewayMetrics
from .middleware import GatewayMiddleware, GuardedApp
from .operations import build_operations
from .routes.browser import BrowserRoutes
from .routes.cluster import ClusterRoutes
from .routes.endpoint import Endpoint
from .routes.limits import LimitsRoutes
from .routes.messages import MessageRoutes
from .routes.ops import OpsRoutes
from .routes.queues import QueueRoutes
from .routes.tokens import TokenRoutes
from .services import GatewayServices
from .settings import Settings
from .sqs.route import SqsRoute
from .usage.http import observed_rate_check


def push_routes(services: GatewayServices) -> list[BaseRoute]:
    """Routes of the push delivery engine (WebSocket and SSE); see docs/push.md."""
    engine, authenticator = services.engine, services.authenticator
    rule = services.origin_rule

    async def origin_allowed(principal: PrincipalLike, origin: str, host: str | None) -> bool:
        return await rule.allows(principal.tenant, origin, host)

    rate_check, observer = services.throttling.rate_check, services.observer
    ws_check = observed_rate_check(rate_check, observer, "ws")  # refusals are usage ("throttled")
    sse_check = observed_rate_check(rate_check, observer, "sse")
    return [
        WebSocketRoute(
            "/v1/ws", WebSocketHandler(engine, authenticator.authenticate, origin_allowed, ws_check)
        ),
        Route(
            "/v1/queues/{queue}/events",
            SseHandler(engine, authenticator.authenticate, problem_response, sse_check),
            methods=["GET"],
        ),
    ]


def create_app(settings: Settings, *, backend: Backend | None = None) -> Starlette:
    """Build the gateway. ``backend`` overrides the one ``settings`` names (tests, embedding)."""
    services = GatewayServices.build(settings, backend)
    engine = services.engine
    # The monitor, alerts, console and metrics sources (docs/console.md, docs/metrics.md).
    operations, operator_routes = build_operations(
        services, services.backend, engine.stats, engine.subscriptions
    )

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            await services.start()
        except PushgateError as exc:
            # A store it cannot open, a missing key: said in one line (GatewayApp), not a traceback.
            if isinstance(app, GatewayApp):
                app.start_error = exc
            raise
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
        *LimitsRoutes(services).routes(),
        *_guarded(push_routes(services), services.metrics),
        *OpsRoutes(services).routes(),
        *operator_routes,
        *ClusterRoutes(services).routes(),
        *BrowserRoutes(services).routes(),
        # The SQS API (AWS JSON 1.0) on POST /: SigV4-signed requests only (docs/sqs.md).
        *SqsRoute(services).routes(),
    ]
    app = GatewayApp(routes=routes, lifespan=lifespan)
    app.metrics = services.metrics
    app.services = services
    app.state.services = services
    app.state.operations = operations
    return app


class GatewayApp(Starlette):
    """Starlette with a shorter middleware stack: :class:`GatewayMiddleware` around the router.

    Starlette's default stack adds ServerErrorMiddleware and ExceptionMiddleware, each with
    its own ``send`` wrapper. Here endpoints map their own errors and record their metrics
    (:class:`~gateway.routes.endpoint.Endpoint`), raw ASGI routes are wrapped in
    :class:`~gateway.middleware.GuardedApp`, and GatewayMiddleware answers the router's
    404 and 405: one thin layer instead of three on every request.
    """

    metrics: GatewayMetrics
    services: GatewayServices
    # Why the services did not start, when they said (uvicorn then logs this, not a traceback).
    start_error: PushgateError | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            send = self._reporting_start_errors(send)
        await super().__call__(scope, receive, send)

    def _reporting_start_errors(self, send: Send) -> Send:
        async def reporting(message: Message) -> None:
            if message["type"] == "lifespan.startup.failed" and self.start_error is not None:
                message = {**message, "message": f"cannot start: {self.start_error.detail}"}
            await send(message)

        return reporting

    def build_middleware_stack(self) -> ASGIApp:
        # CORS outermost, so that the router's 404 and 405 get CORS headers too.
        edge = GatewayMiddleware(self.router, self.metrics)
        return CorsMiddleware(edge, self.services.authenticator, self.services.origin_rule)


def _guarded(routes: list[BaseRoute], metrics: GatewayMetrics) -> list[BaseRoute]:
    """Give raw ASGI HTTP routes (not ours) the gateway's 500 and metrics."""
    for r in routes:
        if isinstance(r, Route) and not isinstance(r.app, Endpoint):
            r.app = GuardedApp(r.app, r.path, metrics)
    return routes
