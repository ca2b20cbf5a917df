"""Errors of the Pushgate client. Every one carries the server's stable ``code``.

Tree::

    PushgateError            code, detail, status (HTTP status or None)
    └── ConnectionEnded      a push connection closed: close_code, reconnect
"""

from __future__ import annotations

from typing import Any


class PushgateError(Exception):
    """An error the server answered with (a problem document or an error frame)."""

    def __init__(self, code: str, detail: str = "", status: int | None = None) -> None:
        super().__init__(f"{code}: {detail}" if detail else code)
        self.code = code
        self.detail = detail
        self.status = status

    @classmethod
    def from_problem(cls, status: int, doc: Any) -> PushgateError:
        if isinstance(doc, dict):
            return cls(str(doc.get("code", "error")), str(doc.get("detail", "")), status)
        return cls("error", f"HTTP {status}", status)


class ConnectionEnded(PushgateError):
    """The server closed a push connection and reconnecting would not help (or was off)."""

    def __init__(self, close_code: int, reason: str, reconnect: bool) -> None:
        super().__init__(_CODE_BY_CLOSE.get(close_code, "connection_closed"), reason)
        self.close_code = close_code
        self.reconnect = reconnect


_CODE_BY_CLOSE = {
    4001: "unauthorized",
    4003: "forbidden",
    4008: "policy",
    4400: "malformed",
    1009: "message_too_large",
    1001: "going_away",
}
