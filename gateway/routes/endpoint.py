"""The adapter between a ``handler(request) -> Response`` and Starlette's router.

Starlette wraps plain handler functions in two layers (``request_response`` and an
exception-handler lookup with its own ``send`` wrapper) on every request. This class
does the same job in one: build the request, call the handler, turn an error with a
code into its problem document (:func:`gateway.errors.problem_response`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from backend_store.errors import StoreError

from ..errors import GatewayError, problem_response

Handler = Callable[[Request], Awaitable[Response]]


class Endpoint:
    """An ASGI app (not a function, so Starlette's ``Route`` does not wrap it again)."""

    __slots__ = ("handler",)

    def __init__(self, handler: Handler) -> None:
        self.handler = handler

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive, send)
        try:
            response = await self.handler(request)
        except (GatewayError, StoreError) as exc:
            response = problem_response(exc)
        await response(scope, receive, send)


def route(path: str, handler: Handler, method: str) -> Route:
    return Route(path, Endpoint(handler), methods=[method])
