"""Write-only transports: the delivery engine writes messages and closes; it never reads.

A transport holds a bounded buffer of encoded frames and one writer that drains it to
the socket. When the buffer passes ``limit`` bytes the consumer is too slow: the
transport closes itself with 4008, drops what it had not sent (the engine releases
those messages so another consumer gets them) and tells its owner through ``on_close``.

Two implementations: :class:`WsTransport` (text frames of ``pushgate.v1``) and
:class:`SseTransport` (events of one SSE stream).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any, Protocol

from starlette.types import Send

from .close_codes import CloseCode
from .sse_protocol import PING, SseEncoder
from .ws_protocol import error_frame, message_frame, message_prefix, messages_frame, messages_prefix

if TYPE_CHECKING:
    from .subscription import Subscription

OnClose = Callable[[CloseCode, str], None]

# The most an SSE stream hands to the server in one piece.
SSE_CHUNK_BYTES = 64 * 1024


class Transport(Protocol):
    """What the engine may do with a consumer's connection."""

    @property
    def closed(self) -> bool: ...

    @property
    def backlog(self) -> int:
        """Frames buffered but not yet handed to the socket (credit for auto-ack subscriptions)."""

    def write(self, sub: Subscription, payload: bytes, n: int) -> None:
        """Queue one message (its JSON, encoded once); ``n`` is its number in the subscription."""

    def write_many(self, sub: Subscription, payloads: list[bytes], first_n: int) -> None:
        """Queue several messages of one subscription, numbered from ``first_n``."""

    def close(self, code: CloseCode, reason: str = "") -> None:
        """Stop writing deliveries and close with ``code``; idempotent."""

    def end_subscription(self, queue: str, code: str, detail: str) -> None:
        """A subscription ended without the client asking (its queue was deleted)."""

    def bind(self, on_close: OnClose, on_drain: Callable[[], None] | None = None) -> None:
        """Set who hears about closes (to release messages) and drains (to send more)."""


class BufferedTransport:
    """The bounded buffer and close state shared by both transports."""

    __slots__ = (
        "_bytes",
        "_frames",
        "_in_send",
        "_limit",
        "_on_close",
        "_on_drain",
        "_stall_check",
        "_stall_grace_s",
        "_waiter",
        "close_code",
        "close_reason",
    )

    def __init__(self, limit: int, stall_grace_s: float = 1.0) -> None:
        self._frames: deque[Any] = deque()
        self._bytes = 0
        self._limit = limit
        # True while the writer is suspended handing a frame to the socket: seen from
        # outside only when the socket is not writable (a send that can write returns
        # without yielding), i.e. when the client reads more slowly than we write.
        self._in_send = False
        self._stall_grace_s = stall_grace_s
        self._stall_check: asyncio.TimerHandle | None = None
        self._waiter: asyncio.Future[None] | None = None
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

    def _push(self, frame: Any, size: int) -> None:
        if self.close_code is not None:
            return
        self._frames.append(frame)
        self._bytes += size
        if self._bytes > self._limit:
            self._over_limit()
        self._wake()

    def _over_limit(self) -> None:
        """The buffer passed its bound. A burst into a writable socket may (credits bound
        it); a buffer past the bound behind a socket that stays blocked for the grace
        period is a slow consumer. Twice the bound behind a blocked socket ends it at once."""
        if self._in_send and self._bytes > 2 * self._limit:
            self.close(CloseCode.POLICY, "slow consumer: send buffer full")
        elif self._stall_check is None:
            self._stall_check = asyncio.get_running_loop().call_later(self._stall_grace_s, self._stalled)

    def _stalled(self) -> None:
        self._stall_check = None
        if self.close_code is not None or self._bytes <= self._limit:
            return
        if self._in_send:
            self.close(CloseCode.POLICY, "slow consumer: send buffer full")
        else:
            self._over_limit()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _wait(self) -> None:
        waiter = self._waiter = asyncio.get_running_loop().create_future()
        try:
            await waiter
        finally:
            self._waiter = None

    def write(self, sub: Subscription, payload: bytes, n: int) -> None:
        raise NotImplementedError

    def write_many(self, sub: Subscription, payloads: list[bytes], first_n: int) -> None:
        raise NotImplementedError

    def end_subscription(self, queue: str, code: str, detail: str) -> None:
        raise NotImplementedError

    def close(self, code: CloseCode, reason: str = "") -> None:
        if self.close_code is not None:
            return
        self.close_code = code
        self.close_reason = reason
        if self._stall_check is not None:
            self._stall_check.cancel()
            self._stall_check = None
        # Unsent deliveries are released by the owner; sending them too could put a
        # message in two consumers' hands at once.
        self._frames.clear()
        self._bytes = 0
        self._wake()
        if self._on_close is not None:
            self._on_close(code, reason)


class WsTransport(BufferedTransport):
    """Text frames to one WebSocket through the ASGI ``send`` callable."""

    __slots__ = ("_prefixes", "_send")

    def __init__(self, send: Send, limit: int, stall_grace_s: float = 1.0) -> None:
        super().__init__(limit, stall_grace_s)
        self._send = send
        # Envelope bytes per queue, built once (queues per connection are few).
        self._prefixes: dict[str, tuple[bytes, bytes]] = {}

    def _prefix(self, queue: str) -> tuple[bytes, bytes]:
        prefixes = self._prefixes.get(queue)
        if prefixes is None:
            prefixes = self._prefixes[queue] = (message_prefix(queue), messages_prefix(queue))
        return prefixes

    def write_frame(self, frame: str) -> None:
        """A reply or control frame (ok, error, pong)."""
        self._push(frame, len(frame))

    def end_subscription(self, queue: str, code: str, detail: str) -> None:
        self.write_frame(error_frame(None, code, detail, queue))

    def write(self, sub: Subscription, payload: bytes, n: int) -> None:
        frame = message_frame(self._prefix(sub.queue)[0], payload)
        self._push(frame, len(frame))

    def write_many(self, sub: Subscription, payloads: list[bytes], first_n: int) -> None:
        single, many = self._prefix(sub.queue)
        if sub.batch <= 1:
            for payload in payloads:
                self.write_frame(message_frame(single, payload))
            return
        batch = sub.batch
        for start in range(0, len(payloads), batch):
            chunk = payloads[start : start + batch]
            self.write_frame(
                message_frame(single, chunk[0]) if len(chunk) == 1 else messages_frame(many, chunk)
            )

    async def run(self) -> None:
        """Drain the buffer to the socket until closed, then send the close frame."""
        frames = self._frames
        send = self._send
        while True:
            if not frames:
                if self.close_code is not None:
                    break
                await self._wait()
                continue
            while frames:
                frame = frames.popleft()
                self._bytes -= len(frame)
                # uvicorn's send returns without yielding while the socket is writable;
                # it waits (and the buffer fills) only when the client reads too slowly.
                self._in_send = True
                await send({"type": "websocket.send", "text": frame})
                self._in_send = False
            if self._on_drain is not None:
                self._on_drain()
        code = self.close_code or CloseCode.NORMAL
        await send({"type": "websocket.close", "code": int(code), "reason": self.close_reason[:120]})


class SseTransport(BufferedTransport):
    """Events of one SSE stream; :meth:`body` is the response's body iterator."""

    __slots__ = ("_encoder", "_ping_interval_s")

    def __init__(
        self, encoder: SseEncoder, limit: int, ping_interval_s: float, stall_grace_s: float = 1.0
    ) -> None:
        super().__init__(limit, stall_grace_s)
        self._encoder = encoder
        self._ping_interval_s = ping_interval_s

    def end_subscription(self, queue: str, code: str, detail: str) -> None:
        # A stream serves one queue: it ends with it.
        self.close(CloseCode.NORMAL, f"{code}: {detail}")

    def write(self, sub: Subscription, payload: bytes, n: int) -> None:
        chunk = self._encoder.message(n, payload)
        self._push(chunk, len(chunk))

    def write_many(self, sub: Subscription, payloads: list[bytes], first_n: int) -> None:
        # One item per event, so the body iterator can cut bounded chunks.
        message = self._encoder.message
        for n, payload in enumerate(payloads, first_n):
            chunk = message(n, payload)
            self._push(chunk, len(chunk))

    async def body(self, opening: bytes) -> AsyncIterator[bytes]:
        """Yield everything buffered as one chunk per wake-up, so the rate is not capped
        by a per-event cost of the response; a ping when idle for the ping interval."""
        frames = self._frames
        yield opening
        while True:
            if frames:
                # Many events per chunk, but a bounded chunk: uvicorn takes a chunk whole
                # whenever the socket was writable before it, so what waits for a slow
                # client must wait here, where the bound and the stall check can see it.
                parts = [frames.popleft()]
                size = len(parts[0])
                while frames and size < SSE_CHUNK_BYTES:
                    part = frames.popleft()
                    parts.append(part)
                    size += len(part)
                self._bytes -= size
                self._in_send = True
                yield b"".join(parts)
                self._in_send = False
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
