"""The SQS actions, each on the backend calls the ``/v1`` routes use: the table of every action.

Queue actions live here (create, list, attributes, tags, dead-letter sources, move tasks);
message actions (send, receive, delete, visibility) in :mod:`gateway.sqs.message_actions`.
Scopes are checked per queue as on ``/v1`` (``gateway/routes/access.py``); audit records and
the queue cache are the ones ``/v1`` writes and reads.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from backend_store.attributes import QUEUE_NAME
from backend_store.types import QueueInfo, QueueName, TenantId

from ..auth.principal import Action as Scope
from ..auth.principal import Principal
from ..routes.access import can_see, require
from ..routes.queue_changes import QueueChanges
from ..services import GatewayServices
from ..usage.audit import AuditAction, audit_request
from . import attributes as queue_attributes
from .errors import SqsError
from .message_actions import SqsMessageActions
from .move_tasks import MoveTasks, listed
from .names import parse_queue_arn, parse_queue_url, queue_arn, queue_url
from .protocol import int_param
from .protocol import require as required
from .tags import TagStore, check_tags

Action = Callable[[Principal, dict[str, Any], str], Awaitable[dict[str, Any]]]
# AWS's message for a queue name it refuses.
_BAD_NAME = "Can only include alphanumeric characters, hyphens, or underscores. 1 to 80 in length"
_BAD_FIFO_NAME = (
    "The name of a FIFO queue can only include alphanumeric characters, hyphens, or underscores, "
    "must end with .fifo suffix and be 1 to 80 in length."
)


class SqsActions:
    """One method per action; each takes the principal, the parameters and the base URL."""

    def __init__(self, services: GatewayServices) -> None:
        self.services = services
        self.tags = TagStore(services.backend)
        self.move_tasks = MoveTasks(services.backend)
        self.changes = QueueChanges(services)
        messages = SqsMessageActions(services)
        self.table: dict[str, Action] = {
            "CreateQueue": self.create_queue,
            "GetQueueUrl": self.get_queue_url,
            "ListQueues": self.list_queues,
            "DeleteQueue": self.delete_queue,
            "GetQueueAttributes": self.get_queue_attributes,
            "SetQueueAttributes": self.set_queue_attributes,
            "PurgeQueue": self.purge_queue,
            "TagQueue": self.tag_queue,
            "UntagQueue": self.untag_queue,
            "ListQueueTags": self.list_queue_tags,
            "ListDeadLetterSourceQueues": self.list_dead_letter_source_queues,
            "StartMessageMoveTask": self.start_message_move_task,
            "ListMessageMoveTasks": self.list_message_move_tasks,
            "CancelMessageMoveTask": self.cancel_message_move_task,
            "SendMessage": messages.send_message,
            "SendMessageBatch": messages.send_message_batch,
            "ReceiveMessage": messages.receive_message,
            "DeleteMessage": messages.delete_message,
            "DeleteMessageBatch": messages.delete_message_batch,
            "ChangeMessageVisibility": messages.change_visibility,
            "ChangeMessageVisibilityBatch": messages.change_visibility_batch,
        }

    def _queue(self, principal: Principal, params: dict[str, Any], scope: Scope | None) -> QueueName:
        tenant, queue = parse_queue_url(params.get("QueueUrl"))
        if tenant != principal.tenant:
            raise SqsError("QueueDoesNotExist", "The specified queue does not exist.")
        require(principal, scope, queue)
        return queue

    async def _info(self, principal: Principal, params: dict[str, Any], scope: Scope | None) -> QueueInfo:
        return await self.services.backend.get_queue(principal.tenant, self._queue(principal, params, scope))

    def _arn_queue(self, principal: Principal, arn: object) -> QueueName:
        if not isinstance(arn, str) or not arn:
            raise SqsError("MissingParameter", "The request must contain the parameter SourceArn.")
        tenant, queue = parse_queue_arn(arn)
        if tenant != principal.tenant:
            raise SqsError("QueueDoesNotExist", "The specified queue does not exist.")
        return queue

    # Queues -----------------------------------------------------------------

    async def create_queue(self, principal: Principal, params: dict[str, Any], base: str) -> dict[str, Any]:
        queue = QueueName(str(required(params, "QueueName")))
        if not QUEUE_NAME.fullmatch(queue):
            raise SqsError("InvalidParameterValue", _BAD_NAME)
        require(principal, None, queue)
        raw_attributes = params.get("Attributes") or {}
        attrs = queue_attributes.to_pushgate(raw_attributes, principal.tenant)
        fifo = attrs.get("ordering") == "fifo"
        if fifo != queue.endswith(".fifo"):
            raise SqsError("InvalidParameterValue", _BAD_FIFO_NAME)
        tags = check_tags(params.get("tags") or {})
        # The one rule for who may create (and who may only find) a queue, as on /v1.
        info, created = await self.changes.create(principal, queue, attrs)
        if created and tags:
            await self.tags.tag(info, tags)
        return {"QueueUrl": queue_url(base, principal.tenant, queue)}

    async def get_queue_url(self, principal: Principal, params: dict[str, Any], base: str) -> dict[str, Any]:
        queue = QueueName(str(required(params, "QueueName")))
        require(principal, None, queue)
        await self.services.backend.get_queue(principal.tenant, queue)
        return {"QueueUrl": queue_url(base, principal.tenant, queue)}

    async def _names(self, principal: Principal, keep: Callable[[QueueInfo], bool]) -> list[str]:
        queues = await self.services.backend.list_queues(principal.tenant)
        return sorted(i.name for i in queues if keep(i) and can_see(principal, i.name))

    def _page(
        self, principal: Principal, params: dict[str, Any], base: str, names: list[str], key: str
    ) -> dict[str, Any]:
        """A page of queue URLs: ``MaxResults`` (1-1000) at a time, ``NextToken`` the last name."""
        limit = int_param(params, "MaxResults", 1, 1000)
        after = str(params.get("NextToken") or "")
        names = [n for n in names if n > after]
        out: dict[str, Any] = {}
        if limit is not None and len(names) > limit:
            names = names[:limit]
            out["NextToken"] = names[-1]
        out[key] = [queue_url(base, principal.tenant, QueueName(n)) for n in names]
        return out

    async def list_queues(self, principal: Principal, params: dict[str, Any], base: str) -> dict[str, Any]:
        """One page read from the store (not every queue, then a slice): ``MaxResults``
        (1-1000) past ``NextToken`` (the last name of the page before). Without
        ``MaxResults``, up to 1,000 and no ``NextToken``, as AWS answers."""
        prefix = str(params.get("QueueNamePrefix") or "")
        limit = int_param(params, "MaxResults", 1, 1000)
        after = str(params.get("NextToken") or "")
        infos = await self.services.backend.list_queues(
            principal.tenant, after=after, limit=(limit or 1000) + 1, prefix=prefix
        )
        page = infos[: limit or 1000]
        out: dict[str, Any] = {
            "QueueUrls": [
                queue_url(base, principal.tenant, i.name) for i in page if can_see(principal, i.name)
            ]
        }
        if limit is not None and len(infos) > limit:
            out["NextToken"] = page[-1].name
        if not out["QueueUrls"]:
            del out["QueueUrls"]  # AWS leaves the list out when it is empty
        return out

    async def delete_queue(self, principal: Principal, params: dict[str, Any], base: str) -> dict[str, Any]:
        info = await self._info(principal, params, "manage")
        self.services.queues.invalidate(principal.tenant, info.name)
        await self.services.backend.delete_queue(principal.tenant, info.name)
        self.services.queues.invalidate(principal.tenant, info.name)
        await self.tags.forget(info)
        await audit_request(self.services.usage.audit, principal, AuditAction.QUEUE_DELETED, info.name)
        return {}

    async def get_queue_attributes(
        self, principal: Principal, params: dict[str, Any], base: str
    ) -> dict[str, Any]:
        info = await self._info(principal, params, None)
        names = [str(n) for n in params.get("AttributeNames") or []]
        settings = self.services.settings
        encrypted = settings.encryption_key_file is not None or bool(settings.encryption_keys)
        return {"Attributes": queue_attributes.from_pushgate(info, names, encrypted)} if names else {}

    async def set_queue_attributes(
        self, principal: Principal, params: dict[str, Any], base: str
    ) -> dict[str, Any]:
        queue = self._queue(principal, params, None)
        raw = params.get("Attributes") or {}
        if "FifoQueue" in raw:
            raise SqsError("InvalidAttributeName", "Unknown Attribute FifoQueue.")  # immutable, as on AWS
        changes = queue_attributes.to_pushgate(raw, principal.tenant)
        await self.changes.update(principal, queue, changes)
        return {}

    async def purge_queue(self, principal: Principal, params: dict[str, Any], base: str) -> dict[str, Any]:
        queue = self._queue(principal, params, "manage")
        purged = await self.services.backend.purge_queue(principal.tenant, queue)
        await audit_request(
            self.services.usage.audit, principal, AuditAction.QUEUE_PURGED, queue, {"purged": purged}
        )
        return {}

    # Tags -------------------------------------------------------------------

    async def tag_queue(self, principal: Principal, params: dict[str, Any], base: str) -> dict[str, Any]:
        info = await self._info(principal, params, "manage")
        tags = check_tags(required(params, "Tags"))
        await self.tags.tag(info, tags)
        return {}

    async def untag_queue(self, principal: Principal, params: dict[str, Any], base: str) -> dict[str, Any]:
        info = await self._info(principal, params, "manage")
        keys = params.get("TagKeys")
        if not isinstance(keys, list) or not keys or not all(isinstance(k, str) and k for k in keys):
            raise SqsError(
                "InvalidParameterValue", "Tag keys must be between 1 and 128 characters in length."
            )
        await self.tags.untag(info, keys)
        return {}

    async def list_queue_tags(
        self, principal: Principal, params: dict[str, Any], base: str
    ) -> dict[str, Any]:
        info = await self._info(principal, params, None)
        tags = await self.tags.get(info)
        return {"Tags": tags} if tags else {}

    # Dead letters -----------------------------------------------------------

    async def list_dead_letter_source_queues(
        self, principal: Principal, params: dict[str, Any], base: str
    ) -> dict[str, Any]:
        info = await self._info(principal, params, None)
        names = await self._names(principal, lambda i: i.attributes.dead_letter_queue == info.name)
        return self._page(principal, params, base, names, "queueUrls")

    async def start_message_move_task(
        self, principal: Principal, params: dict[str, Any], base: str
    ) -> dict[str, Any]:
        source = self._arn_queue(principal, params.get("SourceArn"))
        require(principal, "admin", source)
        info = await self.services.backend.get_queue(principal.tenant, source)
        sources = await self._names(principal, lambda i: i.attributes.dead_letter_queue == source)
        if not sources:
            raise SqsError("InvalidParameterValue", "Source queue must be configured as a Dead Letter Queue.")
        if params.get("DestinationArn"):
            destination = self._arn_queue(principal, params["DestinationArn"])
            await self.services.backend.get_queue(principal.tenant, destination)
        elif len(sources) == 1:
            destination = QueueName(sources[0])
        else:
            # AWS moves each message back to the queue it came from; Pushgate does not keep that.
            raise SqsError(
                "InvalidParameterValue",
                f"{len(sources)} queues use this dead-letter queue: give DestinationArn (docs/sqs.md).",
            )
        rate = int_param(params, "MaxNumberOfMessagesPerSecond", 1, 500)
        task = await self.move_tasks.start(principal.tenant, source, destination, rate, info.stats.visible)
        return {"TaskHandle": task.handle}

    async def list_message_move_tasks(
        self, principal: Principal, params: dict[str, Any], base: str
    ) -> dict[str, Any]:
        source = self._arn_queue(principal, params.get("SourceArn"))
        require(principal, "admin", source)
        await self.services.backend.get_queue(principal.tenant, source)
        limit = int_param(params, "MaxResults", 1, 10, 1) or 1
        tasks = (await self.move_tasks.list(principal.tenant, source))[:limit]
        tenant = principal.tenant
        return {"Results": [listed(t, lambda q: queue_arn(TenantId(tenant), QueueName(q))) for t in tasks]}

    async def cancel_message_move_task(
        self, principal: Principal, params: dict[str, Any], base: str
    ) -> dict[str, Any]:
        handle = str(required(params, "TaskHandle"))
        require(principal, "admin")
        task = await self.move_tasks.cancel(principal.tenant, handle)
        return {"ApproximateNumberOfMessagesMoved": task.moved}
