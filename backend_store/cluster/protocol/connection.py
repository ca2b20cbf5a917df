"""One node-protocol connection as a state machine, without I/O (the ``websockets`` way).

Bytes in (:meth:`Connection.receive_data`, :meth:`Connection.receive_eof`), messages out
(:meth:`Connection.events_received`), bytes to write (:meth:`Connection.data_to_send`).
An asyncio shell owns the socket and the futures; this class owns the rules:

- Both sides send :class:`~.wire.Hello` first; the peer's first frame must be its Hello,
  with the same protocol version. Requests may be sent before the peer's Hello arrives.
- Request ids are chosen by the sender, one counter per connection. A reply or error must
  answer a request that is pending; a request id must not be reused while pending.
- Anything else that breaks the protocol closes the connection: a
  :class:`~.wire.Close` frame with the code goes out, the state becomes ``CLOSED`` and a
  :class:`Closed` event lists the requests that will never be answered.

::

    HANDSHAKE --peer Hello--> OPEN --Close sent/received, EOF, violation--> CLOSED
        `-----------------------------------------------------------------^
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from ...types import Epoch, LogEntry, Lsn
from .wire import (
    DEFAULT_MAX_FRAME,
    NO_EPOCH,
    NO_LSN,
    PROTOCOL_VERSION,
    Close,
    CloseCode,
    Delivery,
    Demand,
    ErrorReply,
    Events,
    FrameReader,
    FrameWriter,
    Hello,
    Message,
    Notify,
    Replicate,
    Replicated,
    Reply,
    Request,
    SnapshotChunk,
    WireError,
    Withdraw,
)


class State(Enum):
    HANDSHAKE = "handshake"
    OPEN = "open"
    CLOSED = "closed"


@dataclass(frozen=True, slots=True)
class Closed:
    """The connection is closed; ``pending`` are our requests that got no answer."""

    code: CloseCode
    detail: str
    by_peer: bool
    pending: tuple[int, ...]


Event = Message | Closed


class ConnectionClosedError(Exception):
    """Sending on a closed connection."""


class Connection:
    def __init__(
        self, node_id: str, *, max_frame: int = DEFAULT_MAX_FRAME, partition: int | None = None
    ) -> None:
        """``partition``: this side is a leader's replication link for it (said in the hello)."""
        self.node_id = node_id
        self.state = State.HANDSHAKE
        self.peer: Hello | None = None
        self.close_code: CloseCode | None = None
        self._reader = FrameReader(max_frame)
        self._writer = FrameWriter()
        self._out = bytearray()
        self._events: list[Event] = []
        self._next_id = 1
        self._awaiting: set[int] = set()  # our requests without an answer yet
        self._unanswered: set[int] = set()  # the peer's requests we have not answered
        self._write(Hello(node_id, PROTOCOL_VERSION, partition))

    # Input ---------------------------------------------------------------------

    def receive_data(self, data: bytes) -> None:
        """Feed bytes from the socket (any split). Bytes after a close are ignored."""
        if self.state is State.CLOSED:
            return
        try:
            messages = self._reader.feed(data)
        except WireError as exc:
            self._fail(exc.code, exc.detail)
            return
        for message in messages:
            self._handle(message)
            if self.closed:
                return

    def receive_eof(self) -> None:
        """The peer closed its side (or the socket broke) without a Close frame."""
        if self.state is not State.CLOSED:
            self._closed(CloseCode.CONNECTION_LOST, "connection lost", by_peer=True)

    def events_received(self) -> list[Event]:
        events, self._events = self._events, []
        return events

    def data_to_send(self) -> bytes:
        out = bytes(self._out)
        self._out.clear()
        return out

    # Output --------------------------------------------------------------------

    def request(self, op: str, partition: int, epoch: Epoch, args: dict[str, Any] | None = None) -> int:
        """Send a request; return its id (the matching Reply or ErrorReply carries it)."""
        rid = self._next_id
        self._next_id += 1
        self._write(Request(rid, op, partition, epoch, args or {}))
        self._awaiting.add(rid)
        return rid

    def reply(self, request_id: int, result: Any = None) -> None:
        self._answer(request_id, Reply(request_id, result))

    def error(
        self,
        request_id: int,
        code: str,
        detail: str = "",
        *,
        epoch: Epoch = NO_EPOCH,
        leader: str | None = None,
    ) -> None:
        self._answer(request_id, ErrorReply(request_id, code, detail, epoch, leader))

    def replicate(
        self,
        partition: int,
        epoch: Epoch,
        entries: list[LogEntry],
        committed: Lsn,
        prev: tuple[Lsn, Epoch] = (NO_LSN, NO_EPOCH),
    ) -> None:
        self._write(Replicate(partition, epoch, tuple(entries), committed, *prev))

    def replicated(self, partition: int, epoch: Epoch, lsn: Lsn, code: str | None = None) -> None:
        self._write(Replicated(partition, epoch, lsn, code))

    def snapshot_chunk(
        self, partition: int, epoch: Epoch, offset: int, data: bytes, done: bool = False
    ) -> None:
        self._write(SnapshotChunk(partition, epoch, offset, data, done))

    def notify(self, partition: int, tenant: str, queue: str) -> None:
        """Wake the peer: messages of ``tenant``/``queue`` became visible on ``partition``."""
        self._write(Notify(partition, tenant, queue))

    def demand(self, demand: Demand) -> None:
        """Register a standing receive with the peer (a gateway to a partition's leader)."""
        self._write(demand)

    def withdraw(self, demand_id: int, partition: int) -> None:
        self._write(Withdraw(demand_id, partition))

    def deliver(self, demand_id: int, partition: int, tenant: str, queue: str, messages: list[Any]) -> None:
        """Hand the peer what a commit received for its demand ``demand_id``."""
        self._write(Delivery(demand_id, partition, tenant, queue, tuple(messages)))

    def report_events(self, partition: int, events: list[tuple[str, str, str, int]]) -> None:
        """Report message events of ``partition`` (dead-letter moves, expiries) to the peer."""
        self._write(Events(partition, tuple(events)))

    def close(self, code: CloseCode = CloseCode.NORMAL, detail: str = "") -> None:
        """Send a Close frame and stop; idempotent."""
        if self.state is not State.CLOSED:
            self._write(Close(code, detail))
            self._closed(code, detail, by_peer=False)

    @property
    def closed(self) -> bool:
        return self.state is State.CLOSED

    @property
    def pending_requests(self) -> frozenset[int]:
        return frozenset(self._awaiting)

    # Internals -------------------------------------------------------------------

    def _answer(self, request_id: int, message: Reply | ErrorReply) -> None:
        if request_id not in self._unanswered:
            # Our own bug, not the peer's: answering twice or inventing an id.
            raise ValueError(f"request {request_id} is not waiting for an answer")
        self._unanswered.discard(request_id)
        self._write(message)

    def _write(self, message: Message) -> None:
        if self.state is State.CLOSED:
            raise ConnectionClosedError(f"connection closed ({self.close_code})")
        self._out += self._writer.encode(message)

    def _handle(self, message: Message) -> None:
        if self.state is State.HANDSHAKE:
            if not isinstance(message, Hello):
                if isinstance(message, Close):
                    self._closed(message.code, message.detail, by_peer=True)
                    return
                self._fail(CloseCode.UNEXPECTED_FRAME, "the first frame must be a hello")
                return
            if message.version != PROTOCOL_VERSION:
                self._fail(
                    CloseCode.PROTOCOL_VERSION,
                    f"protocol version {message.version} is not {PROTOCOL_VERSION}",
                )
                return
            self.peer = message
            self.state = State.OPEN
            self._events.append(message)
            return
        match message:
            case Hello():
                self._fail(CloseCode.UNEXPECTED_FRAME, "a second hello")
            case Request():
                if message.id in self._unanswered:
                    self._fail(CloseCode.DUPLICATE_REQUEST, f"request {message.id} is already pending")
                    return
                self._unanswered.add(message.id)
                self._events.append(message)
            case Reply() | ErrorReply():
                if message.id not in self._awaiting:
                    self._fail(CloseCode.UNKNOWN_REQUEST, f"no request {message.id} is pending")
                    return
                self._awaiting.discard(message.id)
                self._events.append(message)
            case (
                Replicate()
                | Replicated()
                | SnapshotChunk()
                | Notify()
                | Demand()
                | Withdraw()
                | Delivery()
                | Events()
            ):
                self._events.append(message)
            case Close():
                self._closed(message.code, message.detail, by_peer=True)

    def _fail(self, code: CloseCode, detail: str) -> None:
        self._write(Close(code, detail))
        self._closed(code, detail, by_peer=False)

    def _closed(self, code: CloseCode, detail: str, *, by_peer: bool) -> None:
        self.state = State.CLOSED
        self.close_code = code
        self._events.append(Closed(code, detail, by_peer, tuple(sorted(self._awaiting))))
        self._awaiting.clear()
        self._unanswered.clear()
