"""Message requests: send (one or a batch), receive with long-poll, ack, nack, visibility."""

from __future__ import annotations

import time
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from backend_store.attributes import check_number
from backend_store.errors import InvalidRequest, PushgateError, error_from_code
from backend_store.limits import (
    MAX_BATCH,
    MAX_ID_CHARS,
    MAX_RECEIPT_CHARS,
    MAX_RECEIPTS,
    MAX_VISIBILITY_S,
    MAX_WAIT_S,
)
from backend_store.types import AckResult, SendResult
from push.messages import message_to_json, parse_send_body
from push.observed import record_settled
from push.observer import ACK, HTTP, NACK, OK, RECEIVE

from ..body import JSONResponse, check_fields, read_json, read_object
from ..errors import problem_for, problem_response
from ..limits.headers import with_fields
from ..services import GatewayServices
from .access import queue_access
from .endpoint import route

_RECEIVE_FIELDS = frozenset({"max", "wait_s", "visibility_timeout_s"})
_ACK_FIELDS = frozenset({"receipts"})
_NACK_FIELDS = frozenset({"receipts", "delay_s"})
_VISIBILITY_FIELDS = frozenset({"receipt", "timeout_s"})


def _result_json(result: SendResult) -> dict[str, Any]:
    return {"id": result.id, "seq": result.seq, "duplicate": result.duplicate}


def _ack_json(result: AckResult, counted: str) -> dict[str, Any]:
    return {counted: result.acked, "failed": [{"receipt": f.receipt, "code": f.code} for f in result.failed]}


def _receipts(doc: dict[str, Any]) -> list[str]:
    receipts = doc.get("receipts")
    if not isinstance(receipts, list) or not 1 <= len(receipts) <= MAX_RECEIPTS:
        raise InvalidRequest(f"receipts must be a list of 1-{MAX_RECEIPTS} receipts")
    for receipt in receipts:
        _check_receipt(receipt)
    return receipts


def _check_receipt(receipt: Any) -> str:
    if not isinstance(receipt, str) or not 1 <= len(receipt) <= MAX_RECEIPT_CHARS:
        raise InvalidRequest(f"a receipt is a string of 1-{MAX_RECEIPT_CHARS} characters")
    return receipt


async def _wait_for_disconnect(request: Request) -> None:
    # The body has been read, so the next ASGI message is http.disconnect.
    while (await request.receive())["type"] != "http.disconnect":
        pass


class MessageRoutes:
    def __init__(self, services: GatewayServices) -> None:
        self.services = services

    def routes(self) -> list[BaseRoute]:
        metrics, observer = self.services.metrics, self.services.observer
        return [
            route("/v1/queues/{queue}/messages", self.send, "POST", metrics, (observer, "send")),
            route("/v1/queues/{queue}/receive", self.receive, "POST", metrics, (observer, "receive")),
            route("/v1/queues/{queue}/ack", self.ack, "POST", metrics, (observer, "ack")),
            route(
                "/v1/queues/{queue}/messages/{receipt}",
                self.delete_message,
                "DELETE",
                metrics,
                (observer, "ack"),
            ),
            route("/v1/queues/{queue}/nack", self.nack, "POST", metrics, (observer, "nack")),
            route("/v1/queues/{queue}/visibility", self.visibility, "POST", metrics),
        ]

    # Send -----------------------------------------------------------------

    async def send(self, request: Request) -> Response:
        started = time.perf_counter()
        principal, queue = await queue_access(self.services, request, "send")
        limit_headers = await self.services.throttling.enforcer.check(
            principal.tenant, principal.subject, "send", queue
        )
        idempotency_key = request.headers.get("idempotency-key")
        if idempotency_key is not None and not 1 <= len(idempotency_key) <= MAX_ID_CHARS:
            raise InvalidRequest(f"Idempotency-Key must be 1-{MAX_ID_CHARS} characters")
        doc = await read_json(request, self.services.settings.max_request_bytes)
        entries, is_batch = parse_send_body(doc, idempotency_key)
        try:
            # The one send path: quota, dedupe front, batching with other sends, usage.
            outcomes = await self.services.sends.send(principal.tenant, queue, entries, HTTP, started)
        except PushgateError as exc:
            return problem_response(exc)  # recorded by the send path: not raised to the endpoint
        if not is_batch:
            result = outcomes[0]
            if isinstance(result, PushgateError):
                return problem_response(result)  # recorded with the outcomes
            return with_fields(
                JSONResponse(_result_json(result), status_code=200 if result.duplicate else 201),
                limit_headers,
            )
        out: list[dict[str, Any]] = []
        for outcome in outcomes:
            out.append(
                {"error": problem_for(outcome)}
                if isinstance(outcome, PushgateError)
                else _result_json(outcome)
            )
        return with_fields(JSONResponse({"results": out}), limit_headers)

    # Receive --------------------------------------------------------------

    async def receive(self, request: Request) -> Response:
        principal, queue = await queue_access(self.services, request, "receive")
        limit_headers = await self.services.throttling.enforcer.check(
            principal.tenant, principal.subject, "receive", queue
        )
        doc = await read_object(request, required=False)
        check_fields(doc, _RECEIVE_FIELDS)
        max_messages = int(check_number("max", doc.get("max", 1), 1, MAX_BATCH, integer=True))
        visibility: float | None = None
        if "visibility_timeout_s" in doc:
            visibility = check_number(
                "visibility_timeout_s", doc["visibility_timeout_s"], 0, MAX_VISIBILITY_S
            )
        if "wait_s" in doc:
            wait_s = check_number("wait_s", doc["wait_s"], 0, MAX_WAIT_S)
        else:
            wait_s = (await self.services.queues.get(principal.tenant, queue)).attributes.receive_wait_s
        messages = await self.services.engine.receive(
            principal, queue, max_messages, visibility, wait_s, lambda: _wait_for_disconnect(request)
        )
        if messages:
            nbytes = sum(len(m.body) for m in messages)
            self.services.observer.observe(principal.tenant, queue, RECEIVE, HTTP, OK, len(messages), nbytes)
        return with_fields(JSONResponse({"messages": [message_to_json(m) for m in messages]}), limit_headers)

    # Ack, nack, visibility ------------------------------------------------

    async def ack(self, request: Request) -> Response:
        principal, queue = await queue_access(self.services, request, "receive")
        doc = await read_object(request)
        check_fields(doc, _ACK_FIELDS)
        receipts = _receipts(doc)
        result = await self.services.engine.ack_now(principal.tenant, receipts, queue)
        self._record_settled(ACK, principal.tenant, queue, receipts, result)
        return JSONResponse(_ack_json(result, "acked"))

    async def delete_message(self, request: Request) -> Response:
        principal, queue = await queue_access(self.services, request, "receive")
        receipt = _check_receipt(request.path_params["receipt"])
        result = await self.services.engine.ack_now(principal.tenant, [receipt], queue)
        if not result.failed:  # a failure is raised, and recorded by the endpoint
            self._record_settled(ACK, principal.tenant, queue, [receipt], result)
        if result.failed:
            raise error_from_code(result.failed[0].code, "the receipt is not valid (expired or already used)")
        return Response(status_code=204)

    async def nack(self, request: Request) -> Response:
        principal, queue = await queue_access(self.services, request, "receive")
        doc = await read_object(request)
        check_fields(doc, _NACK_FIELDS)
        receipts = _receipts(doc)
        delay = check_number("delay_s", doc.get("delay_s", 0), 0, MAX_VISIBILITY_S)
        result = await self.services.engine.nack_now(principal.tenant, receipts, delay, queue)
        self._record_settled(NACK, principal.tenant, queue, receipts, result)
        return JSONResponse(_ack_json(result, "nacked"))

    def _record_settled(
        self, operation: str, tenant: str, queue: str, receipts: list[str], result: AckResult
    ) -> None:
        queue_of = dict.fromkeys(receipts, queue)
        record_settled(self.services.observer, tenant, operation, HTTP, receipts, queue_of, result)

    async def visibility(self, request: Request) -> Response:
        principal, queue = await queue_access(self.services, request, "receive")
        doc = await read_object(request)
        check_fields(doc, _VISIBILITY_FIELDS)
        receipt = _check_receipt(doc.get("receipt"))
        if "timeout_s" not in doc:
            raise InvalidRequest("timeout_s is required")
        timeout = check_number("timeout_s", doc["timeout_s"], 0, MAX_VISIBILITY_S)
        await self.services.engine.change_visibility(principal.tenant, queue, receipt, timeout)
        return JSONResponse({"receipt": receipt, "visible_at": time.time() + timeout})
