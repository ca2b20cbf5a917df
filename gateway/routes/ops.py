"""Operations and self-description: health, readiness, the OpenAPI document.

``/docs`` (Swagger UI), ``/asyncapi.json`` and the JS client are in :mod:`.browser`.

None of these need a token: probes run without one, and the API description is public.
``/metrics`` (it names tenants and queues) needs a token: see ``gateway/operations.py``.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from backend_store.errors import Unavailable

from ..body import JSONResponse
from ..openapi import openapi_bytes
from ..services import GatewayServices
from .endpoint import route


class OpsRoutes:
    def __init__(self, services: GatewayServices) -> None:
        self.services = services
        # Built once: the document depends only on the code.
        self._openapi = openapi_bytes()

    def routes(self) -> list[BaseRoute]:
        return [
            route("/healthz", self.healthz, "GET", self.services.metrics),
            route("/readyz", self.readyz, "GET", self.services.metrics),
            route("/openapi.json", self.openapi, "GET", self.services.metrics),
        ]

    async def healthz(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(self, request: Request) -> Response:
        # Raises Unavailable (503 problem) when the store cannot take writes.
        await self.services.backend.check_writable()
        throttling = self.services.throttling
        if throttling.fail_closed_and_down:
            raise Unavailable("the shared state (Redis) is unreachable and --redis-fail is closed")
        # Redis down with fail-open is still ready (it serves), but says so.
        return JSONResponse({"status": "ready", "shared_state": throttling.ready_detail()})

    async def openapi(self, request: Request) -> Response:
        return Response(self._openapi, media_type="application/json")
