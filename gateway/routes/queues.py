"""Queue requests: create, list, read, change, delete, purge."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from backend_store.errors import InvalidRequest
from backend_store.types import QueueInfo

from ..body import JSONResponse, read_object
from ..services import GatewayServices
from ..usage.audit import AuditAction, audit_request
from .access import authenticate, can_see, queue_access
from .endpoint import int_query, route
from .queue_changes import QueueChanges

# ``GET /v1/queues``: queues per page (the default and the most), and the longest cursor
# (a queue name: 80 characters; room for a future format).
MAX_LIST_PAGE = 1000
MAX_CURSOR = 256


def queue_to_json(services: GatewayServices, info: QueueInfo) -> dict[str, Any]:
    """docs/api.md's queue object; ``stats.consumers`` comes from the push engine."""
    stats = info.stats.to_dict()
    stats["consumers"] = services.consumers(info.tenant, info.name)
    return {
        "name": info.name,
        "created_at": info.created_at,
        "attributes": info.attributes.to_dict(),
        "stats": stats,
    }


class QueueRoutes:
    def __init__(self, services: GatewayServices) -> None:
        self.services = services
        self.changes = QueueChanges(services)

    def routes(self) -> list[BaseRoute]:
        return [
            route("/v1/queues", self.list_queues, "GET", self.services.metrics),
            route("/v1/queues/{queue}", self.put_queue, "PUT", self.services.metrics),
            route("/v1/queues/{queue}", self.get_queue, "GET", self.services.metrics),
            route("/v1/queues/{queue}", self.patch_queue, "PATCH", self.services.metrics),
            route("/v1/queues/{queue}", self.delete_queue, "DELETE", self.services.metrics),
            route("/v1/queues/{queue}/purge", self.purge_queue, "POST", self.services.metrics),
        ]

    async def list_queues(self, request: Request) -> Response:
        """A page of the tenant's queues by name (docs/api.md): up to ``limit`` past
        ``cursor``; ``next_cursor`` only when more follow. The page is read before the
        token's scopes filter it, so a page may hold fewer than ``limit`` queues."""
        principal = await authenticate(self.services, request)
        limit = int_query(request, "limit", MAX_LIST_PAGE, MAX_LIST_PAGE)
        cursor = request.query_params.get("cursor", "")
        if len(cursor) > MAX_CURSOR:
            raise InvalidRequest(f"cursor must be at most {MAX_CURSOR} characters")
        # One more than the page: whether another page follows, without a second read.
        infos = await self.services.backend.list_queues(principal.tenant, after=cursor, limit=limit + 1)
        page = infos[:limit]
        out: dict[str, Any] = {
            "queues": [queue_to_json(self.services, i) for i in page if can_see(principal, i.name)]
        }
        if len(infos) > limit:
            out["next_cursor"] = page[-1].name
        return JSONResponse(out)

    async def put_queue(self, request: Request) -> Response:
        principal, queue = await queue_access(self.services, request, None)
        attributes = await read_object(request, required=False)
        info, created = await self.changes.create(principal, queue, attributes)
        return JSONResponse(queue_to_json(self.services, info), status_code=201 if created else 200)

    async def get_queue(self, request: Request) -> Response:
        principal, queue = await queue_access(self.services, request, None)
        info = await self.services.backend.get_queue(principal.tenant, queue)
        self.services.queues.put(info)
        return JSONResponse(queue_to_json(self.services, info))

    async def patch_queue(self, request: Request) -> Response:
        principal, queue = await queue_access(self.services, request, None)
        changes = await read_object(request)
        info = await self.changes.update(principal, queue, changes)
        return JSONResponse(queue_to_json(self.services, info))

    async def delete_queue(self, request: Request) -> Response:
        principal, queue = await queue_access(self.services, request, "manage")
        self.services.queues.invalidate(principal.tenant, queue)
        await self.services.backend.delete_queue(principal.tenant, queue)
        self.services.queues.invalidate(principal.tenant, queue)
        await audit_request(self.services.usage.audit, principal, AuditAction.QUEUE_DELETED, queue)
        return Response(status_code=204)

    async def purge_queue(self, request: Request) -> Response:
        principal, queue = await queue_access(self.services, request, "manage")
        purged = await self.services.backend.purge_queue(principal.tenant, queue)
        await audit_request(
            self.services.usage.audit,
            principal,
            AuditAction.QUEUE_PURGED,
            queue,
            {"purged": purged},
        )
        return JSONResponse({"purged": purged})
