"""The ``/v1/ws`` endpoint: a plain ASGI app that moves frames between uvicorn, the
protocol and the engine.

Text in goes to :class:`~push.ws_protocol.WsProtocol`; the requests it returns go to the
engine; what the protocol queues (replies, the close) goes to the transport, whose writer
task drains it with the deliveries. Every reply and close decision is the protocol's.
The handler accepts first and then closes with a code, so that browsers see 4001/4003
instead of a bare failed handshake.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs

from starlette.types import Receive, Scope, Send

from backend_store.errors import Forbidden, PushgateError
from backend_store.types import AckResult, NewMessage, QueueName, SendResult

from .close_codes import CloseCode, close_code_for
from .engine import Connection, PushEngine
from .principal import Authenticate, CheckOrigin, Operation, RateCheck
from .send_group import SendGroup
from .send_path import SendReply, SendResults
from .transport import FRAME_SINK, WsTransport
from .ws_protocol import (
    AckRequest,
    AuthRequest,
    NackRequest,
    PingRequest,
    RequestId,
    SendRequest,
    State,
    SubscribeRequest,
    UnsubscribeRequest,
    WsProtocol,
    delivery_encoder,
)

logger = logging.getLogger("pushgate.push")

# How long a closing connection's writer may take to flush before it is abandoned.
CLOSE_FLUSH_S = 5.0

# The ASGI scope extension under which a server offers a TextSource for a WebSocket.
TEXT_SOURCE = "pushgate.websocket.text_source"

# A server's direct way to take the client's next text message: its text when the next
# event is a text ``websocket.receive``, else None (then ASGI ``receive`` has the event).
# It spares each frame the event dict and the coroutine of ``await receive()``
# (``gateway/ws_server_protocol.py`` offers one).
TextSource = Callable[[], str | None]


def bearer_token(scope: Scope) -> str | None:
    """The token of an ``Authorization: Bearer`` header, else of an ``access_token`` query parameter."""
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            text: str = value.decode("latin-1")
            auth_scheme, _, token = text.partition(" ")
            if auth_scheme.lower() == "bearer" and token.strip():
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


# Requests handed to the engine without a coroutine (a tuple: isinstance is quicker with one).
_NOW = (SendRequest, AckRequest, NackRequest)


def _no_reply(results: SendResults | PushgateError) -> None:
    """A placeholder until a group's own reply is built (it needs the group)."""


def _result_json(result: SendResult | PushgateError) -> dict[str, Any]:
    if isinstance(result, SendResult):
        return {"id": result.id, "seq": result.seq, "duplicate": result.duplicate}
    return {"error": {"code": result.code, "detail": result.detail}}


class WebSocketSession:
    """One connection: its protocol, transport, engine connection and the pending bound."""

    __slots__ = ("auth_timer", "conn", "engine", "pending", "protocol", "room", "sends", "transport")

    def __init__(self, engine: PushEngine, transport: WsTransport) -> None:
        self.engine = engine
        self.transport = transport
        self.protocol = WsProtocol(engine.settings)
        self.conn: Connection | None = None
        # Closes the connection if no auth frame comes in time (no token at connect).
        self.auth_timer: asyncio.TimerHandle | None = None
        # Sends, acks and nacks handed to the batchers and not answered yet. Past the
        # bound the reader stops reading, so a pipelining client meets TCP backpressure
        # instead of growing the server's queues.
        self.pending = 0
        self.room: asyncio.Event | None = None
        # The last group of single-message sends handed to the engine: the next single send
        # to its queue joins it while the batcher has not taken it (push/send_group.py).
        self.sends: SendGroup | None = None

    def flush(self) -> None:
        """Hand what the protocol queued to the transport: frames, then the close."""
        frames = self.protocol.data_to_send()
        if frames:
            self.transport.write(frames)
        if self.protocol.state is State.CLOSING and not self.transport.closed:
            assert self.protocol.close_code is not None
            self.transport.close(self.protocol.close_code, self.protocol.close_reason)

    def fail(self, code: CloseCode, reason: str) -> None:
        """End the connection from outside the read loop (the engine's watchdog, a timer)."""
        self.protocol.fail(code, reason)
        self.flush()

    def end_subscription(self, queue: str, exc: PushgateError) -> None:
        self.protocol.error(None, exc, queue)
        self.flush()

    def request_done(self, count: int = 1) -> None:
        self.pending -= count
        if self.room is not None and self.pending < self.engine.settings.max_pending_requests:
            self.room.set()

    def settled(self, result: AckResult | BaseException) -> None:
        """The reply of an ack or nack without an id: nothing to answer, one request fewer."""
        self.request_done()

    async def wait_for_room(self) -> None:
        while self.pending >= self.engine.settings.max_pending_requests and not self.transport.closed:
            self.room = asyncio.Event()
            await self.room.wait()
        self.room = None

    def finish(self) -> None:
        if self.auth_timer is not None:
            self.auth_timer.cancel()
        if self.conn is not None:
            self.engine.close_connection(self.conn)


class WebSocketHandler:
    """ASGI app for ``GET /v1/ws`` (mount with Starlette's ``WebSocketRoute``)."""

    def __init__(
        self,
        engine: PushEngine,
        authenticate: Authenticate,
        check_origin: CheckOrigin | None = None,
        rate_check: RateCheck | None = None,
    ) -> None:
        self.engine = engine
        self.authenticate = authenticate
        self.check_origin = check_origin
        self.rate_check = rate_check

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "websocket":
            raise RuntimeError("the push WebSocket endpoint serves only WebSocket scopes")
        if (await receive())["type"] != "websocket.connect":
            return
        settings = self.engine.settings
        offered = scope.get("subprotocols") or []
        await send(
            {
                "type": "websocket.accept",
                "subprotocol": settings.subprotocol if settings.subprotocol in offered else None,
            }
        )
        transport = WsTransport(send, settings.send_buffer_bytes, scope.get("extensions", {}).get(FRAME_SINK))
        session = WebSocketSession(self.engine, transport)
        writer = asyncio.get_running_loop().create_task(transport.run())
        try:
            if self.engine.draining:
                session.fail(CloseCode.GOING_AWAY, "server shutting down")
            else:
                token = bearer_token(scope)
                if token is not None:
                    await self._authenticate(session, scope, token, None)
                else:
                    session.auth_timer = asyncio.get_running_loop().call_later(
                        settings.auth_timeout_s,
                        session.fail,
                        CloseCode.AUTH_FAILED,
                        "authentication timed out",
                    )
            session.flush()
            await self._read(session, scope, receive)
        except Exception:
            logger.exception("push WebSocket failed")
            session.fail(CloseCode.INTERNAL_ERROR, "internal error")
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
        take_text: TextSource | None = scope.get("extensions", {}).get(TEXT_SOURCE)
        max_pending = self.engine.settings.max_pending_requests
        while not transport.closed:
            text = None if take_text is None else take_text()
            if text is None:
                message = await receive()
                kind = message["type"]
                if kind == "websocket.disconnect":
                    break
                if kind != "websocket.receive":
                    continue
                text = message.get("text")
            if (conn := session.conn) is not None:
                conn.heard_at = time.time()  # Connection.heard, inlined: once per frame
            if text is None:
                protocol.receive_bytes(message["bytes"])
                request = None
            else:
                request = protocol.receive_text(text)
            if isinstance(request, _NOW):
                # Most frames: handed to the engine without a coroutine of their own.
                if (pending := self._handle_now(session, request)) is not None:
                    await pending
            elif request is not None:
                await self._handle(session, scope, request)
            if protocol.outgoing or protocol.state is State.CLOSING:
                session.flush()
            if session.pending >= max_pending:
                await session.wait_for_room()

    async def _authenticate(
        self, session: WebSocketSession, scope: Scope, token: str, request_id: RequestId
    ) -> None:
        protocol = session.protocol
        try:
            principal = await self.authenticate(token)
        except PushgateError as exc:
            protocol.authentication_failed(exc, request_id)
            return
        if session.conn is None:
            origin = header(scope, b"origin")
            if (
                origin is not None
                and self.check_origin is not None
                and not await self.check_origin(principal, origin, header(scope, b"host"))
            ):
                protocol.fail_with(Forbidden("origin not allowed"))
                return
        subscribed = session.conn.subs if session.conn is not None else ()
        if not protocol.authenticated(principal, request_id, subscribed):
            return
        if session.auth_timer is not None:
            session.auth_timer.cancel()
            session.auth_timer = None
        if session.conn is None:
            if self.rate_check is not None:
                try:
                    if (pending := self.rate_check(principal, "connect", None)) is not None:
                        await pending
                except PushgateError as exc:
                    # The handshake is accepted already: a refused connect is a close (4008).
                    protocol.fail(close_code_for(exc, CloseCode.POLICY), exc.detail)
                    return
            try:
                session.conn = self.engine.open_connection(
                    principal,
                    session.transport,
                    close=session.fail,
                    end_subscription=session.end_subscription,
                )
            except PushgateError as exc:
                protocol.fail_with(exc)
        else:
            session.conn.principal = principal  # a refresh: new expiry, maybe new scopes

    async def _handle(
        self,
        session: WebSocketSession,
        scope: Scope,
        request: PingRequest | AuthRequest | SubscribeRequest | UnsubscribeRequest,
    ) -> None:
        """Every request but sends, acks and nacks (see :meth:`_handle_now`)."""
        protocol = session.protocol
        if isinstance(request, PingRequest):
            protocol.pong(request.id)
            return
        if isinstance(request, AuthRequest):
            await self._authenticate(session, scope, request.token, request.id)
            return
        conn, engine = session.conn, self.engine
        assert conn is not None  # the protocol let nothing else through before auth
        if isinstance(request, SubscribeRequest):
            queue = QueueName(request.queue)
            if not await self._admitted(session, self._admission(conn, "receive", queue), queue, request.id):
                return
            try:
                await engine.subscribe(
                    conn,
                    queue,
                    delivery_encoder(queue, request.batch),
                    prefetch=request.prefetch,
                    auto_ack=request.auto_ack,
                    visibility_timeout_s=request.visibility_timeout_s,
                    batch=request.batch,
                )
            except PushgateError as exc:
                protocol.error(request.id, exc, queue)
                return
            # Flushed before the dispatcher runs: the ok always precedes the first message.
            protocol.ok(request.id, {"queue": queue})
            session.flush()
        elif isinstance(request, UnsubscribeRequest):
            engine.unsubscribe(conn, request.queue)
            if request.id is not None:
                protocol.ok(request.id, {"queue": request.queue})

    def _handle_now(
        self, session: WebSocketSession, request: SendRequest | AckRequest | NackRequest
    ) -> Awaitable[None] | None:
        """Hand a send, ack or nack to the engine; a send that a rate limit must count first
        comes back as the awaitable that counts it and then sends."""
        conn, engine = session.conn, self.engine
        assert conn is not None  # the protocol let nothing else through before auth
        if isinstance(request, SendRequest):
            pending = self._admission(conn, "send", request.queue)
            if pending is not None:
                return self._send_when_admitted(session, conn, request, pending)
            if session.protocol.refusals:
                session.protocol.admitted()
            self._send(session, conn, request)
            return None
        session.pending += 1
        reply = self._ack_reply(session, request.id)
        if isinstance(request, AckRequest):
            engine.ack(conn.tenant, request.receipts, reply)
        else:
            engine.nack(conn.tenant, request.receipts, request.delay_s, reply)
        return None

    def _send(self, session: WebSocketSession, conn: Connection, request: SendRequest) -> None:
        session.pending += 1
        if request.is_batch:
            session.sends = None  # later single sends queue after this batch, not before it
            self.engine.send(
                conn.tenant, QueueName(request.queue), request.entries, self._send_reply(session, request)
            )
            return
        entry = request.entries[0]
        assert isinstance(entry, NewMessage)  # a bad single message is refused by the protocol
        group = session.sends
        if group is not None and not group.taken and group.queue == request.queue:
            group.add(entry, request.id, time.perf_counter())
            return
        group = SendGroup(QueueName(request.queue), entry, request.id, time.perf_counter(), _no_reply)
        group.reply = self._group_reply(session, group)
        session.sends = group
        self.engine.send_group(conn.tenant, group)

    async def _send_when_admitted(
        self, session: WebSocketSession, conn: Connection, request: SendRequest, pending: Awaitable[object]
    ) -> None:
        if await self._admitted(session, pending, request.queue, request.id):
            self._send(session, conn, request)

    def _admission(self, conn: Connection, op: Operation, queue: str) -> Awaitable[object] | None:
        """The rate limits' count of a send or subscribe (None: nothing to count)."""
        return None if self.rate_check is None else self.rate_check(conn.principal, op, queue)

    async def _admitted(
        self, session: WebSocketSession, pending: Awaitable[object] | None, queue: str, request_id: RequestId
    ) -> bool:
        """Wait for a rate limit's count of a request; a refusal is answered here."""
        if pending is not None:
            try:
                await pending
            except PushgateError as exc:
                if exc.code == "rate_limited":
                    session.protocol.refused(request_id, exc)
                else:
                    session.protocol.error(request_id, exc, queue)
                return False
        session.protocol.admitted()
        return True

    @staticmethod
    def _ack_reply(
        session: WebSocketSession, request_id: RequestId
    ) -> Callable[[AckResult | BaseException], None]:
        if request_id is None:
            return session.settled  # fire and forget: no closure per frame
        protocol = session.protocol

        def reply(result: AckResult | BaseException) -> None:
            session.request_done()
            if isinstance(result, PushgateError):
                protocol.error(request_id, result)
            elif isinstance(result, AckResult):
                failed = [{"receipt": f.receipt, "code": f.code} for f in result.failed]
                protocol.ok(request_id, {"acked": result.acked, "failed": failed})
            else:
                protocol.error(request_id, PushgateError("internal error"))
            session.flush()

        return reply

    @staticmethod
    def _group_reply(session: WebSocketSession, group: SendGroup) -> SendReply:
        """Each request of a group answered under its own id, in order (push/send_group.py)."""
        protocol = session.protocol

        def reply(results: SendResults | PushgateError) -> None:
            ids = group.ids
            session.request_done(len(ids))
            if isinstance(results, PushgateError):
                for request_id in ids:
                    if request_id is not None:
                        protocol.error(request_id, results)
            else:
                protocol.sent_many(ids, results)
            session.flush()

        return reply

    @staticmethod
    def _send_reply(session: WebSocketSession, request: SendRequest) -> SendReply:
        protocol = session.protocol
        request_id, is_batch = request.id, request.is_batch

        def reply(results: SendResults | PushgateError) -> None:
            session.request_done()
            if request_id is None:
                return  # fire and forget
            if isinstance(results, PushgateError):
                protocol.error(request_id, results)
            elif is_batch:
                protocol.ok(request_id, {"results": [_result_json(r) for r in results]})
            elif isinstance(results[0], PushgateError):
                protocol.error(request_id, results[0])
            else:
                protocol.ok(request_id, {"result": _result_json(results[0])})
            session.flush()

        return reply
