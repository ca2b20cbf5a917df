"""The SQS message actions: send, receive, delete and visibility, on the calls ``/v1`` uses.

Sends go through the one send path (``services.sends.send`` with the transport ``sqs``), so
the quota, dedupe, batching, usage and metrics apply once; receives through the engine's
receive (long-poll included), deletes through its ``ack_now``, visibility changes through
its ``change_visibility``; rate limits through the gateway's enforcer, as for ``/v1``.
Scopes are checked per queue as on ``/v1`` (``gateway/routes/access.py``).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from backend_store.errors import PushgateError
from backend_store.types import NewMessage, QueueInfo, QueueName, ReceivedMessage, TenantId
from push.messages import parse_message
from push.observed import record_settled
from push.observer import ACK, OK, RECEIVE, SQS

from ..auth.principal import Action as Scope
from ..auth.principal import Principal
from ..routes.access import require
from ..services import GatewayServices
from . import message_attributes
from .errors import SqsError
from .md5 import md5_of_attributes, md5_of_body
from .names import parse_queue_url
from .protocol import int_param
from .protocol import require as required

MAX_BATCH = 10  # AWS's limit on entries in a batch request and messages in a receive
# Pushgate keeps a message's AWSTraceHeader (the one system attribute a sender sets) here.
TRACE_ATTRIBUTE = "AWS.SQS.AWSTraceHeader"
# System attributes ReceiveMessage may ask for (AttributeNames / MessageSystemAttributeNames).
SYSTEM_ATTRIBUTES = frozenset(
    {
        "All",
        "SenderId",
        "SentTimestamp",
        "ApproximateReceiveCount",
        "ApproximateFirstReceiveTimestamp",
        "SequenceNumber",
        "MessageDeduplicationId",
        "MessageGroupId",
        "AWSTraceHeader",
        "DeadLetterQueueSourceArn",
    }
)
# Characters AWS refuses in a message body (it must be valid XML text: both protocols check it).
_NOT_XML = re.compile("[^\x09\x0a\x0d\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
# How many first-receive times a gateway remembers (ApproximateFirstReceiveTimestamp).
FIRST_RECEIVES_KEPT = 100_000


class FirstReceives:
    """When this gateway first handed each recent message out: a bounded memo.

    The store counts receives but does not keep the time of the first one, so a first
    receive's time is remembered here (the newest :data:`FIRST_RECEIVES_KEPT` messages);
    a message first received elsewhere, or long ago, falls back to its sent time."""

    def __init__(self, kept: int = FIRST_RECEIVES_KEPT) -> None:
        self._kept = kept
        self._at: OrderedDict[tuple[TenantId, QueueName, str], int] = OrderedDict()

    def stamp(self, tenant: TenantId, message: ReceivedMessage, now_ms: int) -> int:
        key = (tenant, message.queue, message.id)
        if message.receive_count <= 1:
            self._at[key] = now_ms
            if len(self._at) > self._kept:
                self._at.popitem(last=False)
            return now_ms
        return self._at.get(key, int(message.sent_at * 1000))


class SqsMessageActions:
    """One method per message action; each takes the principal, the parameters and the base URL."""

    def __init__(self, services: GatewayServices) -> None:
        self.services = services
        self.first_receives = FirstReceives()

    async def _queue(self, principal: Principal, params: Mapping[str, Any], scope: Scope) -> QueueInfo:
        tenant, queue = parse_queue_url(params.get("QueueUrl"))
        if tenant != principal.tenant:
            raise SqsError("QueueDoesNotExist", "The specified queue does not exist.")
        require(principal, scope, queue)
        return await self.services.queues.get(principal.tenant, queue)

    # Sends ------------------------------------------------------------------

    async def _send(
        self,
        principal: Principal,
        queue: QueueName,
        entries: list[NewMessage | PushgateError],
        started: float,
    ) -> list[Any]:
        await self.services.throttling.enforcer.admit(principal.tenant, principal.subject, "send", queue)
        # The one send path: quota, dedupe front, batching with other sends, usage.
        try:
            return list(await self.services.sends.send(principal.tenant, queue, entries, SQS, started))
        except PushgateError as exc:
            raise SqsError.from_pushgate(exc) from None

    async def send_message(self, principal: Principal, params: dict[str, Any], base: str) -> dict[str, Any]:
        started = time.perf_counter()
        info = await self._queue(principal, params, "send")
        entry = _new_message(info, params)
        outcome = (await self._send(principal, info.name, [entry], started))[0]
        if isinstance(outcome, PushgateError):
            raise SqsError.from_pushgate(outcome)
        return _sent(info, params, outcome.id, outcome.seq)

    async def send_message_batch(
        self, principal: Principal, params: dict[str, Any], base: str
    ) -> dict[str, Any]:
        started = time.perf_counter()
        info = await self._queue(principal, params, "send")
        batch = _batch(params)
        # AWS's limit on a whole batch is its limit on one message (the queue's MaximumMessageSize).
        total = sum(len(str(raw.get("MessageBody") or "").encode()) for raw in batch)
        if total > info.attributes.max_message_bytes:
            raise SqsError(
                "BatchRequestTooLong",
                f"Batch requests cannot be longer than {info.attributes.max_message_bytes} bytes. "
                f"You have sent {total} bytes.",
            )
        entries: list[NewMessage | PushgateError] = []
        for raw in batch:
            try:
                entries.append(_new_message(info, raw))
            except SqsError as exc:
                entries.append(_Refused(exc))
        outcomes = await self._send(principal, info.name, entries, started)
        ok: list[dict[str, Any]] = []
        failed: list[dict[str, Any]] = []
        for raw, outcome in zip(batch, outcomes, strict=True):
            if isinstance(outcome, PushgateError):
                failed.append(_failure(raw["Id"], outcome))
            else:
                ok.append({"Id": raw["Id"], **_sent(info, raw, outcome.id, outcome.seq)})
        return {"Successful": ok, "Failed": failed}

    # Receives, deletes, visibility --------------------------------------------

    async def receive_message(
        self, principal: Principal, params: dict[str, Any], base: str
    ) -> dict[str, Any]:
        info = await self._queue(principal, params, "receive")
        queue = info.name
        await self.services.throttling.enforcer.admit(principal.tenant, principal.subject, "receive", queue)
        max_messages = int_param(params, "MaxNumberOfMessages", 1, MAX_BATCH, 1) or 1
        visibility = int_param(params, "VisibilityTimeout", 0, 43200)
        wait_s = int_param(params, "WaitTimeSeconds", 0, 20)
        names = {str(n) for n in params.get("AttributeNames") or []} | {
            str(n) for n in params.get("MessageSystemAttributeNames") or []
        }
        unknown = names - SYSTEM_ATTRIBUTES
        if unknown:
            raise SqsError("InvalidAttributeName", f"Unknown Attribute {sorted(unknown)[0]}.")
        wanted = {str(n) for n in params.get("MessageAttributeNames") or []}
        if wait_s is None:
            wait_s = int(info.attributes.receive_wait_s)
        messages = await self.services.engine.receive(
            principal, queue, max_messages, visibility, wait_s, _never
        )
        if not messages:
            return {}
        nbytes = sum(len(m.body) for m in messages)
        self.services.observer.observe(principal.tenant, queue, RECEIVE, SQS, OK, len(messages), nbytes)
        now_ms = int(time.time() * 1000)
        fifo = info.attributes.ordering == "fifo"
        out = []
        for m in messages:
            first = self.first_receives.stamp(principal.tenant, m, now_ms)
            out.append(_received(m, names, wanted, first, fifo))
        return {"Messages": out}

    async def _delete(self, principal: Principal, queue: QueueName, receipts: list[str]) -> list[str]:
        """Ack ``receipts``; the ones that failed."""
        result = await self.services.engine.ack_now(principal.tenant, receipts, queue)
        record_settled(
            self.services.observer,
            principal.tenant,
            ACK,
            SQS,
            receipts,
            dict.fromkeys(receipts, queue),
            result,
        )
        return [f.receipt for f in result.failed]

    async def delete_message(self, principal: Principal, params: dict[str, Any], base: str) -> dict[str, Any]:
        info = await self._queue(principal, params, "receive")
        receipt = str(required(params, "ReceiptHandle"))
        if await self._delete(principal, info.name, [receipt]):
            raise SqsError(
                "ReceiptHandleIsInvalid", f"The input receipt handle {receipt!r} is not a valid one."
            )
        return {}

    async def delete_message_batch(
        self, principal: Principal, params: dict[str, Any], base: str
    ) -> dict[str, Any]:
        info = await self._queue(principal, params, "receive")
        batch = _batch(params)
        receipts = [str(required(raw, "ReceiptHandle")) for raw in batch]
        failed = set(await self._delete(principal, info.name, receipts))
        pairs = list(zip(batch, receipts, strict=True))
        invalid = SqsError("ReceiptHandleIsInvalid", "The receipt handle is not valid.")
        return {
            "Successful": [{"Id": raw["Id"]} for raw, r in pairs if r not in failed],
            "Failed": [_failure(raw["Id"], invalid) for raw, r in pairs if r in failed],
        }

    async def _change(self, principal: Principal, queue: QueueName, raw: dict[str, Any]) -> None:
        receipt = str(required(raw, "ReceiptHandle"))
        timeout = int_param(raw, "VisibilityTimeout", 0, 43200)
        if timeout is None:
            raise SqsError("MissingParameter", "The request must contain the parameter VisibilityTimeout.")
        try:
            await self.services.engine.change_visibility(principal.tenant, queue, receipt, timeout)
        except PushgateError as exc:
            raise SqsError.from_pushgate(exc) from None

    async def change_visibility(
        self, principal: Principal, params: dict[str, Any], base: str
    ) -> dict[str, Any]:
        info = await self._queue(principal, params, "receive")
        await self._change(principal, info.name, params)
        return {}

    async def change_visibility_batch(
        self, principal: Principal, params: dict[str, Any], base: str
    ) -> dict[str, Any]:
        info = await self._queue(principal, params, "receive")
        ok: list[dict[str, Any]] = []
        failed: list[dict[str, Any]] = []
        for raw in _batch(params):
            try:
                await self._change(principal, info.name, raw)
                ok.append({"Id": raw["Id"]})
            except SqsError as exc:
                failed.append(_failure(raw["Id"], exc))
        return {"Successful": ok, "Failed": failed}


class _Refused(PushgateError):
    """A batch entry the SQS API refused before the send path: it rides along in its place."""

    code = "invalid_request"

    def __init__(self, error: SqsError) -> None:
        super().__init__(error.message)
        self.sqs = error


async def _never() -> None:
    # The SQS route does not watch for a hang-up: a long-poll ends by its own wait (max 20 s).
    await asyncio.Event().wait()


def _batch(params: dict[str, Any]) -> list[dict[str, Any]]:
    """A batch's entries, checked as AWS checks them (count, ids, distinct ids)."""
    entries = params.get("Entries")
    if not entries:
        raise SqsError("EmptyBatchRequest", "There should be at least one entry in the request.")
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise SqsError("InvalidParameterValue", "Entries must be a list of objects.")
    if len(entries) > MAX_BATCH:
        raise SqsError(
            "TooManyEntriesInBatchRequest", f"Maximum number of entries per request are {MAX_BATCH}."
        )
    ids = [e.get("Id") for e in entries]
    for entry_id in ids:
        if (
            not isinstance(entry_id, str)
            or not 1 <= len(entry_id) <= 80
            or not entry_id.replace("-", "").replace("_", "").isalnum()
        ):
            raise SqsError("InvalidBatchEntryId", "A batch entry id can only contain alphanumerics, - and _.")
    if len(set(ids)) != len(ids):
        raise SqsError(
            "BatchEntryIdsNotDistinct", "Two or more batch entries in the request have the same Id."
        )
    return entries


def _failure(entry_id: str, error: PushgateError | SqsError) -> dict[str, Any]:
    if isinstance(error, _Refused):
        error = error.sqs
    sqs = error if isinstance(error, SqsError) else SqsError.from_pushgate(error)
    return {"Id": entry_id, "SenderFault": sqs.aws.sender, "Code": sqs.aws.type, "Message": sqs.message}


def _new_message(info: QueueInfo, params: dict[str, Any]) -> NewMessage:
    """An SQS entry as a Pushgate message, checked by the same parse_message as every transport."""
    body = params.get("MessageBody")
    if not isinstance(body, str) or not body:
        raise SqsError("MissingParameter", "The request must contain the parameter MessageBody.")
    if _NOT_XML.search(body):
        raise SqsError(
            "InvalidMessageContents",
            "Invalid characters found. Valid unicode characters are #x9 | #xA | #xD | #x20 to #xD7FF | "
            "#xE000 to #xFFFD | #x10000 to #x10FFFF",
        )
    raw: dict[str, Any] = {"body": body}
    attributes = message_attributes.to_pushgate(params.get("MessageAttributes"))
    trace = _trace_header(params.get("MessageSystemAttributes"))
    if trace is not None:
        attributes[TRACE_ATTRIBUTE] = trace
    if attributes:
        raw["attributes"] = attributes
    delay = int_param(params, "DelaySeconds", 0, 900)
    if info.attributes.ordering == "fifo":
        # AWS's rules for FIFO queues: a group always; a deduplication id unless the queue
        # deduplicates by content; no per-message delay.
        if params.get("MessageGroupId") is None:
            raise SqsError("MissingParameter", "The request must contain the parameter MessageGroupId.")
        if params.get("MessageDeduplicationId") is None and not info.attributes.content_dedupe:
            raise SqsError(
                "InvalidParameterValue",
                "The queue should either have ContentBasedDeduplication enabled or "
                "MessageDeduplicationId provided explicitly",
            )
        if delay:
            raise SqsError(
                "InvalidParameterValue",
                f"Value {delay} for parameter DelaySeconds is invalid. Reason: The request include "
                "parameter that is not valid for this queue type.",
            )
    if delay is not None:
        raw["delay_s"] = delay
    if params.get("MessageGroupId") is not None:
        raw["group_id"] = params["MessageGroupId"]
    if params.get("MessageDeduplicationId") is not None:
        raw["dedupe_id"] = params["MessageDeduplicationId"]
    try:
        return parse_message(raw)
    except PushgateError as exc:
        raise SqsError.from_pushgate(exc) from None


def _trace_header(system: Any) -> str | None:
    """The AWSTraceHeader of ``MessageSystemAttributes``, the one system attribute AWS takes."""
    if not system:
        return None
    if not isinstance(system, Mapping) or set(system) != {"AWSTraceHeader"}:
        raise SqsError("InvalidParameterValue", "MessageSystemAttributes takes only AWSTraceHeader.")
    value = system["AWSTraceHeader"]
    if not isinstance(value, Mapping) or value.get("DataType") != "String" or not value.get("StringValue"):
        raise SqsError("InvalidParameterValue", "AWSTraceHeader must be a String with a StringValue.")
    return str(value["StringValue"])


def _sent(info: QueueInfo, params: dict[str, Any], message_id: str, seq: int) -> dict[str, Any]:
    out: dict[str, Any] = {"MessageId": message_id, "MD5OfMessageBody": md5_of_body(params["MessageBody"])}
    attributes = params.get("MessageAttributes")
    if attributes:
        out["MD5OfMessageAttributes"] = md5_of_attributes(attributes)
    system = params.get("MessageSystemAttributes")
    if system:
        out["MD5OfMessageSystemAttributes"] = md5_of_attributes(system)
    if info.attributes.ordering == "fifo":
        out["SequenceNumber"] = str(seq)
    return out


def _received(
    message: ReceivedMessage, names: set[str], wanted: set[str], first_receive_ms: int, fifo: bool
) -> dict[str, Any]:
    body = message.body.decode("utf-8", errors="replace")
    out: dict[str, Any] = {
        "MessageId": message.id,
        "ReceiptHandle": message.receipt,
        "MD5OfBody": md5_of_body(body),
        "Body": body,
    }
    system = {
        "ApproximateReceiveCount": str(message.receive_count),
        "SentTimestamp": str(int(message.sent_at * 1000)),
        "ApproximateFirstReceiveTimestamp": str(first_receive_ms),
    }
    if message.group_id is not None:
        system["MessageGroupId"] = message.group_id
    if fifo:
        system["SequenceNumber"] = str(message.seq)
    trace = message.attributes.get(TRACE_ATTRIBUTE)
    if trace is not None:
        system["AWSTraceHeader"] = trace
    every = "All" in names
    chosen = {k: v for k, v in system.items() if every or k in names}
    if chosen:
        out["Attributes"] = chosen
    if wanted:
        user = {k: v for k, v in message.attributes.items() if k != TRACE_ATTRIBUTE}
        attrs = message_attributes.select(message_attributes.from_pushgate(user), wanted)
        if attrs:
            out["MD5OfMessageAttributes"] = md5_of_attributes(attrs)
            out["MessageAttributes"] = attrs
    return out
