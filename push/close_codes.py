"""WebSocket close codes of docs/api.md, as data: what each means and whether a client should reconnect.

SSE has no close codes; a stream that ends for one of these reasons simply ends, and the
client's ``EventSource`` reconnects unless the response said otherwise.
"""

from __future__ import annotations

from enum import IntEnum

from backend_store.errors import PushgateError


class CloseCode(IntEnum):
    """Close codes Pushgate sends. ``reconnect`` says whether a client should try again."""

    NORMAL = 1000
    GOING_AWAY = 1001
    MESSAGE_TOO_BIG = 1009
    INTERNAL_ERROR = 1011
    AUTH_FAILED = 4001
    FORBIDDEN = 4003
    POLICY = 4008
    MALFORMED = 4400

    @property
    def reconnect(self) -> bool:
        """Whether reconnecting (with backoff) can help; see :data:`RECONNECT`."""
        return RECONNECT[self]

    @property
    def description(self) -> str:
        return DESCRIPTIONS[self]


# A client that reconnects after an auth or scope failure would only fail again (and
# hammer the server), so those need new credentials first; so does a client that sent
# something malformed or too big, which would do it again. Going away, policy (slow
# consumer: the buffer is gone after a reconnect) and internal errors are transient.
RECONNECT: dict[CloseCode, bool] = {
    CloseCode.NORMAL: False,
    CloseCode.GOING_AWAY: True,
    CloseCode.MESSAGE_TOO_BIG: False,
    CloseCode.INTERNAL_ERROR: True,
    CloseCode.AUTH_FAILED: False,
    CloseCode.FORBIDDEN: False,
    CloseCode.POLICY: True,
    CloseCode.MALFORMED: False,
}

DESCRIPTIONS: dict[CloseCode, str] = {
    CloseCode.NORMAL: "normal closure",
    CloseCode.GOING_AWAY: "server going away (shutdown); reconnect, possibly to another gateway",
    CloseCode.MESSAGE_TOO_BIG: "a frame was larger than the server accepts",
    CloseCode.INTERNAL_ERROR: "unexpected server error",
    CloseCode.AUTH_FAILED: "authentication failed, timed out or the token expired; get a new token",
    CloseCode.FORBIDDEN: "origin not allowed or the token lacks the scope for a queue",
    CloseCode.POLICY: "policy: slow consumer (not reading, or messages timed out unacked) or abuse",
    CloseCode.MALFORMED: "a frame was not a valid pushgate.v1 frame",
}

# Error codes (the strings of docs/api.md's table) that end a connection rather than one
# request, and the close code each ends it with. The one such mapping, for WS and SSE.
CLOSE_CODE_BY_ERROR: dict[str, CloseCode] = {
    "unauthorized": CloseCode.AUTH_FAILED,
    "forbidden": CloseCode.FORBIDDEN,
    "rate_limited": CloseCode.POLICY,
    "invalid_request": CloseCode.MALFORMED,
    "unavailable": CloseCode.GOING_AWAY,
}


def close_code_for(exc: PushgateError, default: CloseCode = CloseCode.INTERNAL_ERROR) -> CloseCode:
    """The close code that ends a connection because of ``exc``."""
    return CLOSE_CODE_BY_ERROR.get(exc.code, default)


def should_reconnect(code: int) -> bool:
    """Whether a client should reconnect after a close with ``code`` (unknown codes: yes, with backoff)."""
    try:
        return CloseCode(code).reconnect
    except ValueError:
        # 1005/1006 (no close frame, connection lost) and other transient codes.
        return code not in (1002, 1003, 1007, 1008, 1010)
