"""The SQS API through real boto3 against a real gateway: actions, batches, long-poll, errors."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Any

import pytest
from botocore.exceptions import ClientError  # type: ignore[import-untyped]

from gateway.sqs.md5 import md5_of_attributes, md5_of_body
from tests.gateway.conftest import RunningGateway

_n = itertools.count()


def _name() -> str:
    return f"sqs{next(_n)}-{time.monotonic_ns() % 10**9}"


def _code(exc: pytest.ExceptionInfo[ClientError]) -> str:
    return str(exc.value.response["Error"]["Code"])


def test_queue_lifecycle(sqs: Any, gateway: RunningGateway) -> None:
    name = _name()
    url = sqs.create_queue(QueueName=name, Attributes={"VisibilityTimeout": "45"})["QueueUrl"]
    assert url == f"{gateway.url}/default/{name}"
    assert sqs.get_queue_url(QueueName=name)["QueueUrl"] == url
    assert url in sqs.list_queues(QueueNamePrefix=name)["QueueUrls"]
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attrs["VisibilityTimeout"] == "45"
    assert attrs["QueueArn"] == f"arn:aws:sqs:us-east-1:default:{name}"
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"DelaySeconds": "0", "VisibilityTimeout": "10"})
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["VisibilityTimeout"])["Attributes"]
    assert attrs == {"VisibilityTimeout": "10"}
    sqs.send_message(QueueUrl=url, MessageBody="x")
    sqs.purge_queue(QueueUrl=url)
    assert sqs.receive_message(QueueUrl=url).get("Messages", []) == []
    sqs.delete_queue(QueueUrl=url)
    with pytest.raises(ClientError) as gone:
        sqs.get_queue_url(QueueName=name)
    assert _code(gone) == "AWS.SimpleQueueService.NonExistentQueue"


def test_list_queues_pages_with_max_results_and_next_token(sqs: Any) -> None:
    prefix = _name()
    urls = [sqs.create_queue(QueueName=f"{prefix}-{i}")["QueueUrl"] for i in range(5)]
    first = sqs.list_queues(QueueNamePrefix=prefix, MaxResults=2)
    assert first["QueueUrls"] == urls[:2] and first["NextToken"]
    # boto3's own paginator follows NextToken to the end, each queue once, in name order.
    pages = sqs.get_paginator("list_queues").paginate(
        QueueNamePrefix=prefix, PaginationConfig={"PageSize": 2}
    )
    seen = [url for page in pages for url in page.get("QueueUrls", [])]
    assert seen == urls
    last = sqs.list_queues(QueueNamePrefix=prefix, MaxResults=5)
    assert last["QueueUrls"] == urls and "NextToken" not in last
    for url in urls:
        sqs.delete_queue(QueueUrl=url)


def test_send_receive_delete_with_md5s(sqs: Any) -> None:
    url = sqs.create_queue(QueueName=_name())["QueueUrl"]
    attributes = {"kind": {"DataType": "String", "StringValue": "order"}}
    sent = sqs.send_message(QueueUrl=url, MessageBody="héllo", MessageAttributes=attributes)
    assert sent["MD5OfMessageBody"] == md5_of_body("héllo")
    assert sent["MD5OfMessageAttributes"] == md5_of_attributes(attributes)
    got = sqs.receive_message(
        QueueUrl=url,
        MessageAttributeNames=["All"],
        AttributeNames=["ApproximateReceiveCount", "SentTimestamp"],
    )["Messages"]
    assert [m["Body"] for m in got] == ["héllo"]
    assert got[0]["MessageId"] == sent["MessageId"]
    assert got[0]["MD5OfBody"] == sent["MD5OfMessageBody"]
    assert got[0]["MessageAttributes"] == {"kind": {"DataType": "String", "StringValue": "order"}}
    assert got[0]["MD5OfMessageAttributes"] == sent["MD5OfMessageAttributes"]
    assert got[0]["Attributes"]["ApproximateReceiveCount"] == "1"
    sqs.delete_message(QueueUrl=url, ReceiptHandle=got[0]["ReceiptHandle"])
    with pytest.raises(ClientError) as twice:
        sqs.delete_message(QueueUrl=url, ReceiptHandle="not-a-receipt")
    assert _code(twice) == "ReceiptHandleIsInvalid"


def test_batches_with_a_partial_failure(sqs: Any) -> None:
    url = sqs.create_queue(QueueName=_name())["QueueUrl"]
    out = sqs.send_message_batch(
        QueueUrl=url,
        Entries=[
            {"Id": "a", "MessageBody": "one"},
            {"Id": "b", "MessageBody": "two", "DelaySeconds": 5000},
            {"Id": "c", "MessageBody": "three"},
        ],
    )
    assert sorted(e["Id"] for e in out["Successful"]) == ["a", "c"]
    assert [(e["Id"], e["Code"], e["SenderFault"]) for e in out["Failed"]] == [
        ("b", "InvalidParameterValue", True)
    ]
    got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
    assert sorted(m["Body"] for m in got) == ["one", "three"]
    deleted = sqs.delete_message_batch(
        QueueUrl=url,
        Entries=[
            {"Id": "x", "ReceiptHandle": got[0]["ReceiptHandle"]},
            {"Id": "y", "ReceiptHandle": "bogus"},
        ],
    )
    assert [e["Id"] for e in deleted["Successful"]] == ["x"]
    assert [(e["Id"], e["Code"]) for e in deleted["Failed"]] == [("y", "ReceiptHandleIsInvalid")]
    changed = sqs.change_message_visibility_batch(
        QueueUrl=url, Entries=[{"Id": "v", "ReceiptHandle": got[1]["ReceiptHandle"], "VisibilityTimeout": 0}]
    )
    assert [e["Id"] for e in changed["Successful"]] == ["v"]
    again = sqs.receive_message(QueueUrl=url)["Messages"]
    assert [m["Body"] for m in again] == [got[1]["Body"]]
    with pytest.raises(ClientError) as too_many:
        sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": f"e{i}", "MessageBody": "x"} for i in range(11)])
    assert _code(too_many) == "AWS.SimpleQueueService.TooManyEntriesInBatchRequest"
    with pytest.raises(ClientError) as same:
        sqs.send_message_batch(
            QueueUrl=url, Entries=[{"Id": "d", "MessageBody": "x"}, {"Id": "d", "MessageBody": "y"}]
        )
    assert _code(same) == "AWS.SimpleQueueService.BatchEntryIdsNotDistinct"
    small = sqs.create_queue(QueueName=_name(), Attributes={"MaximumMessageSize": "1024"})["QueueUrl"]
    with pytest.raises(ClientError) as too_long:
        sqs.send_message_batch(
            QueueUrl=small, Entries=[{"Id": f"e{i}", "MessageBody": "x" * 600} for i in range(2)]
        )
    assert _code(too_long) == "AWS.SimpleQueueService.BatchRequestTooLong"


def test_visibility_timeout_and_change(sqs: Any) -> None:
    url = sqs.create_queue(QueueName=_name())["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="v")
    first = sqs.receive_message(QueueUrl=url, VisibilityTimeout=30)["Messages"][0]
    assert sqs.receive_message(QueueUrl=url).get("Messages", []) == []
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=first["ReceiptHandle"], VisibilityTimeout=0)
    second = sqs.receive_message(QueueUrl=url, AttributeNames=["All"])["Messages"][0]
    assert second["MessageId"] == first["MessageId"]
    assert second["Attributes"]["ApproximateReceiveCount"] == "2"


def test_long_poll_returns_when_a_message_arrives(sqs: Any, make_client: Callable[[str], Any]) -> None:
    url = sqs.create_queue(QueueName=_name())["QueueUrl"]
    import threading

    def later() -> None:
        time.sleep(0.5)
        sqs.send_message(QueueUrl=url, MessageBody="late")

    sender = threading.Thread(target=later)
    started = time.monotonic()
    sender.start()
    got = make_client("receive:*").receive_message(QueueUrl=url, WaitTimeSeconds=10)["Messages"]
    sender.join()
    assert [m["Body"] for m in got] == ["late"]
    assert 0.4 < time.monotonic() - started < 8


def test_scopes_apply_and_bad_credentials_are_refused(
    sqs: Any, gateway: RunningGateway, make_client: Callable[[str], Any]
) -> None:
    from tests.sqs.conftest import sqs_client

    url = sqs.create_queue(QueueName=_name())["QueueUrl"]
    with pytest.raises(ClientError) as denied:
        make_client("receive:*").send_message(QueueUrl=url, MessageBody="x")
    assert _code(denied) == "AccessDenied"
    assert denied.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    with pytest.raises(ClientError) as unknown:
        sqs_client(gateway, "AKPG0000000000000000", "whatever").list_queues()
    assert _code(unknown) == "InvalidClientTokenId"
    good = sqs._request_signer._credentials.access_key
    with pytest.raises(ClientError) as wrong:
        sqs_client(gateway, good, "wrong-secret").list_queues()
    assert _code(wrong) == "SignatureDoesNotMatch"


def test_unsigned_and_bad_requests_get_sqs_errors(gateway: RunningGateway, sqs: Any) -> None:
    import httpx

    unsigned = httpx.post(
        gateway.url + "/",
        headers={"X-Amz-Target": "AmazonSQS.ListQueues", "Content-Type": "application/x-amz-json-1.0"},
        content=b"{}",
    )
    assert unsigned.status_code == 403
    assert unsigned.json()["__type"] == "com.amazonaws.sqs#MissingAuthenticationToken"
    with pytest.raises(ClientError) as bad:
        sqs.receive_message(QueueUrl=sqs.create_queue(QueueName=_name())["QueueUrl"], MaxNumberOfMessages=11)
    assert _code(bad) == "InvalidParameterValue"


def test_revoking_the_api_key_revokes_its_aws_credentials(gateway: RunningGateway) -> None:
    from tests.sqs.conftest import sqs_client

    authenticator = gateway.services.authenticator
    key, _ = gateway.call(authenticator.api_keys.create("default", "receive:*"))
    access_key_id, secret = gateway.call(authenticator.aws_keys.create(key.key_id))
    client = sqs_client(gateway, access_key_id, secret)
    client.list_queues()
    gateway.call(authenticator.api_keys.revoke(key.key_id))
    with pytest.raises(ClientError) as revoked:
        client.list_queues()
    assert _code(revoked) == "InvalidClientTokenId"
