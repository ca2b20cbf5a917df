"""``GET /v1/cluster`` (``admin``): the cluster's nodes and partitions, for operators.

Cluster mode only (a store with the ``ClusterStatus`` capability); the embedded store
answers ``404 not_found``. The operator tenant's admins see every partition; another
tenant's admins see the nodes and only their own tenant's partitions (queue names are
the tenant's business).
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from backend_store.backend import ClusterStatus
from backend_store.errors import NotFound

from ..body import JSONResponse
from ..services import GatewayServices
from .access import authenticate, require
from .endpoint import route


class ClusterRoutes:
    def __init__(self, services: GatewayServices) -> None:
        self.services = services

    def routes(self) -> list[BaseRoute]:
        return [route("/v1/cluster", self.cluster, "GET", self.services.metrics)]

    async def cluster(self, request: Request) -> Response:
        principal = await authenticate(self.services, request)
        require(principal, "admin")
        store = self.services.backend
        if not isinstance(store, ClusterStatus):
            raise NotFound("not in cluster mode: this gateway runs on the embedded store")
        doc: dict[str, Any] = dict(await store.cluster_status())
        if principal.tenant != self.services.settings.operator_tenant:
            doc["partitions"] = [p for p in doc["partitions"] if p.get("tenant") == principal.tenant]
        return JSONResponse(doc)
