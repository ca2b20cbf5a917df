"""Plain records the client hands back; decoding is the only work done here."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

from .errors import PushgateError


@dataclass(frozen=True, slots=True)
class Message:
    """A delivered message. ``body`` is text, or None for a binary one (see ``data``)."""

    queue: str
    id: str
    seq: int
    receipt: str
    body: str | None
    data: bytes
    attributes: dict[str, str] = field(default_factory=dict)
    group_id: str | None = None
    sent_at: float = 0.0
    receive_count: int = 1
    # SSE only: the event id, ``<stream-id>.<n>``.
    event_id: str | None = None

    @classmethod
    def from_json(cls, queue: str, doc: dict[str, Any], event_id: str | None = None) -> Message:
        if "body" in doc:
            body: str | None = doc["body"]
            data = doc["body"].encode()
        else:
            body, data = None, base64.b64decode(doc["body_base64"])
        return cls(
            queue=queue,
            id=doc["id"],
            seq=doc["seq"],
            receipt=doc["receipt"],
            body=body,
            data=data,
            attributes=doc.get("attributes") or {},
            group_id=doc.get("group_id"),
            sent_at=doc.get("sent_at", 0.0),
            receive_count=doc.get("receive_count", 1),
            event_id=event_id,
        )


@dataclass(frozen=True, slots=True)
class SendResult:
    id: str
    seq: int
    duplicate: bool = False

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> SendResult | PushgateError:
        if "error" in doc:
            error = doc["error"]
            return PushgateError(
                str(error.get("code", "error")), str(error.get("detail", "")), error.get("status")
            )
        return cls(doc["id"], doc["seq"], bool(doc.get("duplicate", False)))


def message_json(
    body: str | bytes,
    *,
    attributes: dict[str, str] | None = None,
    group_id: str | None = None,
    dedupe_id: str | None = None,
    delay_s: float | None = None,
) -> dict[str, Any]:
    """The JSON of one message to send; bytes go as ``body_base64``."""
    doc: dict[str, Any] = (
        {"body": body} if isinstance(body, str) else {"body_base64": base64.b64encode(body).decode()}
    )
    if attributes:
        doc["attributes"] = attributes
    if group_id is not None:
        doc["group_id"] = group_id
    if dedupe_id is not None:
        doc["dedupe_id"] = dedupe_id
    if delay_s is not None:
        doc["delay_s"] = delay_s
    return doc
