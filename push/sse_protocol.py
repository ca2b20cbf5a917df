"""Server-Sent Events framing for push streams, without I/O.

A stream is named by a random stream id; each delivery is event number ``n`` of it and
carries ``id: <stream-id>.<n>``, so a reconnecting client's ``Last-Event-ID`` says which
stream it read and how far. Message JSON from the codec has no raw newlines (orjson
escapes them inside strings), so each event is a single ``data:`` line.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Sequence

import orjson

from .close_codes import CloseCode

PING = b": ping\n\n"
_STREAM_ID = re.compile(r"^[A-Za-z0-9_-]{8,32}$")


def new_stream_id() -> str:
    """A fresh, unguessable stream id (it names in-flight messages a reconnect may release)."""
    return secrets.token_urlsafe(12)


def parse_last_event_id(value: str | None) -> tuple[str, int] | None:
    """Split a ``Last-Event-ID`` into its stream id and event number; None if it is not ours."""
    if not value:
        return None
    stream_id, dot, number = value.strip().rpartition(".")
    if not dot or not _STREAM_ID.match(stream_id) or not number.isdigit() or len(number) > 18:
        return None
    return stream_id, int(number)


class SseEncoder:
    """Encodes the events of one stream."""

    __slots__ = ("_id_prefix",)

    def __init__(self, stream_id: str) -> None:
        self._id_prefix = b"id: " + stream_id.encode() + b"."

    def opening(self, retry_ms: int) -> bytes:
        """``retry:`` once, at the start of the stream, with a ping so proxies flush headers."""
        return b"retry: %d\n\n" % retry_ms + PING

    def message(self, n: int, payload: bytes) -> bytes:
        return b"%s%d\nevent: message\ndata: %s\n\n" % (self._id_prefix, n, payload)

    def frames(self, payloads: Sequence[bytes], first_n: int) -> list[bytes]:
        """One event per message, numbered from ``first_n`` (the transport cuts chunks of them)."""
        message = self.message
        return [message(n, payload) for n, payload in enumerate(payloads, first_n)]

    @staticmethod
    def closing(code: CloseCode, reason: str) -> bytes:
        """A last ``close`` event saying why the server ended the stream and whether to come back."""
        data = orjson.dumps({"code": int(code), "reason": reason, "reconnect": code.reconnect})
        return b"event: close\ndata: " + data + b"\n\n"
