"""The adapter between a ``handler(request) -> Response`` and Starlette's router.

Starlette wraps plain handler functions in two layers (``request_response`` and an
exception-handler lookup with its own ``send`` wrapper) on every request, and a metrics
middleware would add a third. :class:`Endpoint` does all of it in one: build the
request, call the handler, turn an error into its problem document
(:func:`gateway.middleware.error_response`), record the request's metrics.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from backend_store.errors import InvalidRequest
from push.observer import Observer

from ..metrics import GatewayMetrics
from ..middleware import error_response, method_label
from ..usage.http import record_failure

Handler = Callable[[Request], Awaitable[Response]]


class Endpoint:
    """An ASGI app (not a function, so Starlette's ``Route`` does not wrap it again)."""

    __slots__ = ("handler", "metrics", "path", "usage")

    def __init__(
        self, handler: Handler, path: str, metrics: GatewayMetrics, usage: tuple[Observer, str] | None = None
    ) -> None:
        self.handler = handler
        self.path = path
        self.metrics = metrics
        # (observer, operation): failures of this route are usage records of that operation.
        self.usage = usage

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        start = time.perf_counter()
        try:
            response = await self.handler(Request(scope, receive, send))
        except ClientDisconnect:
            return  # nobody to answer
        except Exception as exc:
            response = error_response(exc, scope)
            if self.usage is not None:
                record_failure(self.usage[0], scope, self.usage[1], exc)
        await response(scope, receive, send)
        self.metrics.observe(
            self.path, method_label(scope), response.status_code, time.perf_counter() - start
        )


def route(
    path: str,
    handler: Handler,
    method: str,
    metrics: GatewayMetrics,
    usage: tuple[Observer, str] | None = None,
) -> Route:
    return Route(path, Endpoint(handler, path, metrics, usage), methods=[method])


def int_query(request: Request, name: str, default: int, high: int) -> int:
    """An integer query parameter in 1..``high`` (``invalid_request`` otherwise)."""
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise InvalidRequest(f"{name} must be an integer") from None
    if not 1 <= value <= high:
        raise InvalidRequest(f"{name} must be in 1..{high}")
    return value
