"""One declared shape per SQS action: every parameter's type, range and length, checked once.

:func:`check_params` runs on every request's parameters, JSON or query protocol alike,
before any action sees them, so no handler meets a value of the wrong type (a string where
AWS's model has a map, a number where it has a list): a value that does not fit is AWS's
``InvalidParameterValue`` naming the parameter, never a 500. The shapes are AWS's own model
for SQS (``botocore/data/sqs/2012-11-05``), written out for the actions served; parameters an
action does not know are ignored, as AWS's JSON protocol ignores them. Whether a required
parameter is present, and what a value means (a queue name's characters, a batch's ids), the
actions still decide, with AWS's own error codes for each.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import SqsError


@dataclass(frozen=True, slots=True)
class Str:
    max_chars: int | None = None


@dataclass(frozen=True, slots=True)
class Int:
    low: int
    high: int


@dataclass(frozen=True, slots=True)
class ListOf:
    item: Shape


@dataclass(frozen=True, slots=True)
class MapOf:
    value: Shape


@dataclass(frozen=True, slots=True)
class Struct:
    fields: dict[str, Shape] = field(default_factory=dict)


Shape = Str | Int | ListOf | MapOf | Struct

_STRING = Str()
_STRINGS = ListOf(_STRING)
_STRING_MAP = MapOf(_STRING)
QUEUE: dict[str, Shape] = {"QueueUrl": _STRING}
# MessageAttributeValue and MessageSystemAttributeValue (the same fields).
_ATTRIBUTE_VALUE = Struct(
    {
        "DataType": _STRING,
        "StringValue": _STRING,
        "BinaryValue": _STRING,  # base64 in both protocols
        "StringListValues": _STRINGS,
        "BinaryListValues": _STRINGS,
    }
)
_SEND_FIELDS: dict[str, Shape] = {
    "MessageBody": _STRING,
    "DelaySeconds": Int(0, 900),
    "MessageAttributes": MapOf(_ATTRIBUTE_VALUE),
    "MessageSystemAttributes": MapOf(_ATTRIBUTE_VALUE),
    "MessageDeduplicationId": Str(128),
    "MessageGroupId": Str(128),
}
_VISIBILITY = Int(0, 43200)
_PAGE: dict[str, Shape] = {"NextToken": _STRING, "MaxResults": Int(1, 1000)}
_ANY_INT = Int(-(2**63), 2**63 - 1)


def _entry(fields: dict[str, Shape]) -> ListOf:
    """A batch's entries: types only. A value out of range fails that entry alone (AWS's batch
    rule), and a bad ``Id`` is ``InvalidBatchEntryId``: the actions check both."""
    loose = {
        name: _ANY_INT if isinstance(shape, Int) else _STRING if isinstance(shape, Str) else shape
        for name, shape in fields.items()
    }
    return ListOf(Struct({"Id": _STRING, **loose}))


ACTION_SHAPES: dict[str, dict[str, Shape]] = {
    "CreateQueue": {"QueueName": Str(80), "Attributes": _STRING_MAP, "tags": _STRING_MAP},
    "GetQueueUrl": {"QueueName": Str(80), "QueueOwnerAWSAccountId": _STRING},
    "ListQueues": {"QueueNamePrefix": _STRING, **_PAGE},
    "DeleteQueue": QUEUE,
    "GetQueueAttributes": {**QUEUE, "AttributeNames": _STRINGS},
    "SetQueueAttributes": {**QUEUE, "Attributes": _STRING_MAP},
    "PurgeQueue": QUEUE,
    "SendMessage": {**QUEUE, **_SEND_FIELDS},
    "SendMessageBatch": {**QUEUE, "Entries": _entry(_SEND_FIELDS)},
    "ReceiveMessage": {
        **QUEUE,
        "AttributeNames": _STRINGS,
        "MessageSystemAttributeNames": _STRINGS,
        "MessageAttributeNames": _STRINGS,
        "MaxNumberOfMessages": Int(1, 10),
        "VisibilityTimeout": _VISIBILITY,
        "WaitTimeSeconds": Int(0, 20),
        "ReceiveRequestAttemptId": Str(128),
    },
    "DeleteMessage": {**QUEUE, "ReceiptHandle": _STRING},
    "DeleteMessageBatch": {**QUEUE, "Entries": _entry({"ReceiptHandle": _STRING})},
    "ChangeMessageVisibility": {**QUEUE, "ReceiptHandle": _STRING, "VisibilityTimeout": _VISIBILITY},
    "ChangeMessageVisibilityBatch": {
        **QUEUE,
        "Entries": _entry({"ReceiptHandle": _STRING, "VisibilityTimeout": _VISIBILITY}),
    },
    "TagQueue": {**QUEUE, "Tags": _STRING_MAP},
    "UntagQueue": {**QUEUE, "TagKeys": _STRINGS},
    "ListQueueTags": QUEUE,
    "ListDeadLetterSourceQueues": {**QUEUE, **_PAGE},
    "StartMessageMoveTask": {
        "SourceArn": _STRING,
        "DestinationArn": _STRING,
        "MaxNumberOfMessagesPerSecond": Int(1, 500),
    },
    "ListMessageMoveTasks": {"SourceArn": _STRING, "MaxResults": Int(1, 10)},
    "CancelMessageMoveTask": {"TaskHandle": _STRING},
}


def _invalid(path: str, value: Any, reason: str) -> SqsError:
    shown = repr(value) if isinstance(value, str | int | float | bool) else type(value).__name__
    if len(shown) > 64:
        shown = shown[:61] + "..."
    return SqsError(
        "InvalidParameterValue", f"Value {shown} for parameter {path} is invalid. Reason: {reason}."
    )


def _check(shape: Shape, value: Any, path: str) -> None:
    if value is None:
        return  # absent: whether it is required is the action's to say
    if isinstance(shape, Str):
        if not isinstance(value, str):
            raise _invalid(path, value, "must be a string")
        if shape.max_chars is not None and len(value) > shape.max_chars:
            raise _invalid(path, value, f"must be at most {shape.max_chars} characters")
    elif isinstance(shape, Int):
        if isinstance(value, bool) or not isinstance(value, int):
            raise _invalid(path, value, "must be an integer")
        if not shape.low <= value <= shape.high:
            raise _invalid(path, value, f"must be between {shape.low} and {shape.high}")
    elif isinstance(shape, ListOf):
        if not isinstance(value, list):
            raise _invalid(path, value, "must be a list")
        for i, item in enumerate(value, 1):
            _check(shape.item, item, f"{path}.{i}")
    elif isinstance(shape, MapOf):
        if not isinstance(value, Mapping):
            raise _invalid(path, value, "must be a map")
        for key, item in value.items():
            if not isinstance(key, str):
                raise _invalid(path, key, "its keys must be strings")
            _check(shape.value, item, f"{path}.{key[:64]}")
    else:
        if not isinstance(value, Mapping):
            raise _invalid(path, value, "must be a structure")
        for name, item_shape in shape.fields.items():
            _check(item_shape, value.get(name), f"{path}.{name}")


def check_params(action: str, params: Mapping[str, Any]) -> None:
    """Raise ``InvalidParameterValue`` unless every known parameter of ``action`` fits its shape."""
    for name, shape in ACTION_SHAPES[action].items():
        _check(shape, params.get(name), name)
