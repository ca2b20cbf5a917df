"""What push/ needs of an authenticated caller, structurally (``gateway.auth.Principal`` fits).

push/ never imports gateway/: the WebSocket and SSE handlers get an ``authenticate``
callable and, optionally, an origin check by injection.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Literal, Protocol

from backend_store.types import TenantId

Action = Literal["send", "receive", "admin"]


class PrincipalLike(Protocol):
    """An authenticated caller: a tenant, an optional expiry and a scope check."""

    @property
    def tenant(self) -> TenantId: ...

    @property
    def expires_at(self) -> float | None: ...

    def can(self, action: Action, queue: str | None = None) -> bool: ...


# Turns a bearer token into a principal; raises an exception with ``code`` "unauthorized"
# (or any other code) when the token is bad.
Authenticate = Callable[[str], Awaitable[PrincipalLike]]

# Whether a browser ``Origin`` may connect for a principal's tenant.
CheckOrigin = Callable[[PrincipalLike, str], Awaitable[bool]]


class AccessError(Exception):
    """push/'s own refusals (a missing token, a missing scope), with a stable ``code``."""

    code = "unauthorized"

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class MissingToken(AccessError):
    code = "unauthorized"


class MissingScope(AccessError):
    code = "forbidden"


def error_code(exc: BaseException, default: str = "internal_error") -> str:
    """The stable ``code`` of a store or gateway error (they all carry one)."""
    code = getattr(exc, "code", None)
    return code if isinstance(code, str) else default


def error_detail(exc: BaseException) -> str:
    """The client-safe text of an error with a code; never the text of an unexpected one."""
    detail = getattr(exc, "detail", None)
    if isinstance(detail, str) and hasattr(exc, "code"):
        return detail
    return "internal error"
