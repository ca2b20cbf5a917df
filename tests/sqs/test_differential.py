"""One script, two servers: moto in server mode (a reference for AWS's answers, not part of the
product) and Pushgate. What each step answers is reduced to what must agree (the shape of the
answer, attribute names, checksums, error codes and HTTP statuses) and the two lists compared.

Values that are each server's own (ids, receipts, URLs, timestamps) are compared as shapes only.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import boto3  # type: ignore[import-untyped]
import pytest
from botocore.exceptions import ClientError  # type: ignore[import-untyped]

from gateway.local_ports import free_port
from tests.gateway.conftest import RunningGateway
from tests.sqs.conftest import aws_credentials

# Answer fields whose values must be equal on both servers (checksums, counts, bodies...).
EXACT = frozenset(
    {
        "MD5OfMessageBody",
        "MD5OfBody",
        "MD5OfMessageAttributes",
        "Body",
        "ApproximateReceiveCount",
        "MessageGroupId",
        "Id",
        "Code",
        "SenderFault",
        "Tags",
        "MessageAttributes",
        "VisibilityTimeout",
        "DelaySeconds",
        "MaximumMessageSize",
        "MessageRetentionPeriod",
        "ReceiveMessageWaitTimeSeconds",
        "FifoQueue",
        "ContentBasedDeduplication",
        "ApproximateNumberOfMessages",
        "ApproximateNumberOfMessagesNotVisible",
    }
)


def shape(value: Any, key: str = "") -> Any:
    """What must agree: exact values for :data:`EXACT` fields, types (and keys) otherwise."""
    if key in EXACT:
        return value
    if isinstance(value, dict):
        return {k: shape(v, k) for k, v in sorted(value.items()) if k != "ResponseMetadata"}
    if isinstance(value, list):
        return [shape(v) for v in value]
    return type(value).__name__


Step = Callable[[Any, dict[str, str]], Any]


def observe(client: Any, call: Step, state: dict[str, str]) -> Any:
    try:
        return shape(call(client, state))
    except ClientError as exc:
        error = exc.response["Error"]
        return {"error": error["Code"], "status": exc.response["ResponseMetadata"]["HTTPStatusCode"]}


def _attrs(names: list[str]) -> Step:
    return lambda c, s: c.get_queue_attributes(QueueUrl=s["url"], AttributeNames=names)


TYPED = {
    "s": {"DataType": "String", "StringValue": "v"},
    "n": {"DataType": "Number", "StringValue": "12.5"},
    "b": {"DataType": "Binary", "BinaryValue": b"\x01\x02"},
}


def _remember(key: str, field: str, call: Step) -> Step:
    def step(c: Any, s: dict[str, str]) -> Any:
        out = call(c, s)
        s[key] = out[field] if field != "receipt" else out["Messages"][0]["ReceiptHandle"]
        return out

    return step


SCRIPT: list[tuple[str, Step]] = [
    # Pushgate's default MaximumMessageSize is 256 KiB, AWS's 1 MiB since 2025 (docs/sqs.md).
    (
        "create",
        _remember(
            "url",
            "QueueUrl",
            lambda c, s: c.create_queue(QueueName="diff-std", Attributes={"MaximumMessageSize": "262144"}),
        ),
    ),
    (
        "create again",
        lambda c, s: c.create_queue(QueueName="diff-std", Attributes={"MaximumMessageSize": "262144"}),
    ),
    ("get url", lambda c, s: c.get_queue_url(QueueName="diff-std")),
    ("missing queue", lambda c, s: c.get_queue_url(QueueName="diff-nope")),
    ("bad name", lambda c, s: c.create_queue(QueueName="bad name!")),
    (
        "set attributes",
        lambda c, s: c.set_queue_attributes(QueueUrl=s["url"], Attributes={"VisibilityTimeout": "40"}),
    ),
    ("some attributes", _attrs(["VisibilityTimeout", "DelaySeconds", "QueueArn"])),
    ("unknown attribute", _attrs(["NoSuchThing"])),
    ("all attributes", _attrs(["All"])),
    ("send", lambda c, s: c.send_message(QueueUrl=s["url"], MessageBody="héllo", MessageAttributes=TYPED)),
    (
        "send batch",
        lambda c, s: c.send_message_batch(
            QueueUrl=s["url"], Entries=[{"Id": "a", "MessageBody": "one"}, {"Id": "b", "MessageBody": "two"}]
        ),
    ),
    (
        "batch too big",
        lambda c, s: c.send_message_batch(
            QueueUrl=s["url"], Entries=[{"Id": f"e{i}", "MessageBody": "x"} for i in range(11)]
        ),
    ),
    (
        "batch ids repeat",
        lambda c, s: c.send_message_batch(
            QueueUrl=s["url"], Entries=[{"Id": "d", "MessageBody": "x"}, {"Id": "d", "MessageBody": "y"}]
        ),
    ),
    ("counts", _attrs(["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"])),
    (
        "receive",
        _remember(
            "receipt",
            "receipt",
            lambda c, s: c.receive_message(
                QueueUrl=s["url"], MessageAttributeNames=["All"], AttributeNames=["ApproximateReceiveCount"]
            ),
        ),
    ),
    ("receive too many", lambda c, s: c.receive_message(QueueUrl=s["url"], MaxNumberOfMessages=11)),
    (
        "delete batch, one bad",
        lambda c, s: c.delete_message_batch(
            QueueUrl=s["url"],
            Entries=[{"Id": "ok", "ReceiptHandle": s["receipt"]}, {"Id": "bad", "ReceiptHandle": "garbage"}],
        ),
    ),
    ("tag", lambda c, s: c.tag_queue(QueueUrl=s["url"], Tags={"team": "core", "env": "t"})),
    ("untag", lambda c, s: c.untag_queue(QueueUrl=s["url"], TagKeys=["env"])),
    ("list tags", lambda c, s: c.list_queue_tags(QueueUrl=s["url"])),
    ("dlq", _remember("dlq", "QueueUrl", lambda c, s: c.create_queue(QueueName="diff-dlq"))),
    (
        "redrive policy",
        lambda c, s: c.set_queue_attributes(
            QueueUrl=s["url"],
            Attributes={
                "RedrivePolicy": json.dumps(
                    {
                        "deadLetterTargetArn": c.get_queue_attributes(
                            QueueUrl=s["dlq"], AttributeNames=["QueueArn"]
                        )["Attributes"]["QueueArn"],
                        "maxReceiveCount": 3,
                    }
                )
            },
        ),
    ),
    ("dead letter sources", lambda c, s: c.list_dead_letter_source_queues(QueueUrl=s["dlq"])),
    (
        "fifo without the suffix",
        lambda c, s: c.create_queue(QueueName="diff-plain", Attributes={"FifoQueue": "true"}),
    ),
    (
        "fifo",
        _remember(
            "fifo",
            "QueueUrl",
            lambda c, s: c.create_queue(QueueName="diff.fifo", Attributes={"FifoQueue": "true"}),
        ),
    ),
    (
        "fifo attributes",
        lambda c, s: c.get_queue_attributes(
            QueueUrl=s["fifo"], AttributeNames=["FifoQueue", "ContentBasedDeduplication"]
        ),
    ),
    ("fifo no group", lambda c, s: c.send_message(QueueUrl=s["fifo"], MessageBody="x")),
    (
        "fifo no dedupe id",
        lambda c, s: c.send_message(QueueUrl=s["fifo"], MessageBody="x", MessageGroupId="g"),
    ),
    (
        "fifo send",
        lambda c, s: c.send_message(
            QueueUrl=s["fifo"], MessageBody="x", MessageGroupId="g", MessageDeduplicationId="1"
        ),
    ),
    ("fifo receive", lambda c, s: c.receive_message(QueueUrl=s["fifo"], AttributeNames=["MessageGroupId"])),
    ("purge", lambda c, s: c.purge_queue(QueueUrl=s["dlq"])),
    ("delete", lambda c, s: c.delete_queue(QueueUrl=s["dlq"])),
    ("deleted", lambda c, s: c.get_queue_url(QueueName="diff-dlq")),
]


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


def _client(url: str, access_key_id: str, secret: str) -> Any:
    return boto3.client(
        "sqs",
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id=access_key_id,
        aws_secret_access_key=secret,
    )


def test_pushgate_answers_as_moto_does(gateway: RunningGateway, moto_url: str) -> None:
    gateway.call(gateway.services.authenticator.tenants.create("differential"))  # queue names of its own
    _, access_key_id, secret = aws_credentials(gateway, "admin send:* receive:*", tenant="differential")
    clients = {
        "moto": _client(moto_url, "AKIDMOTO", "moto-secret"),
        "pushgate": _client(gateway.url, access_key_id, secret),
    }
    answers: dict[str, list[Any]] = {}
    for server, client in clients.items():
        state: dict[str, str] = {}
        answers[server] = [(name, observe(client, step, state)) for name, step in SCRIPT]
    differences = [
        (name, reference, ours)
        for (name, reference), (_, ours) in zip(answers["moto"], answers["pushgate"], strict=True)
        if reference != ours
    ]
    assert differences == [], "\n".join(map(str, differences))
