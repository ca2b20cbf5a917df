"""uvicorn's ``websockets-sansio`` protocol with a fast path for the frames push moves most.

With a frame per message, a message crosses the WebSocket layer four times (the producer's
``send``, its ``ok``, the consumer's ``message``, a share of an ``ack``), and profiles put
the general machinery around each frame (``websockets``' generator parser and ``Frame``
objects, an ASGI message, an await and a re-encode per outgoing frame) above the work of
the frame itself. :class:`PushWebSocketProtocol` keeps uvicorn's protocol, its handshake,
keepalive, closing handshake and ASGI interface for every path, and adds:

- writes gathered per event-loop round (:class:`~gateway.ws_coalescing.CoalescingTransport`);
- out: a :class:`~push.transport.FrameSink` in the scope's extensions
  (``push.transport.FRAME_SINK``) that writes many text frames at once, each as a header
  and its bytes (:class:`DirectFrames`);
- in: once the connection is open, the client's bytes are cut into whole frames
  (:class:`~gateway.ws_frames.FrameSplitter`); a frame that is a whole text message becomes
  the same ``websocket.receive`` event uvicorn would queue, unmasked and decoded here; any
  other frame goes, whole, through uvicorn's and ``websockets``' own path, in order;
- the app's events wait in an :class:`Inbox` (a deque and a waiter) instead of an
  ``asyncio.Queue``, whose ``get`` is a coroutine and a few calls per frame.

Both paths are taken only while no extension (permessage-deflate) is negotiated, when a
frame's bytes are its payload. What the app sees is unchanged: the same ASGI events in the
same order, the same close codes (a frame too large, bad UTF-8, a protocol error are left
to ``websockets`` and uvicorn, which answer 1009, 1007 and 1002 as before).

This is the one module that relies on uvicorn beyond its public API (a subclass of its
private protocol class and its attributes); what it reads of ``websockets``' parser is in
:mod:`gateway.ws_websockets_internals`. :mod:`gateway.ws_protocol` imports it only on the
releases it was tested with, and serves with uvicorn's public ``websockets-sansio`` protocol
on any other (docs/http.md, "Dependencies we rely on beyond their public API"), which cost
15-50% more gateway CPU per message with a frame per message (bench/README.md).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

# uvicorn's internals (gateway/ws_protocol.py imports this module on a tested release only).
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.http11 import Request
from websockets.protocol import State

from push.transport import FRAME_SINK
from push.ws_handler import TEXT_SOURCE

from .ws_coalescing import CoalescingTransport
from .ws_frames import FrameSplitter, text_frame_header, unmask
from .ws_websockets_internals import between_frames, frame_size_limit, parser_failed, within_message

if TYPE_CHECKING:
    from uvicorn._types import ASGIReceiveEvent


class Inbox:
    """The ASGI events waiting for the app: what uvicorn's protocol uses of ``asyncio.Queue``
    (``put_nowait``, ``get``, ``empty``), with one waiter at most (the app's receive).

    A text message taken by the fast path waits as its ``str`` alone: it becomes a
    ``websocket.receive`` event only if the app asks through ASGI ``receive``; the push
    handler takes it as it is (:meth:`PushWebSocketProtocol.take_text`)."""

    __slots__ = ("_loop", "_waiter", "items")

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.items: deque[ASGIReceiveEvent | str] = deque()
        self._waiter: asyncio.Future[None] | None = None
        # The connection's loop, known when the protocol is made: asking for the running
        # loop costs a getpid() system call in Python 3.11, and the app waits once per read.
        self._loop = loop

    def put_nowait(self, event: ASGIReceiveEvent | str) -> None:
        self.items.append(event)
        self.wake()

    def wake(self) -> None:
        """Wake the waiting receive (after items were appended to :attr:`items` directly)."""
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait(self) -> None:
        """Return once something waits."""
        while not self.items:
            waiter = self._waiter = (self._loop or asyncio.get_running_loop()).create_future()
            try:
                await waiter
            finally:
                self._waiter = None

    async def get(self) -> ASGIReceiveEvent:
        await self.wait()
        return as_event(self.items.popleft())

    def empty(self) -> bool:
        return not self.items


def as_event(item: ASGIReceiveEvent | str) -> ASGIReceiveEvent:
    """An inbox item as the ASGI event it stands for."""
    return {"type": "websocket.receive", "text": item} if isinstance(item, str) else item


class DirectFrames:
    """The :class:`~push.transport.FrameSink` of one :class:`PushWebSocketProtocol` connection."""

    __slots__ = ("_protocol",)

    def __init__(self, protocol: PushWebSocketProtocol) -> None:
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
            parts.append(text_frame_header(len(frame)))
            if frame:
                parts.append(frame)
        protocol.coalescing.write_many(parts)
        return True


class PushWebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's sans-I/O WebSocket protocol with push's fast paths (see the module)."""

    coalescing: CoalescingTransport
    # Set once websockets' parser was seen between two frames of an open connection.
    splitter: FrameSplitter | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.inbox = Inbox(self.loop)
        # uvicorn's protocol puts every event through self.queue.
        self.queue = cast("asyncio.Queue[ASGIReceiveEvent]", self.inbox)

    async def receive(self) -> ASGIReceiveEvent:
        items = self.inbox.items
        if not items:
            await self.inbox.wait()
        item = items.popleft()
        if self.read_paused and not items:
            self.read_paused = False
            self.transport.resume_reading()
        return as_event(item)

    def take_text(self) -> str | None:
        """The next event's text if it is a text message taken by the fast path, else None
        (nothing waits, or the next event is another kind: ``receive`` has it). The
        :class:`~push.ws_handler.TextSource` offered to the push handler."""
        items = self.inbox.items
        if not items or not isinstance(items[0], str):
            return None
        text = cast(str, items.popleft())
        if self.read_paused and not items:
            self.read_paused = False
            self.transport.resume_reading()
        return text

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
            extensions[TEXT_SOURCE] = self.take_text

    def data_received(self, data: bytes) -> None:
        splitter = self.splitter
        if splitter is None:
            if not between_frames(self.conn):
                super().data_received(data)
                return
            splitter = self.splitter = FrameSplitter(frame_size_limit(self.conn))
        if splitter.passthrough:
            super().data_received(data)
            return
        data, spans = splitter.cut(data)
        conn = self.conn
        items = self.inbox.items
        queued = len(items)
        # Whether a whole text message is taken here: the connection is open with no
        # fragmented message under way; and whether it is kept (past websocket.close it is
        # discarded, as uvicorn does). Only websockets' own path below changes them, so they
        # are asked once per read and again after that path ran, not per frame.
        fast = conn.state is State.OPEN and not within_message(conn)
        keep = not self.close_sent
        try:
            for start, mask_at, end in spans:
                # A whole text message of an open connection is queued here, as uvicorn's
                # handle_text would queue it (inlined: most frames are these).
                if mask_at >= 0 and fast:
                    try:
                        text: str | None = unmask(data, mask_at, end).decode()
                    except UnicodeDecodeError:
                        text = None  # uvicorn's path answers it (1007)
                    if text is not None:
                        if keep:
                            items.append(text)  # a websocket.receive event, as the Inbox keeps them
                        continue
                super().data_received(data[start:end])
                if conn.state is not State.OPEN or parser_failed(conn):
                    # Closing or failed: what follows is websockets' to discard (or nobody's).
                    splitter.passthrough = True
                    splitter.take_buffer()  # the end of data: handed on with the rest
                    rest = data[end:]
                    if rest and not parser_failed(conn):
                        super().data_received(rest)
                    return
                fast = not within_message(conn)
                keep = not self.close_sent
        finally:
            if len(items) > queued:
                # Once per read, not per frame: wake the app. Flow control: reading goes on
                # while the app keeps up and stops once it has not yet taken what an earlier
                # read queued (so at most two reads' worth wait here; uvicorn stops after each
                # read, and resuming costs two epoll_ctl calls per read, 2-3 frames a read here).
                self.inbox.wake()
                if queued and not self.read_paused:
                    self.read_paused = True
                    self.transport.pause_reading()
