"""Creating and changing a queue: who may, for ``/v1`` and the SQS API alike.

One place decides, so the two doors cannot disagree (docs/auth.md, "Scopes"):

- creating a queue, or defining an existing one with other attributes than it has, needs
  ``manage:`` on it (or ``admin``). Defining an existing queue with the attributes it has
  changes nothing, so any scope matching it may (applications create their queues at
  start-up with send or receive keys); the answer is the queue, as for a manager.
- changing a queue (``PATCH``, SetQueueAttributes) needs ``manage:`` on it.
- a dead-letter target named by a creation or a change must be a queue the caller may
  ``manage:`` or ``send:`` to: moving messages into a queue is sending to it, and without
  this a key could route its messages into a queue it may not write (issue 47).

The dead-letter queue is always of the caller's tenant: attributes name it by queue name
only (an SQS ARN naming another account is refused before it gets here,
``gateway/sqs/attributes.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from backend_store.attributes import parse_attributes
from backend_store.errors import Forbidden, QueueNotFound
from backend_store.types import QueueInfo, QueueName

from ..auth.principal import Principal
from ..services import GatewayServices
from ..usage.audit import AuditAction, audit_request
from .access import require


def refusal(principal: Principal, queue: str, attributes: Mapping[str, Any]) -> Forbidden | None:
    """Why ``principal`` may not set ``attributes`` on ``queue`` (None: it may)."""
    if not principal.can("manage", queue):
        return Forbidden(
            f"the token's scopes do not allow it to create or change queue {queue!r}: "
            "that needs manage: on it (or admin)"
        )
    target = attributes.get("dead_letter_queue")
    if isinstance(target, str) and not (principal.can("manage", target) or principal.can("send", target)):
        return Forbidden(
            f"the token's scopes do not allow it to use queue {target!r} as a dead-letter queue: "
            "that needs manage: or send: on it (or admin)"
        )
    return None


class QueueChanges:
    """Create and change queues once the caller is authenticated (every door calls these)."""

    def __init__(self, services: GatewayServices) -> None:
        self.services = services

    async def create(
        self, principal: Principal, queue: QueueName, attributes: Mapping[str, Any]
    ) -> tuple[QueueInfo, bool]:
        """The queue and whether it was created (False: it exists with these attributes)."""
        refused = refusal(principal, queue, attributes)
        if refused is not None:
            require(principal, None, queue)  # no scope on it at all: the usual 403
            return await self._unchanged(principal, queue, attributes, refused), False
        await self.services.throttling.enforcer.check_new_queue(principal.tenant, queue)
        info, created = await self.services.backend.create_queue(principal.tenant, queue, attributes)
        self.services.queues.put(info)
        if created:
            await audit_request(
                self.services.usage.audit, principal, AuditAction.QUEUE_CREATED, queue, attributes
            )
        return info, created

    async def _unchanged(
        self, principal: Principal, queue: QueueName, attributes: Mapping[str, Any], refused: Forbidden
    ) -> QueueInfo:
        """The queue when it exists with exactly ``attributes``; otherwise ``refused``.

        Compared here, not by a create call, so that a queue deleted meanwhile is never
        created by a caller who may not create it."""
        parse_attributes(attributes)  # a malformed value is a 400 as for a manager
        try:
            info = await self.services.backend.get_queue(principal.tenant, queue)
        except QueueNotFound:
            raise refused from None
        # The replication factor is the one attribute a backend fills in itself when it is
        # left out (cluster:// from its URL): left out, it is the queue's own, as the
        # backend's create would have taken it.
        filled = {"replication_factor": info.attributes.replication_factor, **attributes}
        if info.attributes != parse_attributes(filled):
            raise refused
        return info

    async def update(self, principal: Principal, queue: QueueName, changes: Mapping[str, Any]) -> QueueInfo:
        refused = refusal(principal, queue, changes)
        if refused is not None:
            require(principal, None, queue)
            raise refused
        self.services.queues.invalidate(principal.tenant, queue)
        info = await self.services.backend.update_queue(principal.tenant, queue, changes)
        self.services.queues.put(info)
        await audit_request(self.services.usage.audit, principal, AuditAction.QUEUE_UPDATED, queue, changes)
        return info
