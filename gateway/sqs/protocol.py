"""The AWS JSON 1.0 protocol: parse a request, build its answer (and what both protocols share).

A request is ``POST /`` with ``X-Amz-Target: AmazonSQS.<Action>`` and a JSON object body
(``Content-Type: application/x-amz-json-1.0``); an answer is a JSON object with the same
content type, or an error from :mod:`gateway.sqs.errors`. No I/O here: the route hands
bytes and headers in and sends what comes out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from .errors import SqsError

CONTENT_TYPE = "application/x-amz-json-1.0"
TARGET_PREFIX = "AmazonSQS."

# The actions served, on both protocols (docs/sqs.md); any other is AWS's InvalidAction.
ACTIONS = frozenset(
    {
        "CreateQueue",
        "GetQueueUrl",
        "ListQueues",
        "DeleteQueue",
        "GetQueueAttributes",
        "SetQueueAttributes",
        "PurgeQueue",
        "SendMessage",
        "SendMessageBatch",
        "ReceiveMessage",
        "DeleteMessage",
        "DeleteMessageBatch",
        "ChangeMessageVisibility",
        "ChangeMessageVisibilityBatch",
        "TagQueue",
        "UntagQueue",
        "ListQueueTags",
        "ListDeadLetterSourceQueues",
        "StartMessageMoveTask",
        "ListMessageMoveTasks",
        "CancelMessageMoveTask",
    }
)


@dataclass(frozen=True, slots=True)
class SqsRequest:
    """One parsed request: its action and its parameters."""

    action: str
    params: dict[str, Any]


def is_sqs_request(headers: Mapping[str, str]) -> bool:
    """Whether a ``POST /`` speaks this protocol (its target names AmazonSQS)."""
    return headers.get("x-amz-target", "").startswith(TARGET_PREFIX)


def parse_request(headers: Mapping[str, str], body: bytes) -> SqsRequest:
    """The action and parameters of a request, or the SqsError AWS would answer."""
    target = headers.get("x-amz-target", "")
    if not target.startswith(TARGET_PREFIX):
        raise SqsError("InvalidAction", "The request has no X-Amz-Target naming an AmazonSQS action.")
    action = target[len(TARGET_PREFIX) :]
    if action not in ACTIONS:
        raise SqsError("InvalidAction", f"The action {action} is not valid for this endpoint.")
    try:
        params = orjson.loads(body) if body.strip() else {}
    except (orjson.JSONDecodeError, UnicodeDecodeError):
        raise SqsError("InvalidParameterValue", "The request body is not valid JSON.") from None
    if not isinstance(params, dict):
        raise SqsError("InvalidParameterValue", "The request body must be a JSON object.")
    return SqsRequest(action, params)


def require(params: Mapping[str, Any], name: str) -> Any:
    """A parameter the action must have (AWS's MissingParameter otherwise)."""
    value = params.get(name)
    if value is None or value == "":
        raise SqsError("MissingParameter", f"The request must contain the parameter {name}.")
    return value


def int_param(
    params: Mapping[str, Any], name: str, low: int, high: int, default: int | None = None
) -> int | None:
    """An integer parameter within AWS's bounds (InvalidParameterValue outside them)."""
    value = params.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise SqsError(
            "InvalidParameterValue",
            f"Value {value} for parameter {name} is invalid. Reason: must be between {low} and {high}.",
        )
    return value


def response(result: Mapping[str, Any]) -> tuple[int, dict[str, str], bytes]:
    """The HTTP status, headers and body of a successful answer."""
    return 200, {"content-type": CONTENT_TYPE}, orjson.dumps(result)
