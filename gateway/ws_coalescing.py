"""uvicorn's sans-I/O WebSocket protocol, writing to the socket once per event-loop round.

uvicorn hands every frame to the transport as it is sent, and uvloop writes it to the
socket at once: a syscall per frame. A producer pipelining sends gets its ``ok`` replies
in bursts (one per batch the store commits), and a consumer its ``message`` frames in
bursts (one per deal); profiles put those writes at a fifth of the event loop's time when
each message is its own frame. Here the protocol's transport gathers what is written
during one round of the loop and writes it in one call at the end of the round, as a
Redis server answers a pipeline.

Nothing else changes: the bytes and their order are the protocol's, a close writes what is
pending first, and the real transport's flow control (``pause_writing``) applies when the
gathered bytes reach it, in the same round.

The protocol also offers the push handler a :class:`~push.transport.FrameSink` (the ASGI
extension ``push.transport.FRAME_SINK``): a consumer's deliveries and replies, many frames
at a time, written as server text frames straight to that transport. Through ASGI each
frame is a ``websocket.send`` message, an await, an ``encode()`` of the text and a
``Frame`` object serialized by ``websockets``; here it is a two-byte header (server frames
are not masked) and the frame's bytes. Offered only when no extension (permessage-deflate)
is negotiated, since then a frame's bytes are its payload; every check ``send`` makes
first (handshake done, close not sent, connection open) is made here too.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Sequence
from typing import Any, cast

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.http11 import Request
from websockets.protocol import State

from push.transport import FRAME_SINK


class CoalescingTransport(asyncio.Transport):
    """The outgoing side of a transport, gathering the writes of one loop round."""

    def __init__(self, transport: asyncio.Transport) -> None:
        super().__init__()
        self._transport = transport
        self._pending: list[bytes] = []
        self._loop = asyncio.get_running_loop()

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        if not self._pending:
            self._loop.call_soon(self.flush)
        self._pending.append(data if isinstance(data, bytes) else bytes(data))

    def write_many(self, parts: list[bytes]) -> None:
        """Gather ``parts`` (non-empty bytes) for this round's write, in order."""
        if not self._pending:
            self._loop.call_soon(self.flush)
        self._pending.extend(parts)

    def flush(self) -> None:
        """Write what this round gathered (a no-op when it was flushed already)."""
        pending = self._pending
        if not pending:
            return
        self._pending = []
        if not self._transport.is_closing():
            # writelines: one writev for all of it, no copy into one buffer.
            self._transport.writelines(pending)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        self._pending = []
        self._transport.abort()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def pause_reading(self) -> None:
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._transport.resume_reading()

    def is_reading(self) -> bool:
        return self._transport.is_reading()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + sum(map(len, self._pending))


# Server-to-client text frames, FIN set, not masked (RFC 6455 5.2).
_SHORT_HEADERS = [bytes((0x81, n)) for n in range(126)]
_MEDIUM_HEADER = struct.Struct("!BBH")
_LONG_HEADER = struct.Struct("!BBQ")


def text_frame_header(length: int) -> bytes:
    """The header of an unmasked, final text frame with a payload of ``length`` bytes."""
    if length < 126:
        return _SHORT_HEADERS[length]
    if length < 1 << 16:
        return _MEDIUM_HEADER.pack(0x81, 126, length)
    return _LONG_HEADER.pack(0x81, 127, length)


class DirectFrames:
    """The :class:`~push.transport.FrameSink` of one connection of
    :class:`CoalescingWebSocketProtocol`."""

    __slots__ = ("_protocol",)

    def __init__(self, protocol: CoalescingWebSocketProtocol) -> None:
        self._protocol = protocol

    def writable(self) -> bool:
        return self._protocol.writable.is_set()

    async def wait_writable(self) -> None:
        await self._protocol.writable.wait()

    def send_text_frames(self, frames: Sequence[bytes]) -> bool:
        protocol = self._protocol
        # What uvicorn's send() checks before a websocket.send (and websockets' send_text).
        if (
            protocol.disconnected
            or protocol.close_sent
            or not protocol.handshake_complete
            or protocol.initial_response is not None
            or protocol.conn.state is not State.OPEN
        ):
            return False
        parts: list[bytes] = []
        for frame in frames:
            if frame:
                parts.append(text_frame_header(len(frame)))
                parts.append(frame)
            else:
                parts.append(_SHORT_HEADERS[0])
        protocol.coalescing.write_many(parts)
        return True


class CoalescingWebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's ``websockets-sansio`` protocol over a :class:`CoalescingTransport`,
    offering the push handler a :class:`DirectFrames` sink."""

    coalescing: CoalescingTransport

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.coalescing = CoalescingTransport(self.transport)
        self.transport = self.coalescing

    def handle_connect(self, event: Request) -> None:
        super().handle_connect(event)
        # The scope exists once the request is a WebSocket upgrade (not a rejected one).
        if self.response.status_code == 101 and not self.conn.extensions and hasattr(self, "scope"):
            # ASGI types extensions as dicts of dicts; an extension may be any object.
            extensions = cast(dict[str, Any], self.scope["extensions"])
            extensions[FRAME_SINK] = DirectFrames(self)
