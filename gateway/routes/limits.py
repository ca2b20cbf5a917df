"""``GET/PUT /v1/limits``: the caller's tenant's rate limits and quotas (docs/throttling.md).

Any valid token reads its tenant's limits (a client may want to pace itself); changing
them needs ``admin``. A PUT merges (see :mod:`gateway.limits.document`) and answers the
whole document as stored; every gateway applies it within a second (through Redis), or
within ``limits_cache_ttl_s`` without it.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from ..body import JSONResponse, read_object
from ..services import GatewayServices
from ..usage.audit import AuditAction, audit_request
from .access import authenticate, require
from .endpoint import route


class LimitsRoutes:
    def __init__(self, services: GatewayServices) -> None:
        self.services = services

    def routes(self) -> list[BaseRoute]:
        return [
            route("/v1/limits", self.get_limits, "GET", self.services.metrics),
            route("/v1/limits", self.put_limits, "PUT", self.services.metrics),
        ]

    async def get_limits(self, request: Request) -> Response:
        principal = await authenticate(self.services, request)
        limits = await self.services.throttling.limits.get(principal.tenant)
        return JSONResponse(limits.to_dict())

    async def put_limits(self, request: Request) -> Response:
        principal = await authenticate(self.services, request)
        require(principal, "admin")
        changes = await read_object(request)
        limits = await self.services.throttling.limits.update(principal.tenant, changes)
        audit = self.services.usage.audit
        await audit_request(
            audit, principal, AuditAction.LIMITS_CHANGED, principal.tenant, {"changes": changes}
        )
        return JSONResponse(limits.to_dict())
