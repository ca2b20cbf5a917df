"""Write-only transports: the delivery engine writes finished frames and closes; it never reads.

A transport holds a bounded buffer of frames and one writer that drains it to the
socket. It knows nothing of queues or subscriptions: frames come encoded (see
``WsProtocol.delivery_encoder`` and ``SseEncoder.frames``).

Slow consumers. uvicorn's ``send`` returns without yielding while the socket is writable,
so a writer suspended in it means the client reads more slowly than we write.
:attr:`BufferedTransport.blocked_since` records when that began; the engine's watchdog
closes a transport blocked longer than ``write_timeout_s`` with 4008. A buffer past twice
its bound behind a blocked socket is closed at once (memory per connection stays bounded).
On close, unsent deliveries are dropped and the owner releases their messages.

Two implementations: :class:`WsTransport` (text frames of ``pushgate.v1``) and
:class:`SseTransport` (events of one SSE stream).

A WebSocket's frames go through ASGI ``websocket.send`` messages, one per frame, unless
the server offers a :class:`FrameSink` in the scope's extensions (:data:`FRAME_SINK`,
``gateway/ws_server_protocol.py`` does): then the writer hands the sink everything buffered in
one call, as the frames' bytes, without an ASGI message, an await or a re-encode per
frame. Flow control is the same either way: the writer waits while the socket is not
writable, and that wait is what :attr:`~BufferedTransport.blocked_since` records.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, ClassVar, Protocol

from starlette.types import Send

from .close_codes import CloseCode
from .sse_protocol import PING, SseEncoder

OnClose = Callable[[CloseCode, str], None]

# The ASGI scope extension under which a server offers a FrameSink for a WebSocket.
FRAME_SINK = "pushgate.websocket.frame_sink"

# The most an SSE stream hands to the server in one piece.
SSE_CHUNK_BYTES = 64 * 1024


class Transport(Protocol):
    """What the engine may do with a consumer's connection."""

    # What usage records name it ("ws", "sse"): see push/observer.py.
    kind: ClassVar[str]

    @property
    def closed(self) -> bool: ...

    @property
    def backlog(self) -> int:
        """Frames buffered but not yet handed to the socket (credit for auto-ack subscriptions)."""

    @property
    def blocked_since(self) -> float | None:
        """Since when (monotonic) the socket has not taken a frame handed to it; None: it is not blocked."""

    def write(self, frames: Sequence[Any]) -> None:
        """Queue finished frames, in order."""

    def close(self, code: CloseCode, reason: str = "") -> None:
        """Stop writing deliveries and close with ``code``; idempotent."""

    def bind(self, on_close: OnClose, on_drain: Callable[[], None] | None = None) -> None:
        """Set who hears about closes (to release messages) and drains (to send more)."""


class FrameSink(Protocol):
    """A server's direct way to write text frames to one accepted WebSocket (an ASGI
    extension, :data:`FRAME_SINK`): what ``websocket.send`` does, for many frames at once."""

    def writable(self) -> bool:
        """Whether the socket takes more now (the transport is not paused)."""

    async def wait_writable(self) -> None:
        """Return once the socket takes more (or the connection is lost)."""

    def send_text_frames(self, frames: Sequence[bytes]) -> bool:
        """Write each of ``frames`` (UTF-8 JSON) as one text frame, in order; False when the
        connection is closing or lost and nothing was written."""


class BufferedTransport:
    """The bounded buffer and close state shared by both transports."""

    kind: ClassVar[str] = "push"

    __slots__ = (
        "_bytes",
        "_frames",
        "_limit",
        "_loop",
        "_on_close",
        "_on_drain",
        "_waiter",
        "blocked_since",
        "close_code",
        "close_reason",
    )

    def __init__(self, limit: int) -> None:
        self._frames: deque[Any] = deque()
        self._bytes = 0
        self._limit = limit
        self.blocked_since: float | None = None
        self._waiter: asyncio.Future[None] | None = None
        # The loop the writer waits on, once known (asking for the running loop costs a
        # getpid() system call in Python 3.11; a transport stays on its connection's loop).
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_close: OnClose | None = None
        self._on_drain: Callable[[], None] | None = None
        self.close_code: CloseCode | None = None
        self.close_reason = ""

    def bind(self, on_close: OnClose, on_drain: Callable[[], None] | None = None) -> None:
        """Set who hears about closes (to release messages) and drains (to send more)."""
        self._on_close = on_close
        self._on_drain = on_drain

    @property
    def closed(self) -> bool:
        return self.close_code is not None

    @property
    def backlog(self) -> int:
        return len(self._frames)

    def write(self, frames: Sequence[Any]) -> None:
        if self.close_code is not None:
            return
        size = 0
        for frame in frames:
            self._frames.append(frame)
            size += len(frame)
        self._bytes += size
        if self._bytes > 2 * self._limit and self.blocked_since is not None:
            self.close(CloseCode.POLICY, "slow consumer: send buffer full")
            return
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _wait(self) -> None:
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        try:
            await waiter
        finally:
            self._waiter = None

    def close(self, code: CloseCode, reason: str = "") -> None:
        if self.close_code is not None:
            return
        self.close_code = code
        self.close_reason = reason
        # Unsent deliveries are released by the owner; sending them too could put a
        # message in two consumers' hands at once.
        self._frames.clear()
        self._bytes = 0
        self._wake()
        if self._on_close is not None:
            self._on_close(code, reason)


class WsTransport(BufferedTransport):
    """Text frames to one WebSocket: through ``sink`` when the server offers one, else one
    ASGI ``websocket.send`` per frame. Frames are UTF-8 JSON, as bytes (or str)."""

    __slots__ = ("_send", "_sink")
    kind = "ws"

    def __init__(self, send: Send, limit: int, sink: FrameSink | None = None) -> None:
        super().__init__(limit)
        self._send = send
        self._sink = sink

    async def run(self) -> None:
        """Drain the buffer to the socket until closed, then send the close frame."""
        frames = self._frames
        while True:
            if not frames:
                if self.close_code is not None:
                    break
                await self._wait()
                continue
            if self._sink is not None:
                await self._drain_to_sink(self._sink)
            else:
                await self._drain_to_asgi()
            if self._on_drain is not None:
                self._on_drain()
        code = self.close_code or CloseCode.NORMAL
        await self._send({"type": "websocket.close", "code": int(code), "reason": self.close_reason[:120]})

    async def _drain_to_sink(self, sink: FrameSink) -> None:
        frames = self._frames
        while frames:
            if not sink.writable():
                self.blocked_since = time.monotonic()
                await sink.wait_writable()
                self.blocked_since = None
                continue
            batch = [frame if isinstance(frame, bytes) else frame.encode() for frame in frames]
            frames.clear()
            self._bytes = 0
            # False: the connection is going away; the handler hears of it from receive().
            sink.send_text_frames(batch)

    async def _drain_to_asgi(self) -> None:
        frames = self._frames
        send = self._send
        while frames:
            frame = frames.popleft()
            self._bytes -= len(frame)
            self.blocked_since = time.monotonic()
            await send(
                {"type": "websocket.send", "text": frame if isinstance(frame, str) else frame.decode()}
            )
            self.blocked_since = None


class SseTransport(BufferedTransport):
    """Events of one SSE stream; :meth:`body` is the response's body iterator."""

    __slots__ = ("_ping_interval_s",)
    kind = "sse"

    def __init__(self, limit: int, ping_interval_s: float) -> None:
        super().__init__(limit)
        self._ping_interval_s = ping_interval_s

    async def body(self, opening: bytes) -> AsyncIterator[bytes]:
        """Yield everything buffered as one chunk per wake-up, so the rate is not capped
        by a per-event cost of the response; a ping when idle for the ping interval."""
        frames = self._frames
        yield opening
        while True:
            if frames:
                # Many events per chunk, but a bounded chunk: uvicorn takes a chunk whole
                # whenever the socket was writable before it, so what waits for a slow
                # client must wait here, where the bound and the watchdog can see it.
                parts = [frames.popleft()]
                size = len(parts[0])
                while frames and size < SSE_CHUNK_BYTES:
                    part = frames.popleft()
                    parts.append(part)
                    size += len(part)
                self._bytes -= size
                self.blocked_since = time.monotonic()
                yield b"".join(parts)
                self.blocked_since = None
                if not frames and self._on_drain is not None:
                    self._on_drain()
                continue
            if self.close_code is not None:
                break
            try:
                async with asyncio.timeout(self._ping_interval_s):
                    await self._wait()
            except TimeoutError:
                yield PING
        if self.close_code is not None:
            yield SseEncoder.closing(self.close_code, self.close_reason)
