"""AWS's SQS error codes and HTTP statuses, mapped in one place from Pushgate's codes.

An AWS JSON 1.0 error is a body ``{"__type": "com.amazonaws.sqs#<Type>", "message": ...}``
and, because SQS is "query compatible", a header ``x-amzn-query-error: <QueryCode>;<Fault>``
from which botocore takes the ``Code`` older code compares against (for example
``AWS.SimpleQueueService.NonExistentQueue``). Both come from :data:`AWS_ERRORS`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from backend_store.errors import PushgateError


@dataclass(frozen=True, slots=True)
class AwsError:
    """One AWS error: its JSON type, its query-protocol code, its HTTP status and fault side."""

    type: str
    query_code: str
    status: int
    sender: bool = True
    # The message the query protocol answers with, where AWS has one of its own.
    query_message: str | None = None


_INVALID_PARAMETER = AwsError("InvalidParameterValue", "InvalidParameterValue", 400)

# AWS's own errors, by the name this package raises them under.
AWS_ERRORS: dict[str, AwsError] = {
    "QueueDoesNotExist": AwsError(
        "QueueDoesNotExist",
        "AWS.SimpleQueueService.NonExistentQueue",
        400,
        query_message="The specified queue does not exist for this wsdl version.",
    ),
    "QueueNameExists": AwsError("QueueNameExists", "QueueAlreadyExists", 400),
    "ReceiptHandleIsInvalid": AwsError("ReceiptHandleIsInvalid", "ReceiptHandleIsInvalid", 400),
    "InvalidParameterValue": _INVALID_PARAMETER,
    "MissingParameter": AwsError("MissingParameter", "MissingParameter", 400),
    "InvalidAction": AwsError("InvalidAction", "InvalidAction", 400),
    "InvalidAttributeName": AwsError("InvalidAttributeName", "InvalidAttributeName", 400),
    "TooManyEntriesInBatchRequest": AwsError(
        "TooManyEntriesInBatchRequest", "AWS.SimpleQueueService.TooManyEntriesInBatchRequest", 400
    ),
    "EmptyBatchRequest": AwsError("EmptyBatchRequest", "AWS.SimpleQueueService.EmptyBatchRequest", 400),
    "BatchEntryIdsNotDistinct": AwsError(
        "BatchEntryIdsNotDistinct", "AWS.SimpleQueueService.BatchEntryIdsNotDistinct", 400
    ),
    "BatchRequestTooLong": AwsError("BatchRequestTooLong", "AWS.SimpleQueueService.BatchRequestTooLong", 400),
    "InvalidBatchEntryId": AwsError("InvalidBatchEntryId", "AWS.SimpleQueueService.InvalidBatchEntryId", 400),
    "InvalidClientTokenId": AwsError("InvalidClientTokenId", "InvalidClientTokenId", 403),
    "SignatureDoesNotMatch": AwsError("SignatureDoesNotMatch", "SignatureDoesNotMatch", 403),
    "IncompleteSignature": AwsError("IncompleteSignature", "IncompleteSignature", 403),
    "MissingAuthenticationToken": AwsError("MissingAuthenticationToken", "MissingAuthenticationToken", 403),
    "AccessDenied": AwsError("AccessDenied", "AccessDenied", 403),
    "ResourceNotFoundException": AwsError("ResourceNotFoundException", "ResourceNotFoundException", 400),
    "UnsupportedOperation": AwsError(
        "UnsupportedOperation", "AWS.SimpleQueueService.UnsupportedOperation", 400
    ),
    "InvalidAttributeValue": AwsError("InvalidAttributeValue", "InvalidAttributeValue", 400),
    "InvalidMessageContents": AwsError("InvalidMessageContents", "InvalidMessageContents", 400),
    "RequestThrottled": AwsError("RequestThrottled", "RequestThrottled", 400),
    "OverLimit": AwsError("OverLimit", "OverLimit", 403),
    "ServiceUnavailable": AwsError("ServiceUnavailable", "ServiceUnavailable", 503, sender=False),
    "InternalFailure": AwsError("InternalFailure", "InternalFailure", 500, sender=False),
}

# Pushgate's stable error codes (backend_store/errors.py, gateway/errors.py) as AWS names them.
FROM_PUSHGATE: dict[str, str] = {
    "invalid_request": "InvalidParameterValue",
    "invalid_receipt": "ReceiptHandleIsInvalid",
    "unauthorized": "InvalidClientTokenId",
    "forbidden": "AccessDenied",
    "not_found": "QueueDoesNotExist",
    "queue_not_found": "QueueDoesNotExist",
    "queue_exists": "QueueNameExists",
    "queue_full": "OverLimit",
    "quota_exceeded": "OverLimit",
    "message_too_large": "InvalidParameterValue",
    "rate_limited": "RequestThrottled",
    "unavailable": "ServiceUnavailable",
    "replication_gap": "ServiceUnavailable",
    "stale_epoch": "ServiceUnavailable",
    "request_too_large": "InvalidParameterValue",
}


class SqsError(Exception):
    """An error answered in AWS's terms: ``name`` is a key of :data:`AWS_ERRORS`."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(message)
        self.aws = AWS_ERRORS[name]
        self.message = message

    @classmethod
    def from_pushgate(cls, error: PushgateError) -> SqsError:
        """Pushgate's error in AWS's terms (an unknown code is AWS's InternalFailure)."""
        return cls(FROM_PUSHGATE.get(error.code, "InternalFailure"), str(error.detail))

    def response(self) -> tuple[int, dict[str, str], bytes]:
        """The HTTP status, headers and JSON body AWS answers this error with."""
        fault = "Sender" if self.aws.sender else "Receiver"
        headers = {
            "content-type": "application/x-amz-json-1.0",
            "x-amzn-query-error": f"{self.aws.query_code};{fault}",
        }
        body = {"__type": f"com.amazonaws.sqs#{self.aws.type}", "message": self.message}
        return self.aws.status, headers, json.dumps(body).encode()
