"""Errors raised by the store.

Every error carries a stable ``code`` (the strings of API.md's error table).
The gateway maps codes to HTTP statuses and WebSocket close codes in one place;
the store knows nothing of either.

Tree::

    StoreError
    ├── InvalidRequest        invalid_request
    ├── InvalidReceipt        invalid_receipt
    ├── QueueNotFound         queue_not_found
    ├── NotFound              not_found
    ├── QueueExists           queue_exists
    ├── QueueFull             queue_full
    ├── QuotaExceeded         quota_exceeded
    ├── MessageTooLarge       message_too_large
    ├── Unavailable           unavailable      (map or disk full, corrupt record, no leader)
    └── ConfigurationError    configuration_error (start-up only: bad key file, wrong key)
"""

from __future__ import annotations


class StoreError(Exception):
    """Root of every error the store raises on purpose."""

    code: str = "internal_error"

    def __init__(self, detail: str = "") -> None:
        super().__init__(detail or self.code)
        self.detail = detail or self.code

    def __reduce__(self) -> tuple[type[StoreError], tuple[str]]:
        # Keeps errors picklable with their detail (node processes ship them).
        return (type(self), (self.detail,))


class InvalidRequest(StoreError):
    code = "invalid_request"


class InvalidReceipt(StoreError):
    code = "invalid_receipt"


class QueueNotFound(StoreError):
    code = "queue_not_found"


class NotFound(StoreError):
    code = "not_found"


class QueueExists(StoreError):
    code = "queue_exists"


class QueueFull(StoreError):
    code = "queue_full"


class QuotaExceeded(StoreError):
    code = "quota_exceeded"


class MessageTooLarge(StoreError):
    code = "message_too_large"


class Unavailable(StoreError):
    """The store cannot take writes right now; clients should retry later."""

    code = "unavailable"


class ConfigurationError(StoreError):
    """The store cannot start as configured (a missing or wrong encryption key, a bad URL)."""

    code = "configuration_error"


ERRORS_BY_CODE: dict[str, type[StoreError]] = {
    cls.code: cls
    for cls in (
        InvalidRequest,
        InvalidReceipt,
        QueueNotFound,
        NotFound,
        QueueExists,
        QueueFull,
        QuotaExceeded,
        MessageTooLarge,
        Unavailable,
        ConfigurationError,
    )
}


def error_from_code(code: str, detail: str) -> StoreError:
    """Rebuild an error from its wire form (used by remote backends)."""
    return ERRORS_BY_CODE.get(code, StoreError)(detail)
