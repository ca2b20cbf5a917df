"""The JSON form of messages, shared by every transport (HTTP, long-poll, SSE, WebSocket).

Parsing turns a client's message object into a :class:`NewMessage`; encoding turns a
:class:`ReceivedMessage` into the object docs/api.md's ``receive`` returns. Pure functions.
"""

from __future__ import annotations

import base64
import binascii
import math
from typing import Any

import orjson

from backend_store.errors import InvalidRequest, PushgateError
from backend_store.limits import MAX_ATTRIBUTE_CHARS, MAX_ATTRIBUTES, MAX_BATCH, MAX_DELAY_S, MAX_ID_CHARS
from backend_store.types import NewMessage, ReceivedMessage

MESSAGE_FIELDS = frozenset({"body", "body_base64", "attributes", "group_id", "dedupe_id", "delay_s"})


def _optional_id(raw: dict[str, Any], name: str) -> str | None:
    value = raw.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_ID_CHARS:
        raise InvalidRequest(f"{name} must be a string of 1-{MAX_ID_CHARS} characters")
    return value


def parse_message(
    raw: Any, dedupe_id: str | None = None, allowed: frozenset[str] = MESSAGE_FIELDS
) -> NewMessage:
    """Validate one message object; ``dedupe_id`` (from ``Idempotency-Key``) fills a missing one.

    ``allowed``: the fields the object may have (a WebSocket ``send`` frame is the message
    object and its envelope, ``op``, ``id`` and ``queue``, which the caller reads)."""
    if not isinstance(raw, dict):
        raise InvalidRequest("a message must be an object")
    if not raw.keys() <= allowed:
        unknown = set(raw) - allowed
        raise InvalidRequest(f"unknown message field: {', '.join(sorted(unknown))}")
    if "body" in raw:
        if "body_base64" in raw:
            raise InvalidRequest("a message needs exactly one of body and body_base64")
        text = raw["body"]
        if not isinstance(text, str):
            raise InvalidRequest("body must be a string (use body_base64 for binary)")
        body, is_text = text.encode(), True
    elif "body_base64" in raw:
        if not isinstance(raw["body_base64"], str):
            raise InvalidRequest("body_base64 must be a base64 string")
        try:
            body = base64.b64decode(raw["body_base64"], validate=True)
        except (binascii.Error, ValueError):
            raise InvalidRequest("body_base64 is not valid base64") from None
        is_text = False
    else:
        raise InvalidRequest("a message needs exactly one of body and body_base64")
    attributes = raw.get("attributes") or {}
    if not isinstance(attributes, dict):
        raise InvalidRequest("attributes must be an object of strings")
    if attributes:
        if len(attributes) > MAX_ATTRIBUTES:
            raise InvalidRequest(f"at most {MAX_ATTRIBUTES} attributes")
        for key, value in attributes.items():
            if not isinstance(value, str) or not key or len(key) > 256 or len(value) > MAX_ATTRIBUTE_CHARS:
                raise InvalidRequest("attributes must map short non-empty names to strings")
    delay = raw.get("delay_s")
    if delay is not None and (
        isinstance(delay, bool)
        or not isinstance(delay, (int, float))
        or not math.isfinite(delay)
        or not 0 <= delay <= MAX_DELAY_S
    ):
        raise InvalidRequest(f"delay_s must be between 0 and {MAX_DELAY_S}")
    # Most messages have neither id: no call for them.
    group_id = None if raw.get("group_id") is None else _optional_id(raw, "group_id")
    own_dedupe_id = None if raw.get("dedupe_id") is None else _optional_id(raw, "dedupe_id")
    return NewMessage(body, is_text, attributes, group_id, own_dedupe_id or dedupe_id, delay)


def parse_send_body(
    raw: Any, idempotency_key: str | None = None
) -> tuple[list[NewMessage | PushgateError], bool]:
    """Parse a send request: one message, or ``{"messages": [...]}``.

    Returns the entries (a bad batch entry becomes its error, so the rest still go)
    and whether it was a batch. A bad single message raises.
    """
    if isinstance(raw, dict) and "messages" in raw:
        entries = raw["messages"]
        if set(raw) != {"messages"}:
            raise InvalidRequest("a batch has only the field messages")
        if not isinstance(entries, list) or not 1 <= len(entries) <= MAX_BATCH:
            raise InvalidRequest(f"messages must be a list of 1-{MAX_BATCH} messages")
        parsed: list[NewMessage | PushgateError] = []
        for entry in entries:
            try:
                parsed.append(parse_message(entry))
            except InvalidRequest as exc:
                parsed.append(exc)
        return parsed, True
    return [parse_message(raw, idempotency_key)], False


def message_to_json(message: ReceivedMessage) -> dict[str, Any]:
    """The message object of docs/api.md's ``receive``."""
    out: dict[str, Any] = {
        "id": message.id,
        "seq": message.seq,
        "receipt": message.receipt,
    }
    if message.is_text:
        out["body"] = message.body.decode()
    else:
        out["body_base64"] = base64.b64encode(message.body).decode()
    out["attributes"] = message.attributes
    out["group_id"] = message.group_id
    out["sent_at"] = message.sent_at
    out["receive_count"] = message.receive_count
    return out


def encode_message(message: ReceivedMessage) -> bytes:
    """``message_to_json`` serialized once, for transports that write bytes."""
    return orjson.dumps(message_to_json(message))
