"""Narrow keys stay narrow on the SQS API (issue 47), through boto3 on both protocols."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from botocore.exceptions import ClientError  # type: ignore[import-untyped]

_n = itertools.count()


def _name() -> str:
    return f"mg{next(_n)}-{time.monotonic_ns() % 10**9}"


def _refused(call: Callable[[], Any]) -> str:
    with pytest.raises(ClientError) as refused:
        call()
    return str(refused.value.response["Error"]["Code"])


def _arn(sqs: Any, url: str) -> str:
    return str(sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"])


def test_a_send_key_cannot_redrive_its_messages_into_another_queue(
    sqs: Any, make_client: Callable[[str], Any]
) -> None:
    q1, q2 = _name(), _name()
    url1 = sqs.create_queue(QueueName=q1)["QueueUrl"]
    url2 = sqs.create_queue(QueueName=q2)["QueueUrl"]
    sender = make_client(f"send:{q1} receive:{q1}")
    assert _refused(lambda: sender.send_message(QueueUrl=url2, MessageBody="x")) == "AccessDenied"
    # The probe of issue 47: RedrivePolicy to q2 with maxReceiveCount 1 and VisibilityTimeout 0.
    policy = json.dumps({"deadLetterTargetArn": _arn(sqs, url2), "maxReceiveCount": 1})
    attack = {"RedrivePolicy": policy, "VisibilityTimeout": "0"}
    assert _refused(lambda: sender.set_queue_attributes(QueueUrl=url1, Attributes=attack)) == "AccessDenied"
    sender.send_message(QueueUrl=url1, MessageBody="mine")
    assert [m["Body"] for m in sender.receive_message(QueueUrl=url1)["Messages"]] == ["mine"]
    assert sqs.receive_message(QueueUrl=url2).get("Messages") is None  # nothing moved into q2


def test_create_queue_answers_an_existing_queue_to_any_scope_and_creates_only_with_manage(
    sqs: Any, make_client: Callable[[str], Any]
) -> None:
    name = _name()
    url = sqs.create_queue(QueueName=name, Attributes={"VisibilityTimeout": "45"})["QueueUrl"]
    receiver = make_client(f"receive:{name}*")
    # What applications do at start-up: same attributes, the URL back.
    assert receiver.create_queue(QueueName=name, Attributes={"VisibilityTimeout": "45"})["QueueUrl"] == url
    assert _refused(lambda: receiver.create_queue(QueueName=name)) == "AccessDenied"  # other attributes
    assert _refused(lambda: receiver.create_queue(QueueName=name + "-new")) == "AccessDenied"
    assert _refused(lambda: receiver.tag_queue(QueueUrl=url, Tags={"a": "b"})) == "AccessDenied"
    assert _refused(lambda: receiver.untag_queue(QueueUrl=url, TagKeys=["a"])) == "AccessDenied"
    assert _refused(lambda: receiver.purge_queue(QueueUrl=url)) == "AccessDenied"
    assert _refused(lambda: receiver.delete_queue(QueueUrl=url)) == "AccessDenied"
    attributes = {"VisibilityTimeout": "0"}
    assert (
        _refused(lambda: receiver.set_queue_attributes(QueueUrl=url, Attributes=attributes)) == "AccessDenied"
    )
    assert (
        sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]["VisibilityTimeout"]
        == "45"
    )


def test_a_manage_key_creates_changes_tags_purges_and_deletes(
    sqs: Any, make_client: Callable[[str], Any]
) -> None:
    name = _name()
    manager = make_client(f"manage:{name}*")
    url = manager.create_queue(QueueName=name, tags={"team": "a"})["QueueUrl"]
    manager.set_queue_attributes(QueueUrl=url, Attributes={"DelaySeconds": "1"})
    manager.tag_queue(QueueUrl=url, Tags={"env": "test"})
    assert manager.list_queue_tags(QueueUrl=url)["Tags"] == {"team": "a", "env": "test"}
    manager.untag_queue(QueueUrl=url, TagKeys=["team"])
    assert _refused(lambda: manager.send_message(QueueUrl=url, MessageBody="x")) == "AccessDenied"
    manager.purge_queue(QueueUrl=url)
    manager.delete_queue(QueueUrl=url)
    assert _refused(lambda: manager.create_queue(QueueName="x" + name)) == "AccessDenied"


def test_a_dead_letter_target_needs_manage_or_send_and_the_same_account(
    sqs: Any, make_client: Callable[[str], Any]
) -> None:
    source, sent, read = _name(), _name(), _name()
    sent_arn = _arn(sqs, sqs.create_queue(QueueName=sent)["QueueUrl"])
    read_arn = _arn(sqs, sqs.create_queue(QueueName=read)["QueueUrl"])
    manager = make_client(f"manage:{source} send:{sent} receive:{read}")

    def redrive(arn: str) -> dict[str, str]:
        return {"RedrivePolicy": json.dumps({"deadLetterTargetArn": arn, "maxReceiveCount": 2})}

    assert (
        _refused(lambda: manager.create_queue(QueueName=source, Attributes=redrive(read_arn)))
        == "AccessDenied"
    )
    url = manager.create_queue(QueueName=source, Attributes=redrive(sent_arn))["QueueUrl"]
    assert _refused(lambda: manager.set_queue_attributes(QueueUrl=url, Attributes=redrive(read_arn))) == (
        "AccessDenied"
    )
    # Another account's queue is refused, never taken as the caller's queue of that name.
    foreign = f"arn:aws:sqs:eu-west-1:other:{sent}"
    assert _refused(lambda: sqs.set_queue_attributes(QueueUrl=url, Attributes=redrive(foreign))) == (
        "InvalidParameterValue"
    )
    assert _refused(lambda: sqs.create_queue(QueueName=_name(), Attributes=redrive(foreign))) == (
        "InvalidParameterValue"
    )
    policy = json.loads(
        sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]["RedrivePolicy"]
    )
    assert policy["deadLetterTargetArn"] == sent_arn
