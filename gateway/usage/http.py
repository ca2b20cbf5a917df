"""Usage of HTTP requests: who a request is billed to, and its failures by code.

:func:`~gateway.routes.access.queue_access` notes the (tenant, queue) of a request once
it is authorized, in the ASGI scope; when the handler then fails, the
:class:`~gateway.routes.endpoint.Endpoint` records the failure under that tenant and
queue with the error's code. A request that fails before (no token, a bad queue name)
has nobody to bill: it is only in the Prometheus metrics.
"""

from __future__ import annotations

from starlette.types import Scope

from push.observed import error_code
from push.observer import Observer

from .record import Transport

SUBJECT = "pushgate.usage.subject"


def note_subject(scope: Scope, tenant: str, queue: str) -> None:
    scope[SUBJECT] = (tenant, queue)


def record_failure(observer: Observer, scope: Scope, operation: str, exc: BaseException) -> None:
    """One failed request of ``operation`` (count 1, outcome the error code)."""
    subject = scope.get(SUBJECT)
    if subject is not None:
        observer.observe(subject[0], subject[1], operation, Transport.HTTP, error_code(exc), 1)
