"""What push/ needs of an authenticated caller, structurally (``gateway.auth.Principal`` fits).

push/ never imports gateway/: the handlers get an ``authenticate`` callable, an origin
check and a ``recheck`` callable by injection.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Hashable, MutableMapping
from typing import Any, Literal, Protocol

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

# The ASGI scope entry where an outer layer that verified a request's bearer token (the
# gateway's CORS middleware, for browser requests) leaves ``(token, principal or error)``,
# so the route or handler does not verify the same token again.
AUTHENTICATED = "pushgate.authenticated"


def note_authenticated(
    scope: MutableMapping[str, Any], token: str, outcome: PrincipalLike | PushgateError
) -> None:
    scope[AUTHENTICATED] = (token, outcome)


async def authenticate_once(
    scope: MutableMapping[str, Any], token: str, authenticate: Authenticate
) -> PrincipalLike:
    """``authenticate(token)``, unless an outer layer verified this token for this request
    already: then its principal (or its refusal, raised)."""
    noted = scope.get(AUTHENTICATED)
    if noted is not None and noted[0] == token:
        outcome = noted[1]
        if isinstance(outcome, PushgateError):
            raise outcome
        principal: PrincipalLike = outcome
        return principal
    return await authenticate(token)


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
