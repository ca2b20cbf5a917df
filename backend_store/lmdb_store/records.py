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


@dataclass(slots=True)
class MessageRecord:
    """What a producer sent; written once, never rewritten (receives touch only the state)."""

    id: MessageId
    body: bytes  # sealed when ``sealed``
    sealed: bool
    is_text: bool
    attributes: dict[str, str] = field(default_factory=dict)

    def encode(self) -> bytes:
        return MessageRecord.pack(self.id, self.body, self.sealed, self.is_text, self.attributes)

    @staticmethod
    def pack(id: str, body: bytes, sealed: bool, is_text: bool, attributes: dict[str, str]) -> bytes:
        """The encoding of a record, without building one (the send path writes many)."""
        return pack([id, body, sealed, is_text, attributes])

    @classmethod
    def decode(cls, raw: bytes) -> MessageRecord:
        return _decode(cls, raw, "message record")


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
