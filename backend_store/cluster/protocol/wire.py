"""The node protocol's messages and frames, without I/O.

A frame is a 4-byte big-endian length followed by that many bytes of msgpack: one array
``[kind, field, ...]`` per message. Backend nodes, gateways and the manager speak it over
persistent TCP connections. :class:`FrameReader` turns bytes (in any split) into
messages; :func:`encode` turns a message into a frame. Neither touches a socket, so every
rule here is tested by feeding bytes.

Messages:

- :class:`Hello`: the first frame each side sends (node id, protocol version, and for a
  leader's replication link the partition it replicates: the follower's node routes the
  connection by it).
- :class:`Request` / :class:`Reply` / :class:`ErrorReply`: a Backend operation on one
  partition, tagged with the epoch the sender believes current, and its outcome. Errors
  carry a stable ``code`` (the store's codes plus ``not_leader``) and, for ``not_leader``
  and ``stale_epoch``, the epoch and leader the node knows, so the sender refreshes at once.
- :class:`Replicate` / :class:`Replicated`: a leader's batch of log entries for one
  partition, tagged with its epoch and the (LSN, epoch) of the entry before them, and the
  follower's acknowledgement of the LSN it has fsynced (or its refusal, with a code:
  ``stale_epoch``, ``replication_gap``).
- :class:`SnapshotChunk`: part of a consistent copy of a partition replica, streamed by a
  leader to re-seed a follower whose missing entries it has trimmed.
- :class:`Close`: the sender is closing the connection, with a :class:`CloseCode`.
- :class:`Notify`: a node's wake-up to a connected gateway: a commit made messages of a
  queue visible on a partition the node leads (WebSocket delivery stays push).
- :class:`Demand` / :class:`Withdraw` / :class:`Delivery`: a gateway's standing receive on a
  partition (an idle push dispatcher's "receive for me in the commit of the next send"), its
  withdrawal, and the node's unsolicited answer carrying the messages that commit received.
  One-way frames: a demand is soft state, never answered (docs/cluster.md, section 9).
- :class:`Events`: dead-letter moves and expiries a partition's commits made, reported by the
  node to one gateway connection (the one that last received from the queue there).

A frame that cannot be a message raises :class:`WireError` with the close code the
connection must send (:class:`~backend_store.cluster.protocol.connection.Connection` does).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum, StrEnum
from typing import Any

import msgpack

from ...types import Epoch, LogEntry, Lsn

# 2: Demand, Withdraw and Delivery (standing receives), Events. Peers of another version refuse
# each other at the hello (``protocol_version``): upgrade nodes and gateways together.
PROTOCOL_VERSION = 2
HEADER = struct.Struct(">I")
DEFAULT_MAX_FRAME = 16 * 1024 * 1024
NO_EPOCH = Epoch(0)
NO_LSN = Lsn(0)


class CloseCode(StrEnum):
    """Why a connection was closed. Every code but ``protocol_version`` may be retried
    on a new connection; the wire-level ones mean a bug or a stranger on the port."""

    NORMAL = "normal"  # an orderly close (shutdown, drain)
    CONNECTION_LOST = "connection_lost"  # EOF or a socket error, no Close frame
    FRAME_TOO_LARGE = "frame_too_large"  # a length over the receiver's limit
    MALFORMED_FRAME = "malformed_frame"  # not msgpack, or not a known message
    UNEXPECTED_FRAME = "unexpected_frame"  # a message the state does not allow
    UNKNOWN_REQUEST = "unknown_request"  # a reply to a request id that is not pending
    DUPLICATE_REQUEST = "duplicate_request"  # a request id already pending
    PROTOCOL_VERSION = "protocol_version"  # the peer speaks another version: do not retry


class WireError(Exception):
    """The byte stream is broken; the connection closes with ``code``."""

    def __init__(self, code: CloseCode, detail: str) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail


class Kind(IntEnum):
    HELLO = 1
    REQUEST = 2
    REPLY = 3
    ERROR = 4
    REPLICATE = 5
    REPLICATED = 6
    CLOSE = 7
    SNAPSHOT = 8
    NOTIFY = 9
    DEMAND = 10
    WITHDRAW = 11
    DELIVERY = 12
    EVENTS = 13


@dataclass(frozen=True, slots=True)
class Hello:
    node_id: str
    version: int = PROTOCOL_VERSION
    # Set by a leader's replication link: the partition it replicates (None: a client).
    partition: int | None = None


@dataclass(frozen=True, slots=True)
class Request:
    id: int
    op: str
    partition: int
    epoch: Epoch
    args: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Reply:
    id: int
    result: Any = None


@dataclass(frozen=True, slots=True)
class ErrorReply:
    id: int
    code: str
    detail: str = ""
    # What the answering node knows of the partition (0 / None: nothing useful).
    epoch: Epoch = NO_EPOCH
    leader: str | None = None


@dataclass(frozen=True, slots=True)
class Replicate:
    partition: int
    epoch: Epoch
    entries: tuple[LogEntry, ...]
    # The highest LSN a majority has acknowledged (followers learn what is safe to serve).
    committed: Lsn = NO_LSN
    # The entry just before ``entries`` in the leader's log (log matching, as in Raft): a
    # follower whose entry at ``prev_lsn`` has another epoch has diverged. Epoch 0: not checked.
    prev_lsn: Lsn = NO_LSN
    prev_epoch: Epoch = NO_EPOCH


@dataclass(frozen=True, slots=True)
class Replicated:
    partition: int
    # The follower's epoch (its fence) and the LSN it has fsynced.
    epoch: Epoch
    lsn: Lsn
    # None: an acknowledgement; otherwise why the batch was refused.
    code: str | None = None


@dataclass(frozen=True, slots=True)
class Close:
    code: CloseCode
    detail: str = ""


@dataclass(frozen=True, slots=True)
class SnapshotChunk:
    """Part of a consistent copy of a partition replica, for re-seeding a follower.

    Chunks come in order; the one with ``done`` carries no data and ends the copy.
    """

    partition: int
    epoch: Epoch
    offset: int
    data: bytes
    done: bool = False


@dataclass(frozen=True, slots=True)
class Notify:
    """A wake-up: a commit on ``partition`` made messages of ``tenant``/``queue`` visible."""

    partition: int
    tenant: str
    queue: str


@dataclass(frozen=True, slots=True)
class Demand:
    """A gateway's standing receive on ``partition``: the next commit that makes messages of
    ``tenant``/``queue`` visible also receives up to ``max_messages`` of them for it.

    ``id`` is the gateway's (one registration may span several partitions, each its own
    frame with the same id); ``epoch`` is the leader's term as the gateway knows it. A new
    demand for the same queue on the same partition replaces the old one, whoever sent it.
    """

    id: int
    partition: int
    epoch: Epoch
    tenant: str
    queue: str
    max_messages: int
    visibility_timeout_s: float | None = None


@dataclass(frozen=True, slots=True)
class Withdraw:
    """The gateway no longer wants demand ``id`` on ``partition`` (ignored if already served)."""

    id: int
    partition: int


@dataclass(frozen=True, slots=True)
class Delivery:
    """What a commit received for demand ``id``, sent once that commit is replicated.

    ``messages`` are received-message records as the ``receive`` op encodes them
    (:mod:`.ops`); the receipts are the partition's own. Also a wake-up for the queue.
    """

    id: int
    partition: int
    tenant: str
    queue: str
    messages: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class Events:
    """Message events of commits on ``partition``: ``(tenant, queue, kind, count)`` each
    (``kind`` as :class:`~backend_store.backend.MessageEvent` has it)."""

    partition: int
    events: tuple[tuple[str, str, str, int], ...]


Message = (
    Hello
    | Request
    | Reply
    | ErrorReply
    | Replicate
    | Replicated
    | Close
    | SnapshotChunk
    | Notify
    | Demand
    | Withdraw
    | Delivery
    | Events
)


def encode(message: Message) -> bytes:
    """One frame: the length header and the message as a msgpack array."""
    return FrameWriter().encode(message)


class FrameWriter:
    """Messages in, frames out; one per connection (it reuses its msgpack packer, which
    costs about half of what ``packb``'s new packer per frame does)."""

    def __init__(self) -> None:
        self._packer = msgpack.Packer(use_bin_type=True)

    def encode(self, message: Message) -> bytes:
        body: bytes = self._packer.pack(_to_list(message))
        return HEADER.pack(len(body)) + body


def _to_list(message: Message) -> list[Any]:
    match message:
        case Hello():
            return [Kind.HELLO, message.node_id, message.version, message.partition]
        case Request():
            return [Kind.REQUEST, message.id, message.op, message.partition, message.epoch, message.args]
        case Reply():
            return [Kind.REPLY, message.id, message.result]
        case ErrorReply():
            return [Kind.ERROR, message.id, message.code, message.detail, message.epoch, message.leader]
        case Replicate():
            entries = [[e.lsn, e.epoch, e.record] for e in message.entries]
            return [
                Kind.REPLICATE,
                message.partition,
                message.epoch,
                entries,
                message.committed,
                message.prev_lsn,
                message.prev_epoch,
            ]
        case Replicated():
            return [Kind.REPLICATED, message.partition, message.epoch, message.lsn, message.code]
        case Close():
            return [Kind.CLOSE, str(message.code), message.detail]
        case SnapshotChunk():
            return [
                Kind.SNAPSHOT,
                message.partition,
                message.epoch,
                message.offset,
                message.data,
                message.done,
            ]
        case Notify():
            return [Kind.NOTIFY, message.partition, message.tenant, message.queue]
        case Demand():
            return [
                Kind.DEMAND,
                message.id,
                message.partition,
                message.epoch,
                message.tenant,
                message.queue,
                message.max_messages,
                message.visibility_timeout_s,
            ]
        case Withdraw():
            return [Kind.WITHDRAW, message.id, message.partition]
        case Events():
            return [Kind.EVENTS, message.partition, [list(e) for e in message.events]]
        case Delivery():
            return [
                Kind.DELIVERY,
                message.id,
                message.partition,
                message.tenant,
                message.queue,
                list(message.messages),
            ]


class FrameReader:
    """Bytes in, messages out. After a :class:`WireError` the stream is unusable."""

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        self.max_frame = max_frame
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[Message]:
        """Add received bytes; return every message now complete, in order."""
        self._buffer += data
        out: list[Message] = []
        while len(self._buffer) >= HEADER.size:
            (length,) = HEADER.unpack_from(self._buffer)
            if length > self.max_frame:
                # Refused from the header alone: never buffer what we will not take.
                raise WireError(
                    CloseCode.FRAME_TOO_LARGE, f"frame of {length} bytes over the limit of {self.max_frame}"
                )
            end = HEADER.size + length
            if len(self._buffer) < end:
                break
            body = bytes(self._buffer[HEADER.size : end])
            del self._buffer[:end]
            out.append(decode_body(body))
        return out

    @property
    def buffered(self) -> int:
        return len(self._buffer)


def decode_body(body: bytes) -> Message:
    """Parse one frame's body; anything but a well-formed message is ``malformed_frame``."""
    try:
        value = msgpack.unpackb(body, raw=False, strict_map_key=True)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise WireError(CloseCode.MALFORMED_FRAME, f"not msgpack: {type(exc).__name__}") from None
    if not isinstance(value, list) or not value or not _is_int(value[0]):
        raise WireError(CloseCode.MALFORMED_FRAME, "a frame must be an array starting with its kind")
    try:
        kind = Kind(value[0])
    except ValueError:
        raise WireError(CloseCode.MALFORMED_FRAME, f"unknown message kind {value[0]}") from None
    parse = _PARSERS[kind]
    try:
        return parse(value[1:])
    except (ValueError, TypeError) as exc:
        raise WireError(CloseCode.MALFORMED_FRAME, f"bad {kind.name.lower()} message: {exc}") from None


# Parsing: each field checked, so a peer's bug stops at the wire and not deep in a handler.


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _int(v: Any, minimum: int = 0) -> int:
    if not _is_int(v) or v < minimum:
        raise ValueError(f"expected an integer >= {minimum}, got {type(v).__name__}")
    result: int = v
    return result


def _str(v: Any) -> str:
    if not isinstance(v, str):
        raise ValueError(f"expected a string, got {type(v).__name__}")
    return v


def _opt_str(v: Any) -> str | None:
    return None if v is None else _str(v)


def _fields(values: list[Any], count: int) -> list[Any]:
    if len(values) != count:
        raise ValueError(f"expected {count} fields, got {len(values)}")
    return values


def _hello(v: list[Any]) -> Hello:
    node_id, version, partition = _fields(v, 3)
    return Hello(_str(node_id), _int(version), None if partition is None else _int(partition))


def _request(v: list[Any]) -> Request:
    rid, op, partition, epoch, args = _fields(v, 5)
    if not isinstance(args, dict):
        raise ValueError("args must be a map")
    return Request(_int(rid), _str(op), _int(partition), Epoch(_int(epoch)), args)


def _reply(v: list[Any]) -> Reply:
    rid, result = _fields(v, 2)
    return Reply(_int(rid), result)


def _error(v: list[Any]) -> ErrorReply:
    rid, code, detail, epoch, leader = _fields(v, 5)
    return ErrorReply(_int(rid), _str(code), _str(detail), Epoch(_int(epoch)), _opt_str(leader))


def _entry(v: Any) -> LogEntry:
    if not isinstance(v, list):
        raise ValueError("a log entry must be an array")
    lsn, epoch, record = _fields(v, 3)
    if not isinstance(record, bytes):
        raise ValueError("a log entry's record must be bytes")
    return LogEntry(Lsn(_int(lsn, 1)), Epoch(_int(epoch)), record)


def _replicate(v: list[Any]) -> Replicate:
    partition, epoch, entries, committed, prev_lsn, prev_epoch = _fields(v, 6)
    if not isinstance(entries, list):
        raise ValueError("entries must be an array")
    parsed = tuple(_entry(e) for e in entries)
    return Replicate(
        _int(partition),
        Epoch(_int(epoch)),
        parsed,
        Lsn(_int(committed)),
        Lsn(_int(prev_lsn)),
        Epoch(_int(prev_epoch)),
    )


def _replicated(v: list[Any]) -> Replicated:
    partition, epoch, lsn, code = _fields(v, 4)
    return Replicated(_int(partition), Epoch(_int(epoch)), Lsn(_int(lsn)), _opt_str(code))


def _close(v: list[Any]) -> Close:
    code, detail = _fields(v, 2)
    return Close(CloseCode(_str(code)), _str(detail))


def _snapshot(v: list[Any]) -> SnapshotChunk:
    partition, epoch, offset, data, done = _fields(v, 5)
    if not isinstance(data, bytes) or not isinstance(done, bool):
        raise ValueError("a snapshot chunk carries bytes and a done flag")
    return SnapshotChunk(_int(partition), Epoch(_int(epoch)), _int(offset), data, done)


def _notify(v: list[Any]) -> Notify:
    partition, tenant, queue = _fields(v, 3)
    return Notify(_int(partition), _str(tenant), _str(queue))


def _demand(v: list[Any]) -> Demand:
    rid, partition, epoch, tenant, queue, max_messages, timeout = _fields(v, 7)
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int | float)):
        raise ValueError("a demand's visibility timeout must be a number or nil")
    return Demand(
        _int(rid),
        _int(partition),
        Epoch(_int(epoch)),
        _str(tenant),
        _str(queue),
        _int(max_messages, 1),
        None if timeout is None else float(timeout),
    )


def _withdraw(v: list[Any]) -> Withdraw:
    rid, partition = _fields(v, 2)
    return Withdraw(_int(rid), _int(partition))


def _delivery(v: list[Any]) -> Delivery:
    rid, partition, tenant, queue, messages = _fields(v, 5)
    if not isinstance(messages, list) or not all(isinstance(m, list) for m in messages):
        raise ValueError("a delivery's messages must be an array of records")
    return Delivery(_int(rid), _int(partition), _str(tenant), _str(queue), tuple(messages))


def _events(v: list[Any]) -> Events:
    partition, events = _fields(v, 2)
    if not isinstance(events, list):
        raise ValueError("events must be an array")
    parsed = []
    for event in events:
        if not isinstance(event, list):
            raise ValueError("an event must be an array")
        tenant, queue, kind, count = _fields(event, 4)
        parsed.append((_str(tenant), _str(queue), _str(kind), _int(count, 1)))
    return Events(_int(partition), tuple(parsed))


_PARSERS: dict[Kind, Callable[[list[Any]], Message]] = {
    Kind.HELLO: _hello,
    Kind.REQUEST: _request,
    Kind.REPLY: _reply,
    Kind.ERROR: _error,
    Kind.REPLICATE: _replicate,
    Kind.REPLICATED: _replicated,
    Kind.CLOSE: _close,
    Kind.SNAPSHOT: _snapshot,
    Kind.NOTIFY: _notify,
    Kind.DEMAND: _demand,
    Kind.WITHDRAW: _withdraw,
    Kind.DELIVERY: _delivery,
    Kind.EVENTS: _events,
}
