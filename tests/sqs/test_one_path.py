"""SQS calls go through the one send path and every rule of the other doors (issue 26).

One real gateway; boto3 (AWS JSON 1.0) against it. The tenant's stored-messages quota and a
per-queue rate refuse SQS sends as they refuse ``/v1`` and WebSocket sends (as AWS errors:
``OverLimit``, ``RequestThrottled``), and what SQS stores, refuses or delivers is recorded in
the usage records and the metrics like any other door's, under transport ``sqs``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from botocore.exceptions import ClientError  # type: ignore[import-untyped]

from tests.conftest import scaled
from tests.gateway.conftest import RunningGateway, start_gateway
from tests.usage.test_observe_wiring import scraped_errors, take

from .conftest import aws_credentials, sqs_client


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    running = start_gateway(tmp_path_factory.mktemp("sqs-one-path"))
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def sqs(gateway: RunningGateway) -> Any:
    _, access_key_id, secret = aws_credentials(gateway, "admin send:* receive:*")
    return sqs_client(gateway, access_key_id, secret)


@pytest.fixture
def admin(gateway: RunningGateway) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {gateway.admin_key}"}
    with httpx.Client(base_url=gateway.url, headers=headers, timeout=scaled(30)) as client:
        yield client
        # Each test sets its own limits; the next starts without them.
        assert (
            client.put("/v1/limits", json={"max_stored_messages": None, "per_queue": None}).status_code == 200
        )


def _code(exc: pytest.ExceptionInfo[ClientError]) -> tuple[str, int]:
    response = exc.value.response
    return str(response["Error"]["Code"]), int(response["ResponseMetadata"]["HTTPStatusCode"])


def test_the_stored_messages_quota_refuses_sqs_sends_as_every_door(sqs: Any, admin: httpx.Client) -> None:
    url = sqs.create_queue(QueueName="quota")["QueueUrl"]
    assert admin.put("/v1/limits", json={"max_stored_messages": 4}).status_code == 200
    for i in range(3):
        sqs.send_message(QueueUrl=url, MessageBody=f"m{i}")
    # A /v1 send takes the fourth place; SQS's next send is refused, as /v1's would be.
    assert admin.post("/v1/queues/quota/messages", json={"body": "v1"}).status_code == 201
    with pytest.raises(ClientError) as over:
        sqs.send_message(QueueUrl=url, MessageBody="fifth")
    assert _code(over) == ("OverLimit", 403)
    # A batch is one request, refused whole, as a /v1 batch is (docs/throttling.md).
    with pytest.raises(ClientError) as whole:
        sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": str(k), "MessageBody": "b"} for k in range(2)])
    assert _code(whole) == ("OverLimit", 403)
    assert admin.get("/v1/queues/quota").json()["stats"]["visible"] == 4
    sqs.delete_queue(QueueUrl=url)


def test_a_per_queue_rate_throttles_sqs_sends(sqs: Any, admin: httpx.Client) -> None:
    url = sqs.create_queue(QueueName="rated")["QueueUrl"]
    assert admin.put("/v1/limits", json={"per_queue": {"send": "3/hour"}}).status_code == 200
    for i in range(3):
        sqs.send_message(QueueUrl=url, MessageBody=f"m{i}")
    with pytest.raises(ClientError) as throttled:
        sqs.send_message(QueueUrl=url, MessageBody="fourth")
    assert _code(throttled) == ("RequestThrottled", 400)
    # The same counter as /v1's: a /v1 send to that queue is refused too.
    assert admin.post("/v1/queues/rated/messages", json={"body": "v1"}).status_code == 429
    sqs.delete_queue(QueueUrl=url)


def test_sqs_sends_receives_and_deletes_are_in_the_usage_records_and_the_metrics(
    sqs: Any, gateway: RunningGateway, admin: httpx.Client
) -> None:
    url = sqs.create_queue(QueueName="counted")["QueueUrl"]
    take(gateway)
    errors_before = scraped_errors(gateway)
    sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": str(i), "MessageBody": "abc"} for i in range(3)])
    got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
    assert len(got) == 3
    deleted = sqs.delete_message_batch(
        QueueUrl=url, Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(got)]
    )
    assert len(deleted["Successful"]) == 3
    with pytest.raises(ClientError):
        sqs.delete_message(QueueUrl=url, ReceiptHandle="bogus")
    totals = take(gateway)
    assert totals[("counted", "send", "sqs", "ok")] == (3, 9)
    assert totals[("counted", "receive", "sqs", "ok")] == (3, 9)
    assert totals[("counted", "ack", "sqs", "ok")][0] == 3
    grew = {
        k: v - errors_before.get(k, 0)
        for k, v in scraped_errors(gateway).items()
        if v != errors_before.get(k, 0)
    }
    assert [k for k in grew if k[:2] == ("ack", "sqs")], grew
    sqs.delete_queue(QueueUrl=url)
