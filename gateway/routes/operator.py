"""Operator requests: alert rules and alerts, dead-letter peek and redrive.

=============================================  ======================================
request                                        needs
=============================================  ======================================
``GET /v1/queues/{queue}/peek?max=10``         ``admin`` or ``receive:`` on the queue
``POST /v1/queues/{queue}/redrive``            ``admin``
``GET /v1/alerts``                             ``admin``: the tenant's firing alerts and history
``GET/POST /v1/alerts/rules``                  ``admin``; system kinds: operator tenant only
``DELETE /v1/alerts/rules/{rule_id}``          ``admin``
=============================================  ======================================
"""

from __future__ import annotations

import base64
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from backend_store.backend import Backend, DeadLetters
from backend_store.errors import InvalidRequest, NotFound
from backend_store.types import PeekedMessage, QueueName
from web_console.alerts import AlertEngine, parse_rule

from ..body import JSONResponse, check_fields, read_object
from ..services import GatewayServices
from .access import authenticate, queue_access, require
from .endpoint import int_query, route

MAX_PEEK = 100
MAX_REDRIVE = 10_000


def peeked_to_json(message: PeekedMessage) -> dict[str, Any]:
    """A receive's message object without ``receipt``, plus ``state`` (visible, delayed, in_flight)."""
    out: dict[str, Any] = {"id": message.id, "seq": message.seq}
    if message.is_text:
        out["body"] = message.body.decode()
    else:
        out["body_base64"] = base64.b64encode(message.body).decode()
    out["attributes"] = message.attributes
    out["group_id"] = message.group_id
    out["sent_at"] = message.sent_at
    out["receive_count"] = message.receive_count
    out["state"] = message.state
    return out


class OperatorRoutes:
    def __init__(self, services: GatewayServices, store: Backend, alerts: AlertEngine) -> None:
        self.services = services
        self.store = store
        self.alerts = alerts

    def routes(self) -> list[BaseRoute]:
        m = self.services.metrics
        return [
            route("/v1/queues/{queue}/peek", self.peek, "GET", m),
            route("/v1/queues/{queue}/redrive", self.redrive, "POST", m),
            route("/v1/alerts", self.list_alerts, "GET", m),
            route("/v1/alerts/rules", self.list_rules, "GET", m),
            route("/v1/alerts/rules", self.add_rule, "POST", m),
            route("/v1/alerts/rules/{rule_id}", self.delete_rule, "DELETE", m),
        ]

    def _dead_letters(self) -> DeadLetters:
        if not isinstance(self.store, DeadLetters):
            raise NotFound("this store does not support peek and redrive")
        return self.store

    async def peek(self, request: Request) -> Response:
        principal, queue = await queue_access(self.services, request, "receive")
        limit = int_query(request, "max", 10, MAX_PEEK)
        messages = await self._dead_letters().peek(principal.tenant, queue, limit)
        return JSONResponse({"messages": [peeked_to_json(m) for m in messages]})

    async def redrive(self, request: Request) -> Response:
        principal, queue = await queue_access(self.services, request, "admin")
        body = await read_object(request)
        check_fields(body, frozenset({"to", "max"}))
        to = body.get("to")
        if not isinstance(to, str):
            raise InvalidRequest("to must name the queue to move the messages to")
        limit = body.get("max", 1000)
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_REDRIVE:
            raise InvalidRequest(f"max must be an integer in 1..{MAX_REDRIVE}")
        moved = await self._dead_letters().redrive(principal.tenant, queue, QueueName(to), limit)
        return JSONResponse({"moved": moved})

    async def list_alerts(self, request: Request) -> Response:
        principal = await authenticate(self.services, request)
        require(principal, "admin")
        return JSONResponse(
            {
                "active": [a.to_dict() for a in self.alerts.active(principal.tenant)],
                "history": [e.to_dict() for e in self.alerts.recent(principal.tenant)],
            }
        )

    async def list_rules(self, request: Request) -> Response:
        principal = await authenticate(self.services, request)
        require(principal, "admin")
        rules = await self.alerts.list_rules(principal.tenant)
        return JSONResponse({"rules": [r.to_dict() for r in rules]})

    async def add_rule(self, request: Request) -> Response:
        principal = await authenticate(self.services, request)
        require(principal, "admin")
        body = await read_object(request)
        operator = principal.tenant == self.services.settings.operator_tenant
        rule = parse_rule(principal.tenant, body, allow_system=operator)
        await self.alerts.add_rule(rule)
        return JSONResponse(rule.to_dict(), status_code=201)

    async def delete_rule(self, request: Request) -> Response:
        principal = await authenticate(self.services, request)
        require(principal, "admin")
        await self.alerts.delete_rule(principal.tenant, request.path_params["rule_id"])
        return Response(status_code=204)
