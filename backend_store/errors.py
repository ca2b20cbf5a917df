"""Every error Pushgate raises on purpose, under one root.

The root lives here, in the bottom layer, because every part may import
``backend_store`` (DESIGN.md): the store, push and the gateway raise the same classes.
Each error carries a stable ``code`` (the strings of docs/api.md's error table) and a
client-safe ``detail``; ``retry_after_s`` says when trying again may help. The store
knows nothing of HTTP or WebSocket: ``gateway/errors.py`` maps codes to HTTP statuses
and ``push/close_codes.py`` maps the few that end a connection to close codes.

Tree::

    PushgateError             (root; never raised itself)
    ├── InvalidRequest        invalid_request
    ├── InvalidReceipt        invalid_receipt
    ├── Unauthorized          unauthorized
    ├── Forbidden             forbidden
    ├── NotFound              not_found
    ├── QueueNotFound         queue_not_found
    ├── QueueExists           queue_exists
    ├── QueueFull             queue_full
    ├── QuotaExceeded         quota_exceeded
    ├── MessageTooLarge       message_too_large
    ├── RateLimited           rate_limited      (retry_after_s: when the limit allows again)
    ├── Unavailable           unavailable       (map or disk full, corrupt record, no leader)
    │   └── ReplicationGap    replication_gap   (a replica cannot take these log entries: resend or re-seed)
    ├── StaleEpoch            stale_epoch       (fenced: a newer partition leader exists)
    └── ConfigurationError    configuration_error (start-up only: bad key file, wrong key)

The gateway adds three HTTP-only codes in ``gateway/errors.py`` (method_not_allowed,
request_too_large, unsupported_media_type), under the same root.
"""

from __future__ import annotations


class PushgateError(Exception):
    """Root of every error raised on purpose: a stable ``code``, a client-safe ``detail``."""

    code: str = "internal_error"
    # Seconds after which a retry may succeed (HTTP Retry-After, WS ``retry_after_s``).
    retry_after_s: float | None = None

    def __init__(self, detail: str = "") -> None:
        super().__init__(detail or self.code)
        self.detail = detail or self.code

    def __reduce__(self) -> tuple[type[PushgateError], tuple[str]]:
        # Keeps errors picklable with their detail (node processes ship them).
        return (type(self), (self.detail,))


class InvalidRequest(PushgateError):
    code = "invalid_request"


class InvalidReceipt(PushgateError):
    code = "invalid_receipt"


class Unauthorized(PushgateError):
    code = "unauthorized"


class Forbidden(PushgateError):
    code = "forbidden"


class NotFound(PushgateError):
    code = "not_found"


class QueueNotFound(PushgateError):
    code = "queue_not_found"


class QueueExists(PushgateError):
    code = "queue_exists"


class QueueFull(PushgateError):
    code = "queue_full"


class QuotaExceeded(PushgateError):
    code = "quota_exceeded"


class MessageTooLarge(PushgateError):
    code = "message_too_large"


class RateLimited(PushgateError):
    """Past a rate limit; ``retry_after_s`` says when the limit allows the next one."""

    code = "rate_limited"

    def __init__(self, detail: str = "", retry_after_s: float = 1.0) -> None:
        super().__init__(detail)
        self.retry_after_s = retry_after_s

    def __reduce__(self) -> tuple[type[PushgateError], tuple[str]]:
        return (type(self), (self.detail,))


class Unavailable(PushgateError):
    """The store cannot take writes right now; clients should retry later."""

    code = "unavailable"
    retry_after_s = 1.0


class ReplicationGap(Unavailable):
    """Replicated entries do not follow this replica's log (or were trimmed from the leader's).

    The sender resends from the replica's last LSN, or re-seeds it from a snapshot.
    """

    code = "replication_gap"


class StaleEpoch(PushgateError):
    """Fencing: the request or batch carries an older epoch than this replica has seen."""

    code = "stale_epoch"


class ConfigurationError(PushgateError):
    """The store cannot start as configured (a missing or wrong encryption key, a bad URL)."""

    code = "configuration_error"
    retry_after_s = 1.0


ERRORS_BY_CODE: dict[str, type[PushgateError]] = {
    cls.code: cls
    for cls in (
        InvalidRequest,
        InvalidReceipt,
        Unauthorized,
        Forbidden,
        NotFound,
        QueueNotFound,
        QueueExists,
        QueueFull,
        QuotaExceeded,
        MessageTooLarge,
        RateLimited,
        Unavailable,
        ReplicationGap,
        StaleEpoch,
        ConfigurationError,
    )
}


def error_from_code(code: str, detail: str) -> PushgateError:
    """Rebuild an error from its wire form (used by remote backends)."""
    return ERRORS_BY_CODE.get(code, PushgateError)(detail)
