"""What push/ needs of an authenticated caller, structurally (``gateway.auth.Principal`` fits).

push/ never imports gateway/: the handlers get an ``authenticate`` callable, an origin
check and a ``recheck`` callable by injection.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Hashable
from typing import Literal, Protocol

from backend_store.errors import PushgateError
from backend_store.types import TenantId

Action = Literal["send", "receive", "admin"]


class PrincipalLike(Hashable, Protocol):
    """An authenticated caller: a tenant, an optional expiry and a scope check."""

    @property
    def tenant(self) -> TenantId: ...

    @property
    def expires_at(self) -> float | None: ...

    def can(self, action: Action, queue: str | None = None) -> bool: ...


# Turns a bearer token into a principal; raises Unauthorized (or another PushgateError).
Authenticate = Callable[[str], Awaitable[PrincipalLike]]

# Whether a browser ``Origin`` may connect for a principal's tenant; the third argument is
# the request's ``Host`` header (a page of the gateway's own origin is allowed).
CheckOrigin = Callable[[PrincipalLike, str, str | None], Awaitable[bool]]

Operation = Literal["send", "receive", "connect"]

# Counts one request of a principal against its rate limits (``queue``: None for a
# connection): returns when allowed, raises a PushgateError (``rate_limited`` with
# ``retry_after_s``) when refused. The gateway's throttling provides it. It returns None
# when no rule counts the request (decided from cached limits, without awaiting: the
# common case, checked once per WebSocket frame), else an awaitable that does the counting.
RateCheck = Callable[[PrincipalLike, Operation, str | None], Awaitable[object] | None]

# Checks the credentials of open connections again (a revoked API key, a removed JWT
# key): for each principal, the principal as it now stands, or the error that ends it.
Recheck = Callable[[Collection[PrincipalLike]], Awaitable[dict[PrincipalLike, PrincipalLike | PushgateError]]]
