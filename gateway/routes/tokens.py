"""``POST /v1/tokens``: trade an API key for a short-lived JWT no wider than the key."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from backend_store.errors import InvalidRequest

from ..body import JSONResponse, check_fields, read_object
from ..services import GatewayServices
from .access import authenticate
from .endpoint import route

_FIELDS = frozenset({"scope", "ttl_s"})


class TokenRoutes:
    def __init__(self, services: GatewayServices) -> None:
        self.services = services

    def routes(self) -> list[BaseRoute]:
        return [route("/v1/tokens", self.mint, "POST", self.services.metrics)]

    async def mint(self, request: Request) -> Response:
        principal = await authenticate(self.services, request)
        doc = await read_object(request, required=False)
        check_fields(doc, _FIELDS)
        scope = doc.get("scope")
        if scope is not None and not isinstance(scope, str):
            raise InvalidRequest("scope must be a string of space-separated scopes")
        # The authenticator checks ttl_s (1..86400, default 900) and that the scope is within the key's.
        token, expires_at = await self.services.authenticator.mint_token(principal, scope, doc.get("ttl_s"))
        return JSONResponse({"token": token, "expires_at": expires_at}, status_code=201)
