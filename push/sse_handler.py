"""The ``/v1/queues/{queue}/events`` endpoint: one queue's messages as Server-Sent Events.

sse-starlette's ``EventSourceResponse`` gives the headers, HEAD handling, the send loop
and disconnect detection. Its per-event path (an anyio cancel scope, a log call and a
lock per send, four tasks per stream) made it ~5x slower than a plain streaming
response and ~40 KiB per idle stream, so :class:`PushEventStream` keeps only the send
loop and the disconnect listener: the transport yields everything buffered as one
chunk per wake-up (the per-chunk cost is paid once for many events) and pings itself
when idle, so a stream costs one extra task, not four.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from sse_starlette.sse import EventSourceResponse
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from backend_store.attributes import check_queue_name
from backend_store.errors import Forbidden, InvalidRequest, PushgateError, Unauthorized
from backend_store.limits import MAX_VISIBILITY_S
from backend_store.types import QueueName

from .close_codes import CloseCode
from .engine import Connection, PushEngine
from .principal import Authenticate, RateCheck, authenticate_once
from .sse_protocol import SseEncoder, new_stream_id, parse_last_event_id
from .transport import SseTransport
from .ws_handler import bearer_token

# The gateway's problem document for an error (push has no status table of its own).
ErrorResponse = Callable[[PushgateError], Response]

# Headers that keep proxies (nginx, CDNs) from buffering or caching the stream.
STREAM_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class PushEventStream(EventSourceResponse):
    """An ``EventSourceResponse`` that runs only its send loop and disconnect listener."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["method"].upper() == "HEAD":
            await super().__call__(scope, receive, send)
            return
        listener = asyncio.get_running_loop().create_task(self._listen_for_disconnect(receive))
        try:
            await self._stream_response(send)
        finally:
            listener.cancel()
            await asyncio.wait([listener])
        if self.background is not None:
            await self.background()


def _param(request: Request, name: str, default: str) -> str:
    return request.query_params.get(name, default)


def _int_param(request: Request, name: str, low: int, high: int, default: int) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise InvalidRequest(f"{name} must be an integer") from None
    if not low <= value <= high:
        raise InvalidRequest(f"{name} must be between {low} and {high}")
    return value


def _float_param(request: Request, name: str) -> float | None:
    raw = request.query_params.get(name)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise InvalidRequest(f"{name} must be a number") from None
    if not 0 <= value <= MAX_VISIBILITY_S:
        raise InvalidRequest(f"{name} must be between 0 and {MAX_VISIBILITY_S}")
    return value


class SseHandler:
    """ASGI app for ``GET /v1/queues/{queue}/events`` (mount with Starlette's ``Route``)."""

    def __init__(
        self,
        engine: PushEngine,
        authenticate: Authenticate,
        error_response: ErrorResponse,
        rate_check: RateCheck | None = None,
    ) -> None:
        self.engine = engine
        self.authenticate = authenticate
        self.error_response = error_response
        self.rate_check = rate_check

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        conn: Connection | None = None
        try:
            response, conn = await self._open(request)
        except PushgateError as exc:
            response = self.error_response(exc)
        try:
            await response(scope, receive, send)
        finally:
            # The body's own cleanup covers a stream that ran; this one a response that
            # failed before its body started (the client was gone at once).
            if conn is not None:
                self.engine.close_connection(conn)

    async def _open(self, request: Request) -> tuple[Response, Connection | None]:
        engine, settings = self.engine, self.engine.settings
        token = bearer_token(request.scope)
        if token is None:
            raise Unauthorized("missing bearer token")
        principal = await authenticate_once(request.scope, token, self.authenticate)
        queue = QueueName(request.path_params["queue"])
        check_queue_name(queue)
        prefetch = _int_param(request, "prefetch", 1, settings.max_prefetch, settings.default_prefetch)
        ack = _param(request, "ack", "manual")
        if ack not in ("manual", "auto"):
            raise InvalidRequest("ack must be manual or auto")
        visibility = _float_param(request, "visibility_timeout_s")
        if not principal.can("receive", queue):
            raise Forbidden(f"the token cannot receive from {queue}")
        if request.method == "HEAD":
            # Headers as for GET, and no stream: nothing to subscribe.
            await engine.queue_info(principal.tenant, queue)
            return Response(media_type="text/event-stream", headers=STREAM_HEADERS), None

        if self.rate_check is not None:
            # A stream is a connection and a receive (refused: 429 before the stream starts).
            if (pending := self.rate_check(principal, "connect", None)) is not None:
                await pending
            if (pending := self.rate_check(principal, "receive", queue)) is not None:
                await pending
        stream_id = new_stream_id()
        encoder = SseEncoder(stream_id)
        transport = SseTransport(settings.send_buffer_bytes, settings.ping_interval_s)
        conn = engine.open_connection(principal, transport, stream_id)
        try:
            sub = await engine.subscribe(
                conn,
                queue,
                encoder.frames,
                prefetch=prefetch,
                auto_ack=ack == "auto",
                visibility_timeout_s=visibility,
                start=False,
            )
        except PushgateError:
            engine.close_connection(conn)
            raise
        last = parse_last_event_id(
            request.headers.get("last-event-id") or request.query_params.get("last_event_id")
        )
        if last is not None:
            engine.resume(sub, *last)
        engine.start_subscription(sub)

        async def client_gone(message: Message) -> None:
            # The client may come back with Last-Event-ID: hold what it may have read.
            engine.suspend(conn)
            transport.close(CloseCode.NORMAL, "client disconnected")

        async def body() -> Any:
            try:
                async for chunk in transport.body(encoder.opening(settings.sse_retry_ms)):
                    yield chunk
            finally:
                engine.close_connection(conn)

        stream = PushEventStream(
            body(), headers=STREAM_HEADERS, ping=0, client_close_handler_callable=client_gone
        )
        return stream, conn


__all__ = ["PushEventStream", "SseHandler"]
