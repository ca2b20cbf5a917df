"""Queue URLs and ARNs in Pushgate: the AWS account id is the tenant.

A queue URL is ``<gateway base URL>/<tenant>/<queue>`` (as AWS's
``https://sqs.<region>.amazonaws.com/<account>/<queue>``), and a queue ARN is
``arn:aws:sqs:<region>:<tenant>:<queue>``. The host of a URL a client sends back is not
checked: a URL made behind a proxy or with another endpoint name names the same queue.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from backend_store.types import QueueName, TenantId

from .errors import SqsError

# Pushgate has no regions; ARNs name this one so that they parse as AWS's do.
DEFAULT_REGION = "us-east-1"


def queue_url(base_url: str, tenant: TenantId, queue: QueueName) -> str:
    """The queue URL for ``tenant``'s ``queue`` behind the gateway at ``base_url``."""
    return f"{base_url.rstrip('/')}/{tenant}/{queue}"


def parse_queue_url(url: object) -> tuple[TenantId, QueueName]:
    """The tenant and queue a queue URL names (``QueueDoesNotExist`` if it names none)."""
    if not isinstance(url, str) or not url:
        raise SqsError("MissingParameter", "The request must contain the parameter QueueUrl.")
    path = urlsplit(url).path if "://" in url else url
    parts = [p for p in path.split("/") if p]
    if len(parts) != 2:
        raise SqsError("QueueDoesNotExist", "The specified queue does not exist.")
    return TenantId(parts[0]), QueueName(parts[1])


def queue_arn(tenant: TenantId, queue: QueueName, region: str = DEFAULT_REGION) -> str:
    """The ARN AWS would give ``tenant``'s ``queue`` (account id = tenant)."""
    return f"arn:aws:sqs:{region}:{tenant}:{queue}"


def parse_queue_arn(arn: str) -> tuple[TenantId, QueueName]:
    """The tenant and queue of an SQS ARN (``InvalidParameterValue`` if it is not one)."""
    parts = arn.split(":")
    if len(parts) != 6 or parts[:3] != ["arn", "aws", "sqs"] or not parts[4] or not parts[5]:
        raise SqsError("InvalidParameterValue", f"Value {arn} for parameter is not a valid SQS ARN.")
    return TenantId(parts[4]), QueueName(parts[5])
