"""Queue attributes in SQS's names and Pushgate's: the one translation both ways.

SQS attribute values are strings (``"30"``); Pushgate's are numbers. Attributes Pushgate has
no notion of (KMS, policies, ...) are refused with AWS's ``InvalidAttributeName`` when set.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from backend_store.types import QueueInfo

from .errors import SqsError
from .names import parse_queue_arn, queue_arn

# SQS attribute -> (Pushgate attribute, integer in SQS's terms)
SETTABLE: dict[str, str] = {
    "VisibilityTimeout": "visibility_timeout_s",
    "MessageRetentionPeriod": "retention_s",
    "DelaySeconds": "delay_s",
    "ReceiveMessageWaitTimeSeconds": "receive_wait_s",
    "MaximumMessageSize": "max_message_bytes",
}
READ_ONLY = frozenset(
    {
        "QueueArn",
        "CreatedTimestamp",
        "LastModifiedTimestamp",
        "ApproximateNumberOfMessages",
        "ApproximateNumberOfMessagesNotVisible",
        "ApproximateNumberOfMessagesDelayed",
    }
)
ALL_NAMES = (
    frozenset(SETTABLE)
    | READ_ONLY
    | {
        "RedrivePolicy",
        "FifoQueue",
        "ContentBasedDeduplication",
        "SqsManagedSseEnabled",
    }
)


def to_pushgate(attributes: Mapping[str, Any], tenant: str) -> dict[str, Any]:
    """SQS attributes as Pushgate's queue attributes (InvalidAttributeName for unknown ones).

    ``tenant`` is the caller's: a ``RedrivePolicy`` naming another account's queue is refused,
    never taken as the caller's own queue of that name."""
    out: dict[str, Any] = {}
    for name, value in attributes.items():
        if name in SETTABLE:
            try:
                out[SETTABLE[name]] = int(str(value))
            except ValueError:
                raise SqsError("InvalidParameterValue", f"Invalid value for the parameter {name}.") from None
        elif name == "RedrivePolicy":
            out.update(_redrive(value, tenant))
        elif name == "FifoQueue":
            if str(value).lower() == "true":
                out["ordering"] = "fifo"
        elif name == "ContentBasedDeduplication":
            out["content_dedupe"] = str(value).lower() == "true"
        elif name == "SqsManagedSseEnabled":
            pass  # not the queue's choice: the gateway's encryption at rest decides (from_pushgate)
        else:
            raise SqsError("InvalidAttributeName", f"Unknown Attribute {name}.")
    return out


def _redrive(value: Any, tenant: str) -> dict[str, Any]:
    if value in (None, ""):
        return {"dead_letter_queue": None, "max_receives": None}
    try:
        policy = json.loads(value) if isinstance(value, str) else value
        account, dlq = parse_queue_arn(str(policy["deadLetterTargetArn"]))
        max_receives = int(policy["maxReceiveCount"])
    except (ValueError, KeyError, TypeError, OverflowError):
        raise SqsError("InvalidParameterValue", "Invalid value for the parameter RedrivePolicy.") from None
    if account != tenant:
        raise SqsError(
            "InvalidParameterValue",
            "Value for parameter RedrivePolicy is invalid. Reason: the dead-letter target must be a queue "
            "of the same account.",
        )
    return {"dead_letter_queue": dlq, "max_receives": max_receives}


def from_pushgate(info: QueueInfo, names: list[str], encrypted: bool = False) -> dict[str, str]:
    """The SQS attributes ``names`` asks for (``All`` for every one) of a queue.

    ``encrypted``: whether the store seals message bodies at rest (``SqsManagedSseEnabled``)."""
    wanted = ALL_NAMES if "All" in names else set(names)
    unknown = wanted - ALL_NAMES
    if unknown:
        raise SqsError("InvalidAttributeName", f"Unknown Attribute {sorted(unknown)[0]}.")
    attrs = info.attributes.to_dict()
    stats = info.stats
    values: dict[str, str] = {
        "QueueArn": queue_arn(info.tenant, info.name),
        "CreatedTimestamp": str(int(info.created_at)),
        "LastModifiedTimestamp": str(int(info.created_at)),
        "ApproximateNumberOfMessages": str(stats.visible),
        "ApproximateNumberOfMessagesNotVisible": str(stats.in_flight),
        "ApproximateNumberOfMessagesDelayed": str(stats.delayed),
        "SqsManagedSseEnabled": "true" if encrypted else "false",
    }
    for sqs_name, name in SETTABLE.items():
        values[sqs_name] = str(int(attrs[name]))
    if attrs.get("dead_letter_queue"):
        dlq = queue_arn(info.tenant, attrs["dead_letter_queue"])
        values["RedrivePolicy"] = json.dumps(
            {"deadLetterTargetArn": dlq, "maxReceiveCount": attrs.get("max_receives")}, separators=(",", ":")
        )
    if attrs.get("ordering") == "fifo":
        values["FifoQueue"] = "true"
        values["ContentBasedDeduplication"] = "true" if attrs.get("content_dedupe") else "false"
    return {name: value for name, value in values.items() if name in wanted}
