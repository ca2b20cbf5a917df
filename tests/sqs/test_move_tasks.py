"""Message move tasks (dead-letter redrive) through boto3 (JSON protocol: Debian's older query
model predates these actions; tests/sqs/test_query.py sends them as raw query requests)."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from botocore.exceptions import ClientError  # type: ignore[import-untyped]

from tests.gateway.conftest import RunningGateway
from tests.sqs.conftest import aws_credentials, sqs_client


@pytest.fixture(scope="module")
def client(gateway: RunningGateway) -> Any:
    _, access_key_id, secret = aws_credentials(gateway, "admin send:* receive:*")
    return sqs_client(gateway, access_key_id, secret)


def _dead_lettered(client: Any, name: str, count: int) -> tuple[str, str, str]:
    """A queue whose ``count`` messages were dead-lettered: (source URL, DLQ URL, DLQ ARN)."""
    dlq = client.create_queue(QueueName=f"{name}-dlq")["QueueUrl"]
    arn = client.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    policy = json.dumps({"deadLetterTargetArn": arn, "maxReceiveCount": 1})
    source = client.create_queue(QueueName=name, Attributes={"RedrivePolicy": policy})["QueueUrl"]
    client.send_message_batch(
        QueueUrl=source, Entries=[{"Id": f"m{i}", "MessageBody": f"m{i}"} for i in range(count)]
    )
    received = 0
    while received < count:
        received += len(
            client.receive_message(QueueUrl=source, MaxNumberOfMessages=10, VisibilityTimeout=0)["Messages"]
        )
    # The next receives move them (each was received once, max_receives is 1).
    assert client.receive_message(QueueUrl=source, MaxNumberOfMessages=10).get("Messages", []) == []
    deadline = time.monotonic() + 10
    while _visible(client, dlq) < count:
        assert time.monotonic() < deadline
        client.receive_message(QueueUrl=source, MaxNumberOfMessages=10, WaitTimeSeconds=1)
    return source, dlq, arn


def _visible(client: Any, url: str) -> int:
    attrs = client.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])
    return int(attrs["Attributes"]["ApproximateNumberOfMessages"])


def _wait_for(client: Any, arn: str, status: str) -> dict[str, Any]:
    deadline = time.monotonic() + 15
    while True:
        [task] = client.list_message_move_tasks(SourceArn=arn)["Results"]
        if task["Status"] == status:
            return dict(task)
        assert time.monotonic() < deadline, task
        time.sleep(0.1)


def test_a_move_task_moves_dead_letters_back_to_their_queue(client: Any) -> None:
    name = f"move-{time.monotonic_ns() % 10**9}"
    source, dlq, arn = _dead_lettered(client, name, 5)
    handle = client.start_message_move_task(SourceArn=arn)["TaskHandle"]
    task = _wait_for(client, arn, "COMPLETED")
    assert task["TaskHandle"] == handle
    assert (task["ApproximateNumberOfMessagesMoved"], task["ApproximateNumberOfMessagesToMove"]) == (5, 5)
    assert task["DestinationArn"].endswith(f":default:{name}")
    assert _visible(client, dlq) == 0
    assert _visible(client, source) == 5
    with pytest.raises(ClientError) as not_a_dlq:
        client.start_message_move_task(SourceArn=task["DestinationArn"])
    assert not_a_dlq.value.response["Error"]["Code"] == "InvalidParameterValue"


def test_a_cancelled_move_task_stops_and_moved_messages_stay_moved(client: Any) -> None:
    name = f"cancel-{time.monotonic_ns() % 10**9}"
    source, dlq, arn = _dead_lettered(client, name, 6)
    handle = client.start_message_move_task(SourceArn=arn, MaxNumberOfMessagesPerSecond=1)["TaskHandle"]
    with pytest.raises(ClientError) as second:
        client.start_message_move_task(SourceArn=arn)
    assert second.value.response["Error"]["Code"] == "InvalidParameterValue"  # one task per source
    moved = client.cancel_message_move_task(TaskHandle=handle)["ApproximateNumberOfMessagesMoved"]
    assert moved < 6
    task = _wait_for(client, arn, "CANCELLED")
    assert task["ApproximateNumberOfMessagesMoved"] < 6
    assert _visible(client, source) + _visible(client, dlq) == 6  # none lost, none doubled
    with pytest.raises(ClientError) as gone:
        client.cancel_message_move_task(TaskHandle=handle)
    assert gone.value.response["Error"]["Code"] == "ResourceNotFoundException"
