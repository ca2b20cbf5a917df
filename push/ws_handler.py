"""The ``/v1/ws`` endpoint: a plain ASGI app gluing uvicorn's WebSocket to the engine.

One coroutine reads and dispatches frames (this handler); the transport's writer task
drains replies and deliveries. The handler accepts first and then closes with a code,
so that browsers see 4001/4003 instead of a bare failed handshake.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs

from starlette.types import Receive, Scope, Send

from backend_store.errors import StoreError
from backend_store.types import AckResult, QueueName, SendResult

from .close_codes import CLOSE_CODE_BY_ERROR, CloseCode
from .engine import Connection, GoingAway, PushEngine
from .principal import Authenticate, CheckOrigin, PrincipalLike, error_code, error_detail
from .transport import WsTransport
from .ws_protocol import (
    AckRequest,
    AuthRequest,
    FrameError,
    NackRequest,
    PingRequest,
    ProtocolViolation,
    Request,
    RequestId,
    SendRequest,
    SubscribeRequest,
    UnsubscribeRequest,
    WsProtocol,
    error_frame,
    ok_frame,
    pong_frame,
)

logger = logging.getLogger("pushgate.push")


# How long a closing connection's writer may take to flush before it is abandoned.
CLOSE_FLUSH_S = 5.0


def bearer_token(scope: Scope) -> str | None:
    """The token of an ``Authorization: Bearer`` header, else of an ``access_token`` query parameter."""
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            text: str = value.decode("latin-1")
            scheme, _, token = text.partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
    query: bytes = scope.get("query_string", b"")
    if query:
        tokens = parse_qs(query.decode("latin-1")).get("access_token")
        if tokens and tokens[0]:
            return str(tokens[0])
    return None


def header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            raw: bytes = value
            return raw.decode("latin-1")
    return None


def _result_json(result: SendResult | StoreError) -> dict[str, Any]:
    if isinstance(result, SendResult):
        return {"id": result.id, "seq": result.seq, "duplicate": result.duplicate}
    return {"error": {"code": result.code, "detail": result.detail}}


class WebSocketSession:
    """The state of one connection: protocol, principal, transport, engine connection, timers."""

    __slots__ = (
        "auth_timer",
        "conn",
        "engine",
        "expiry",
        "pending",
        "principal",
        "protocol",
        "room",
        "transport",
    )

    def __init__(self, engine: PushEngine, transport: WsTransport) -> None:
        self.engine = engine
        self.transport = transport
        self.protocol = WsProtocol(engine.settings)
        self.principal: PrincipalLike | None = None
        self.conn: Connection | None = None
        self.expiry: asyncio.TimerHandle | None = None
        # Closes the connection if no auth frame comes in time (no token at connect).
        self.auth_timer: asyncio.TimerHandle | None = None
        # Sends, acks and nacks handed to the batchers and not answered yet. Past the
        # bound the reader stops reading, so a pipelining client meets TCP backpressure
        # instead of growing the server's queues.
        self.pending = 0
        self.room: asyncio.Event | None = None

    def request_done(self) -> None:
        self.pending -= 1
        if self.room is not None and self.pending < self.engine.settings.max_pending_requests:
            self.room.set()

    async def wait_for_room(self) -> None:
        while self.pending >= self.engine.settings.max_pending_requests and not self.transport.closed:
            self.room = asyncio.Event()
            await self.room.wait()
        self.room = None

    def close(self, code: CloseCode, reason: str) -> None:
        self.protocol.closed()
        self.transport.close(code, reason)

    def authenticated(self, principal: PrincipalLike) -> None:
        """Start (or, on refresh, re-arm) the expiry of the connection's credentials."""
        self.principal = principal
        self.protocol.authenticated()
        if self.auth_timer is not None:
            self.auth_timer.cancel()
            self.auth_timer = None
        if self.conn is None:
            self.conn = self.engine.open_connection(principal.tenant, self.transport)
        if self.expiry is not None:
            self.expiry.cancel()
            self.expiry = None
        if principal.expires_at is not None:
            delay = max(0.0, principal.expires_at - time.time())
            self.expiry = asyncio.get_running_loop().call_later(
                delay, self.close, CloseCode.AUTH_FAILED, "token expired"
            )

    def finish(self) -> None:
        for timer in (self.expiry, self.auth_timer):
            if timer is not None:
                timer.cancel()
        if self.conn is not None:
            self.engine.close_connection(self.conn)


class WebSocketHandler:
    """ASGI app for ``GET /v1/ws`` (mount with Starlette's ``WebSocketRoute``)."""

    def __init__(
        self, engine: PushEngine, authenticate: Authenticate, check_origin: CheckOrigin | None = None
    ) -> None:
        self.engine = engine
        self.authenticate = authenticate
        self.check_origin = check_origin

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "websocket":
            raise RuntimeError("the push WebSocket endpoint serves only WebSocket scopes")
        if (await receive())["type"] != "websocket.connect":
            return
        subprotocol = self.engine.settings.subprotocol
        offered = scope.get("subprotocols") or []
        await send(
            {"type": "websocket.accept", "subprotocol": subprotocol if subprotocol in offered else None}
        )
        settings = self.engine.settings
        transport = WsTransport(send, settings.send_buffer_bytes, settings.slow_consumer_grace_s)
        session = WebSocketSession(self.engine, transport)
        writer = asyncio.get_running_loop().create_task(transport.run())
        try:
            if self.engine.draining:
                session.close(CloseCode.GOING_AWAY, "server shutting down")
            else:
                token = bearer_token(scope)
                if token is not None:
                    await self._authenticate(session, scope, token, None)
                else:
                    session.auth_timer = asyncio.get_running_loop().call_later(
                        self.engine.settings.auth_timeout_s,
                        session.close,
                        CloseCode.AUTH_FAILED,
                        "authentication timed out",
                    )
            await self._read(session, scope, receive)
        except Exception:
            logger.exception("push WebSocket failed")
            session.close(CloseCode.INTERNAL_ERROR, "internal error")
        finally:
            session.finish()
            transport.close(CloseCode.NORMAL)
            with contextlib.suppress(Exception):
                async with asyncio.timeout(CLOSE_FLUSH_S):
                    await asyncio.shield(writer)
            if not writer.done():
                writer.cancel()

    async def _read(self, session: WebSocketSession, scope: Scope, receive: Receive) -> None:
        protocol = session.protocol
        transport = session.transport
        while not transport.closed:
            message = await receive()
            kind = message["type"]
            if kind == "websocket.disconnect":
                break
            if kind != "websocket.receive":
                continue
            try:
                text = message.get("text")
                request = (
                    protocol.receive_text(text)
                    if text is not None
                    else protocol.receive_bytes(message["bytes"])
                )
            except ProtocolViolation as exc:
                session.close(exc.close_code, exc.reason)
                break
            except FrameError as exc:
                transport.write_frame(error_frame(exc.request_id, exc.code, exc.detail))
                continue
            await self._handle(session, scope, request)

    async def _authenticate(
        self, session: WebSocketSession, scope: Scope, token: str, request_id: RequestId
    ) -> None:
        refresh = session.principal is not None
        try:
            principal = await self.authenticate(token)
        except Exception as exc:
            code = error_code(exc)
            if code == "internal_error":
                logger.exception("authentication failed unexpectedly")
            if refresh:
                # The old credentials hold until they expire; a failed refresh is one bad request.
                session.transport.write_frame(error_frame(request_id, code, error_detail(exc)))
            else:
                session.close(CLOSE_CODE_BY_ERROR.get(code, CloseCode.AUTH_FAILED), error_detail(exc))
            return
        if refresh:
            assert session.principal is not None
            if principal.tenant != session.principal.tenant:
                session.close(CloseCode.AUTH_FAILED, "a refreshed token must be for the same tenant")
                return
            assert session.conn is not None
            lost = [q for q in session.conn.subs if not principal.can("receive", q)]
            if lost:
                session.close(CloseCode.FORBIDDEN, f"forbidden: the new token cannot receive from {lost[0]}")
                return
        else:
            origin = header(scope, b"origin")
            if (
                origin is not None
                and self.check_origin is not None
                and not await self.check_origin(principal, origin)
            ):
                session.close(CloseCode.FORBIDDEN, "origin not allowed")
                return
        try:
            session.authenticated(principal)
        except GoingAway:
            session.close(CloseCode.GOING_AWAY, "server shutting down")
            return
        if request_id is not None or refresh:
            session.transport.write_frame(ok_frame(request_id, {"expires_at": principal.expires_at}))

    async def _handle(self, session: WebSocketSession, scope: Scope, request: Request) -> None:
        transport = session.transport
        if isinstance(request, PingRequest):
            transport.write_frame(pong_frame(request.id))
            return
        if isinstance(request, AuthRequest):
            await self._authenticate(session, scope, request.token, request.id)
            return
        principal, conn = session.principal, session.conn
        assert principal is not None and conn is not None  # the protocol let nothing else through
        engine = self.engine
        if isinstance(request, AckRequest | NackRequest):
            if not principal.can("receive"):
                session.close(CloseCode.FORBIDDEN, "forbidden: the token has no receive scope")
                return
            reply = self._ack_reply(session, request.id)
            session.pending += 1
            if isinstance(request, AckRequest):
                engine.ack(conn.tenant, request.receipts, reply)
            else:
                engine.nack(conn.tenant, request.receipts, request.delay_s, reply)
        elif isinstance(request, SendRequest):
            if not principal.can("send", request.queue):
                session.close(CloseCode.FORBIDDEN, f"forbidden: cannot send to {request.queue}")
                return
            session.pending += 1
            engine.send(
                conn.tenant, QueueName(request.queue), request.entries, self._send_reply(session, request)
            )
        elif isinstance(request, SubscribeRequest):
            await self._subscribe(session, request)
        elif isinstance(request, UnsubscribeRequest):
            engine.unsubscribe(conn, request.queue)
            if request.id is not None:
                transport.write_frame(ok_frame(request.id, {"queue": request.queue}))
        if session.pending >= engine.settings.max_pending_requests:
            await session.wait_for_room()

    async def _subscribe(self, session: WebSocketSession, request: SubscribeRequest) -> None:
        principal, conn, transport = session.principal, session.conn, session.transport
        assert principal is not None and conn is not None
        queue = QueueName(request.queue)
        if not principal.can("receive", queue):
            session.close(CloseCode.FORBIDDEN, f"forbidden: cannot receive from {queue}")
            return
        if self.engine.draining:
            session.close(CloseCode.GOING_AWAY, "server shutting down")
            return
        try:
            info = await self.engine.backend.get_queue(conn.tenant, queue)
            if transport.closed:
                return
            visibility = request.visibility_timeout_s
            self.engine.subscribe(
                conn,
                queue,
                prefetch=request.prefetch,
                auto_ack=request.auto_ack,
                visibility_timeout_s=info.attributes.visibility_timeout_s
                if visibility is None
                else visibility,
                batch=request.batch,
            )
        except StoreError as exc:
            transport.write_frame(error_frame(request.id, exc.code, exc.detail, queue))
            return
        # Written now, before the dispatcher runs: the ok always precedes the first message.
        transport.write_frame(ok_frame(request.id, {"queue": queue}))

    @staticmethod
    def _ack_reply(
        session: WebSocketSession, request_id: RequestId
    ) -> Callable[[AckResult | BaseException], None]:
        transport = session.transport

        def reply(result: AckResult | BaseException) -> None:
            session.request_done()
            if request_id is None:
                return  # fire and forget
            if isinstance(result, BaseException):
                transport.write_frame(error_frame(request_id, error_code(result), error_detail(result)))
            else:
                failed = [{"receipt": f.receipt, "code": f.code} for f in result.failed]
                transport.write_frame(ok_frame(request_id, {"acked": result.acked, "failed": failed}))

        return reply

    @staticmethod
    def _send_reply(
        session: WebSocketSession, request: SendRequest
    ) -> Callable[[list[SendResult | StoreError] | BaseException], None]:
        transport = session.transport
        request_id, is_batch = request.id, request.is_batch

        def reply(results: list[SendResult | StoreError] | BaseException) -> None:
            session.request_done()
            if request_id is None:
                return  # fire and forget
            if isinstance(results, BaseException):
                transport.write_frame(error_frame(request_id, error_code(results), error_detail(results)))
            elif is_batch:
                transport.write_frame(ok_frame(request_id, {"results": [_result_json(r) for r in results]}))
            elif isinstance(results[0], StoreError):
                transport.write_frame(error_frame(request_id, results[0].code, results[0].detail))
            else:
                transport.write_frame(ok_frame(request_id, {"result": _result_json(results[0])}))

        return reply
