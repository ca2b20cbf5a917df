"""Who is asking and what they may touch: bearer tokens, scopes and queue names.

Permissions (docs/api.md's Auth section plus what it leaves to us):

========================================  ==========================================
request                                   needs
========================================  ==========================================
send                                      ``send:<glob matching queue>``
receive, ack, nack, visibility, DELETE    ``receive:<glob matching queue>``
  ``.../messages/{receipt}``
GET a queue; PUT it with the attributes   any ``manage:``, ``send:`` or ``receive:``
  it has                                  scope matching it
create a queue, PUT with other            ``manage:<glob matching queue>``; a
  attributes, PATCH                       dead-letter target also ``manage:`` or
                                          ``send:`` on it (gateway/routes/queue_changes.py)
GET /v1/queues                            any scope; lists only the queues the caller's
                                          scopes match
DELETE a queue, purge                     ``manage:<glob matching queue>``
========================================  ==========================================

``admin`` allows everything within its tenant. Every queue lives in the caller's
tenant, so another tenant's queue is simply not found.
"""

from __future__ import annotations

from starlette.requests import Request

from backend_store.attributes import check_queue_name
from backend_store.errors import Forbidden, PushgateError, Unauthorized
from backend_store.types import QueueName
from gateway.auth.principal import Action, Principal
from push.principal import AUTHENTICATED

from ..services import GatewayServices
from ..usage.http import note_subject


async def authenticate(services: GatewayServices, request: Request) -> Principal:
    header = request.headers.get("authorization")
    if not header:
        raise Unauthorized("an Authorization: Bearer token is required")
    scheme, _, token = header.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise Unauthorized("the Authorization header must be 'Bearer <token>'")
    noted = request.scope.get(AUTHENTICATED)
    if noted is not None and noted[0] == token:
        # A browser request: the CORS middleware verified this token already (gateway/cors.py).
        outcome = noted[1]
        if isinstance(outcome, Principal):
            return outcome
        if isinstance(outcome, PushgateError):
            raise outcome
    return await services.authenticator.authenticate(token)


def can_see(principal: Principal, queue: str) -> bool:
    """Whether any queue scope matches the queue (enough to read it)."""
    return principal.can("manage", queue) or principal.can("send", queue) or principal.can("receive", queue)


def require(principal: Principal, action: Action | None, queue: str | None = None) -> None:
    """Raise 403 unless ``principal`` may do ``action`` (None: see) on ``queue``."""
    allowed = can_see(principal, queue or "") if action is None else principal.can(action, queue)
    if not allowed:
        raise Forbidden(f"the token's scopes do not allow it to {VERBS[action]}{_target(action, queue)}")


# "to send to queue 'orders'", "to receive from queue 'orders'", "to administer this tenant",
# "to read the metrics". One entry per Action: tests/newcomer/test_cli.py checks it.
VERBS: dict[Action | None, str] = {
    "manage": "manage",
    "send": "send to",
    "receive": "receive from",
    "admin": "administer",
    "metrics": "read the metrics",
    None: "use",
}


def _target(action: Action | None, queue: str | None) -> str:
    if queue:
        return f" queue {queue!r}"
    if action == "admin":
        return " this tenant"
    return " any queue" if action in ("manage", "send", "receive", None) else ""


def queue_param(request: Request) -> QueueName:
    name: str = request.path_params["queue"]
    check_queue_name(name)
    return QueueName(name)


async def queue_access(
    services: GatewayServices, request: Request, action: Action | None
) -> tuple[Principal, QueueName]:
    """Authenticate, validate the queue name and check the scope, in that order (401, 400, 403)."""
    principal = await authenticate(services, request)
    queue = queue_param(request)
    require(principal, action, queue)
    note_subject(request.scope, principal.tenant, queue)  # a failure from here on is billed to it
    return principal, queue
