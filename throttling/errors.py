"""Errors of the throttling package: one root, a stable ``code`` on each.

The gateway maps ``code`` to its problem documents; nothing here knows HTTP.
"""

from __future__ import annotations

from limits.errors import StorageError
from redis.exceptions import RedisError


class ThrottlingError(Exception):
    """Root of the package's errors."""

    code: str = "internal_error"

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class InvalidLimit(ThrottlingError):
    """A rate or URL that cannot be parsed (``100/second`` is the notation)."""

    code = "invalid_request"


class SharedStateUnavailable(ThrottlingError):
    """The shared store (Redis) is unreachable and the limiter fails closed."""

    code = "unavailable"


# Errors that mean "the shared store did not answer", not a bug (redis-py's own, ``limits``'
# wrapper of them for the moving-window strategy, and the socket's).
STORAGE_ERRORS: tuple[type[BaseException], ...] = (StorageError, RedisError, OSError, TimeoutError)
