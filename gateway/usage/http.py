"""Usage of HTTP requests: who a request is billed to, and its failures by code.

:func:`~gateway.routes.access.queue_access` notes the (tenant, queue) of a request once
it is authorized, in the ASGI scope; when the handler then fails, the
:class:`~gateway.routes.endpoint.Endpoint` records the failure under that tenant and
queue with the error's code. A request that fails before (no token, a bad queue name)
has nobody to bill: it is only in the Prometheus metrics.
"""

from __future__ import annotations

from collections.abc import Awaitable

from starlette.types import Scope

from backend_store.errors import RateLimited
from push.observed import error_code
from push.observer import Observer
from push.principal import Operation, PrincipalLike, RateCheck

from .record import Operation as UsageOperation
from .record import Transport

SUBJECT = "pushgate.usage.subject"


def note_subject(scope: Scope, tenant: str, queue: str) -> None:
    scope[SUBJECT] = (tenant, queue)


def record_failure(observer: Observer, scope: Scope, operation: str, exc: BaseException) -> None:
    """One failed request of ``operation`` (count 1, outcome the error code); a request
    refused by a rate limit counts as ``throttled`` instead."""
    subject = scope.get(SUBJECT)
    if subject is not None:
        if isinstance(exc, RateLimited):
            operation = UsageOperation.THROTTLED
        observer.observe(subject[0], subject[1], operation, Transport.HTTP, error_code(exc), 1)


def observed_rate_check(rate_check: RateCheck, observer: Observer, transport: str) -> RateCheck:
    """push's rate check that also records each refusal as ``throttled`` (WebSocket frames
    and connections, SSE streams)."""

    async def counted(pending: Awaitable[object], principal: PrincipalLike, queue: str | None) -> None:
        try:
            await pending
        except RateLimited as exc:
            observer.observe(principal.tenant, queue or "", UsageOperation.THROTTLED, transport, exc.code, 1)
            raise

    def check(principal: PrincipalLike, op: Operation, queue: str | None) -> Awaitable[object] | None:
        pending = rate_check(principal, op, queue)
        return None if pending is None else counted(pending, principal, queue)

    return check
