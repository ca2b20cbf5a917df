"""SQS features past the basics, through real boto3 on both protocols: typed message
attributes and their MD5s, FIFO queues named ``.fifo``, tags, dead-letter sources, message
system attributes."""

from __future__ import annotations

import base64
import itertools
import time
from typing import Any

import pytest
from botocore.exceptions import ClientError  # type: ignore[import-untyped]

from gateway.sqs.md5 import md5_of_attributes

_n = itertools.count()


def _name(suffix: str = "") -> str:
    return f"feat{next(_n)}-{time.monotonic_ns() % 10**9}{suffix}"


def _code(exc: pytest.ExceptionInfo[ClientError]) -> str:
    return str(exc.value.response["Error"]["Code"])


TYPED: dict[str, dict[str, Any]] = {
    "text": {"DataType": "String", "StringValue": "héllo"},
    "count": {"DataType": "Number", "StringValue": "42"},
    "metric.ratio": {"DataType": "Number.float", "StringValue": "0.5"},
    "blob": {"DataType": "Binary", "BinaryValue": b"\x00\x01\xff"},
    "kind": {"DataType": "String.custom", "StringValue": "order"},
}


def test_number_and_binary_attributes_keep_their_types_and_md5s(sqs: Any) -> None:
    url = sqs.create_queue(QueueName=_name())["QueueUrl"]
    sent = sqs.send_message(QueueUrl=url, MessageBody="typed", MessageAttributes=TYPED)
    as_json = {k: dict(v) for k, v in TYPED.items()}
    as_json["blob"] = {"DataType": "Binary", "BinaryValue": base64.b64encode(b"\x00\x01\xff").decode()}
    assert sent["MD5OfMessageAttributes"] == md5_of_attributes(as_json)
    [got] = sqs.receive_message(QueueUrl=url, MessageAttributeNames=["All"])["Messages"]
    assert got["MessageAttributes"] == TYPED
    assert got["MD5OfMessageAttributes"] == sent["MD5OfMessageAttributes"]
    sqs.send_message(QueueUrl=url, MessageBody="some", MessageAttributes=TYPED)
    [some] = sqs.receive_message(QueueUrl=url, MessageAttributeNames=["count", "metric.*", "ratio.*"])[
        "Messages"
    ]
    assert sorted(some["MessageAttributes"]) == ["count", "metric.ratio"]


@pytest.mark.parametrize(
    "attributes",
    [
        {"n": {"DataType": "Number", "StringValue": "forty"}},
        {"n": {"DataType": "Date", "StringValue": "x"}},
        {"AWS.x": {"DataType": "String", "StringValue": "x"}},
        {f"a{i}": {"DataType": "String", "StringValue": "x"} for i in range(11)},
    ],
)
def test_bad_message_attributes_are_refused(sqs: Any, attributes: dict[str, Any]) -> None:
    url = sqs.create_queue(QueueName=_name())["QueueUrl"]
    with pytest.raises(ClientError) as refused:
        sqs.send_message(QueueUrl=url, MessageBody="x", MessageAttributes=attributes)
    assert _code(refused) == "InvalidParameterValue"


def test_a_body_with_characters_xml_cannot_carry_is_refused(sqs: Any) -> None:
    url = sqs.create_queue(QueueName=_name())["QueueUrl"]
    with pytest.raises(ClientError) as refused:
        sqs.send_message(QueueUrl=url, MessageBody="bell\x07")
    assert _code(refused) == "InvalidMessageContents"


def test_fifo_queues_end_in_fifo_keep_group_order_and_dedupe(sqs: Any) -> None:
    name = _name(".fifo")
    with pytest.raises(ClientError) as unsuffixed:
        sqs.create_queue(QueueName=_name(), Attributes={"FifoQueue": "true"})
    assert _code(unsuffixed) == "InvalidParameterValue"
    with pytest.raises(ClientError) as not_fifo:
        sqs.create_queue(QueueName=name)
    assert _code(not_fifo) == "InvalidParameterValue"
    url = sqs.create_queue(QueueName=name, Attributes={"FifoQueue": "true"})["QueueUrl"]
    assert url.endswith(f"/default/{name}")
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert (attrs["FifoQueue"], attrs["ContentBasedDeduplication"]) == ("true", "false")
    with pytest.raises(ClientError) as no_group:
        sqs.send_message(QueueUrl=url, MessageBody="x")
    assert _code(no_group) == "MissingParameter"
    with pytest.raises(ClientError) as no_dedupe:
        sqs.send_message(QueueUrl=url, MessageBody="x", MessageGroupId="g")
    assert _code(no_dedupe) == "InvalidParameterValue"
    sequence = []
    for i in range(3):
        out = sqs.send_message(
            QueueUrl=url, MessageBody=f"m{i}", MessageGroupId="g", MessageDeduplicationId=f"d{i}"
        )
        sequence.append(int(out["SequenceNumber"]))
    again = sqs.send_message(QueueUrl=url, MessageBody="m0", MessageGroupId="g", MessageDeduplicationId="d0")
    assert sequence == sorted(sequence)
    assert int(again["SequenceNumber"]) == sequence[0]  # the original's: deduplicated
    first = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, AttributeNames=["All"])["Messages"]
    # One message of a group in flight at a time (Pushgate hands out a group's head only).
    assert [m["Body"] for m in first] == ["m0"]
    assert first[0]["Attributes"]["MessageGroupId"] == "g"
    assert first[0]["Attributes"]["SequenceNumber"] == str(sequence[0])
    bodies = []
    receipt = first[0]["ReceiptHandle"]
    for _ in range(2):
        sqs.delete_message(QueueUrl=url, ReceiptHandle=receipt)
        [m] = sqs.receive_message(QueueUrl=url)["Messages"]
        bodies.append(m["Body"])
        receipt = m["ReceiptHandle"]
    assert bodies == ["m1", "m2"]


def test_content_based_deduplication(sqs: Any) -> None:
    url = sqs.create_queue(
        QueueName=_name(".fifo"), Attributes={"FifoQueue": "true", "ContentBasedDeduplication": "true"}
    )["QueueUrl"]
    one = sqs.send_message(QueueUrl=url, MessageBody="same", MessageGroupId="g")
    two = sqs.send_message(QueueUrl=url, MessageBody="same", MessageGroupId="g")
    assert one["MessageId"] == two["MessageId"]
    assert len(sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]) == 1


def test_tags_are_kept_with_the_queue(sqs: Any) -> None:
    name = _name()
    url = sqs.create_queue(QueueName=name, tags={"team": "core"})["QueueUrl"]
    assert sqs.list_queue_tags(QueueUrl=url)["Tags"] == {"team": "core"}
    sqs.tag_queue(QueueUrl=url, Tags={"env": "test", "team": "edge"})
    assert sqs.list_queue_tags(QueueUrl=url)["Tags"] == {"env": "test", "team": "edge"}
    sqs.untag_queue(QueueUrl=url, TagKeys=["team", "absent"])
    assert sqs.list_queue_tags(QueueUrl=url)["Tags"] == {"env": "test"}
    with pytest.raises(ClientError) as too_many:
        sqs.tag_queue(QueueUrl=url, Tags={f"k{i}": "v" for i in range(50)})
    assert _code(too_many) == "InvalidParameterValue"
    sqs.delete_queue(QueueUrl=url)
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    assert "Tags" not in sqs.list_queue_tags(QueueUrl=url)  # a new queue of the same name has none


def test_dead_letter_sources_and_system_attributes(sqs: Any) -> None:
    dlq_url = sqs.create_queue(QueueName=_name("-dlq"))["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    policy = f'{{"deadLetterTargetArn":"{dlq_arn}","maxReceiveCount":"1"}}'
    sources = [
        sqs.create_queue(QueueName=_name(f"-src{i}"), Attributes={"RedrivePolicy": policy})["QueueUrl"]
        for i in range(2)
    ]
    assert sorted(sqs.list_dead_letter_source_queues(QueueUrl=dlq_url)["queueUrls"]) == sorted(sources)
    page = sqs.list_dead_letter_source_queues(QueueUrl=dlq_url, MaxResults=1)
    assert len(page["queueUrls"]) == 1 and page["NextToken"]
    sqs.send_message(QueueUrl=sources[0], MessageBody="poison")
    before = int(time.time() * 1000)
    [m] = sqs.receive_message(QueueUrl=sources[0], VisibilityTimeout=0, AttributeNames=["All"])["Messages"]
    first = int(m["Attributes"]["ApproximateFirstReceiveTimestamp"])
    assert before - 1000 <= first <= int(time.time() * 1000)
    assert int(m["Attributes"]["SentTimestamp"]) <= first
    # Received once (max_receives 1) and visible again: the next receive dead-letters it.
    assert sqs.receive_message(QueueUrl=sources[0], WaitTimeSeconds=1).get("Messages", []) == []
    [dead] = sqs.receive_message(QueueUrl=dlq_url, WaitTimeSeconds=5, AttributeNames=["All"])["Messages"]
    assert dead["Body"] == "poison"
