"""Stored records, encoded with msgpack as positional lists (compact, fast)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypeVar

import msgpack

from ..errors import Unavailable
from ..types import MessageId, QueueAttributes

R = TypeVar("R")


@dataclass(slots=True)
class QueueRecord:
    qid: int
    created_at: float
    attributes: dict[str, Any]
    next_seq: int = 1
    count: int = 0
    sent_total: int = 0
    acked_total: int = 0
    dead_lettered_total: int = 0
    # The attributes parsed, cached on the decoded record (not stored).
    parsed: QueueAttributes | None = field(default=None, compare=False)

    def encode(self) -> bytes:
        return pack(
            [
                self.qid,
                self.created_at,
                self.attributes,
                self.next_seq,
                self.count,
                self.sent_total,
                self.acked_total,
                self.dead_lettered_total,
            ]
        )

    @classmethod
    def decode(cls, raw: bytes) -> QueueRecord:
        return _decode(cls, raw, "queue record")

    @staticmethod
    def holds_attributes(raw: bytes, attributes: bytes) -> bool:
        """Whether the record ``raw`` stores ``attributes`` (the msgpack of a
        ``QueueAttributes.to_dict()``) byte for byte, read without decoding the record: a
        pool term's new leader checks every queue of its partition against its etcd record
        (False only says "decode it and compare")."""
        unpacker = msgpack.Unpacker()
        unpacker.feed(raw)
        try:
            unpacker.read_array_header()
            unpacker.skip()  # qid
            unpacker.skip()  # created_at
            start = unpacker.tell()
            unpacker.skip()
        except (ValueError, msgpack.OutOfData):
            return False
        return raw[start : unpacker.tell()] == attributes


@dataclass(slots=True)
class MessageRecord:
    """What a producer sent; written once, never rewritten (receives touch only the state).

    It also carries the message's *initial* delivery state (``sent_at``, ``group_id``,
    ``visible_ms``): a message has no ``state`` record until its state first changes (a
    written receive, a nack, a FIFO promotion, a move), and until then its state is the one
    :meth:`initial_state` builds from these. Records written before 2026-11-23 lack them
    (None) and always have a ``state`` record. docs/store.md, "How a message is stored".
    """

    id: MessageId
    body: bytes  # sealed when ``sealed``
    sealed: bool
    is_text: bool
    attributes: dict[str, str] = field(default_factory=dict)
    sent_at: float | None = None
    group_id: str | None = None
    visible_ms: int | None = None

    def encode(self) -> bytes:
        return pack(
            [
                self.id,
                self.body,
                self.sealed,
                self.is_text,
                self.attributes,
                self.sent_at,
                self.group_id,
                self.visible_ms,
            ]
        )

    @staticmethod
    def pack(
        packer: msgpack.Packer,
        id: str,
        body: bytes,
        sealed: bool,
        is_text: bool,
        attributes: dict[str, str],
        sent_at: float,
        group_id: str | None,
        visible_ms: int,
    ) -> bytes:
        """The encoding of a record, without building one (the send path writes many).

        ``packer``: one the calling thread keeps for itself (a Packer used again packs in
        about half the time of ``msgpack.packb``, which makes one per call; it is not
        thread-safe)."""
        out: bytes = packer.pack([id, body, sealed, is_text, attributes, sent_at, group_id, visible_ms])
        return out

    @classmethod
    def decode(cls, raw: bytes) -> MessageRecord:
        return _decode(cls, raw, "message record")

    @staticmethod
    def sent_at_of(raw: bytes) -> float | None:
        """The ``sent_at`` a stored record carries, without building the record (a queue's
        stats read its oldest message's; None: a record written before records carried it,
        or a damaged one, left for an operator)."""
        try:
            fields = msgpack.unpackb(raw)
        except (ValueError, TypeError):
            return None
        sent_at = fields[5] if isinstance(fields, list) and len(fields) > 5 else None
        return float(sent_at) if isinstance(sent_at, (int, float)) and not isinstance(sent_at, bool) else None

    def initial_state(self) -> DeliveryState:
        """The state of a message that has no ``state`` record: as its send left it."""
        if self.sent_at is None or self.visible_ms is None:
            # Written before records carried it: such a message always has a state record.
            raise Unavailable("message record without its initial state has no state record")
        return DeliveryState(self.sent_at, self.group_id, self.visible_ms, 0, None, "n", False, False)


@dataclass(slots=True)
class DeliveryState:
    """A message's small, changing part: kept apart so a receive or nack never copies the body."""

    sent_at: float
    group_id: str | None
    visible_ms: int
    receive_count: int = 0
    receipt_token: bytes | None = None
    # Kind of the visibility entry: "n" new or nacked (delayed when in the future), "i" in flight.
    kind: str = "n"
    # Moved here from another queue (dead-lettered): indexed in ``expiry`` for retention.
    moved: bool = False
    # Whether the message has a ``state`` record (not stored: a decoded state has one; the
    # initial state built from a message record has none, so deleting it is a write saved).
    stored: bool = field(default=True, compare=False)

    def encode(self) -> bytes:
        return pack(
            [
                self.sent_at,
                self.group_id,
                self.visible_ms,
                self.receive_count,
                self.receipt_token,
                self.kind,
                self.moved,
            ]
        )

    @classmethod
    def decode(cls, raw: bytes) -> DeliveryState:
        return _decode(cls, raw, "delivery state")


def _decode(cls: type[R], raw: bytes, what: str) -> R:
    """Build a record from its positional list; anything malformed is :class:`Unavailable`."""
    try:
        return cls(*msgpack.unpackb(raw))
    except (ValueError, TypeError) as exc:
        raise Unavailable(f"corrupt {what}: {exc}") from None


def pack(value: Any) -> bytes:
    out: bytes = msgpack.packb(value)
    return out


def unpack(raw: bytes) -> Any:
    try:
        return msgpack.unpackb(raw)
    except (ValueError, TypeError) as exc:
        raise Unavailable(f"corrupt record: {exc}") from None
