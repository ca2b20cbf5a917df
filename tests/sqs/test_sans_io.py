"""The SQS protocol's sans-I/O parts: checksums, error answers, names, request parsing."""

from __future__ import annotations

import base64
import hashlib
import json
import struct

import pytest

from backend_store.errors import QueueNotFound, RateLimited
from gateway.sqs.actions import SqsActions
from gateway.sqs.errors import SqsError
from gateway.sqs.md5 import md5_of_attributes, md5_of_body
from gateway.sqs.names import parse_queue_arn, parse_queue_url, queue_arn, queue_url
from gateway.sqs.protocol import ACTIONS, parse_request, response
from gateway.sqs.query_protocol import error_response as query_error
from gateway.sqs.query_protocol import parse_query_request
from gateway.sqs.query_protocol import response as query_response
from tests.gateway.conftest import RunningGateway


def _field(raw: bytes) -> bytes:
    return len(raw).to_bytes(4, "big") + raw


def test_body_md5_is_the_md5_of_its_utf8_bytes() -> None:
    assert md5_of_body("hello") == "5d41402abc4b2a76b9719d911017c592"
    assert md5_of_body("héllo") == hashlib.md5("héllo".encode()).hexdigest()


def test_attribute_md5_encodes_sorted_names_types_transport_bytes_and_values() -> None:
    attributes = {
        "zeta": {"DataType": "Binary", "BinaryValue": base64.b64encode(b"\x00\x01").decode()},
        "alpha": {"DataType": "Number.int", "StringValue": "42"},
    }
    expected = hashlib.md5(
        _field(b"alpha")
        + _field(b"Number.int")
        + b"\x01"
        + _field(b"42")
        + _field(b"zeta")
        + _field(b"Binary")
        + b"\x02"
        + _field(b"\x00\x01")
    ).hexdigest()
    assert md5_of_attributes(attributes) == expected
    assert md5_of_attributes({}) is None
    assert struct.pack(">I", 5) == b"\x00\x00\x00\x05"


def test_a_pushgate_error_answers_as_aws_does() -> None:
    status, headers, body = SqsError.from_pushgate(QueueNotFound("no queue q")).response()
    assert status == 400
    assert headers["x-amzn-query-error"] == "AWS.SimpleQueueService.NonExistentQueue;Sender"
    assert json.loads(body) == {"__type": "com.amazonaws.sqs#QueueDoesNotExist", "message": "no queue q"}
    assert SqsError.from_pushgate(RateLimited("slow down")).aws.type == "RequestThrottled"
    assert SqsError("SignatureDoesNotMatch", "bad").response()[0] == 403


def test_queue_urls_and_arns_name_the_tenant_as_the_account() -> None:
    url = queue_url("http://127.0.0.1:8080/", "acme", "jobs")  # type: ignore[arg-type]
    assert url == "http://127.0.0.1:8080/acme/jobs"
    assert parse_queue_url(url) == ("acme", "jobs")
    assert parse_queue_url("https://proxy.example/acme/jobs") == ("acme", "jobs")
    assert queue_arn("acme", "jobs") == "arn:aws:sqs:us-east-1:acme:jobs"  # type: ignore[arg-type]
    assert parse_queue_arn("arn:aws:sqs:eu-west-1:acme:jobs") == ("acme", "jobs")
    with pytest.raises(SqsError) as missing:
        parse_queue_url("http://127.0.0.1:8080/acme")
    assert missing.value.aws.type == "QueueDoesNotExist"
    with pytest.raises(SqsError):
        parse_queue_arn("arn:aws:sns:us-east-1:acme:jobs")


def test_requests_parse_by_target_and_bad_ones_get_aws_errors() -> None:
    request = parse_request({"x-amz-target": "AmazonSQS.CreateQueue"}, b'{"QueueName": "jobs"}')
    assert (request.action, request.params) == ("CreateQueue", {"QueueName": "jobs"})
    for headers, body, code in [
        ({}, b"{}", "InvalidAction"),
        ({"x-amz-target": "AmazonSQS.Nope"}, b"{}", "InvalidAction"),
        ({"x-amz-target": "AmazonSQS.SendMessage"}, b"{not json", "InvalidParameterValue"),
        ({"x-amz-target": "AmazonSQS.SendMessage"}, b"[1]", "InvalidParameterValue"),
    ]:
        with pytest.raises(SqsError) as refused:
            parse_request(headers, body)
        assert refused.value.aws.type == code
    assert response({"QueueUrl": "u"}) == (
        200,
        {"content-type": "application/x-amz-json-1.0"},
        b'{"QueueUrl":"u"}',
    )


def test_query_fields_become_the_json_protocols_parameters() -> None:
    request = parse_query_request(
        [
            ("Action", "SendMessageBatch"),
            ("Version", "2012-11-05"),
            ("QueueUrl", "http://h/t/q"),
            ("SendMessageBatchRequestEntry.2.Id", "b"),
            ("SendMessageBatchRequestEntry.2.MessageBody", "two"),
            ("SendMessageBatchRequestEntry.2.DelaySeconds", "5"),
            ("SendMessageBatchRequestEntry.1.Id", "a"),
            ("SendMessageBatchRequestEntry.1.MessageBody", "one"),
            ("SendMessageBatchRequestEntry.1.MessageAttribute.1.Name", "n"),
            ("SendMessageBatchRequestEntry.1.MessageAttribute.1.Value.DataType", "Number"),
            ("SendMessageBatchRequestEntry.1.MessageAttribute.1.Value.StringValue", "7"),
        ]
    )
    assert request.action == "SendMessageBatch"
    assert request.params == {
        "QueueUrl": "http://h/t/q",
        "Entries": [
            {
                "Id": "a",
                "MessageBody": "one",
                "MessageAttributes": {"n": {"DataType": "Number", "StringValue": "7"}},
            },
            {"Id": "b", "MessageBody": "two", "DelaySeconds": 5},
        ],
    }
    create = parse_query_request(
        [
            ("Action", "CreateQueue"),
            ("QueueName", "q"),
            ("Attribute.1.Name", "DelaySeconds"),
            ("Attribute.1.Value", "3"),
            ("Tag.1.Key", "team"),
            ("Tag.1.Value", "core"),
        ]
    )
    assert create.params == {"QueueName": "q", "Attributes": {"DelaySeconds": "3"}, "tags": {"team": "core"}}
    for fields, code in [([], "MissingParameter"), ([("Action", "Nope")], "InvalidAction")]:
        with pytest.raises(SqsError) as refused:
            parse_query_request(fields)
        assert refused.value.aws.type == code


def test_query_answers_and_errors_are_aws_xml() -> None:
    status, headers, body = query_response(
        "ReceiveMessage",
        {
            "Messages": [
                {
                    "Body": "b",
                    "Attributes": {"SentTimestamp": "1"},
                    "MessageAttributes": {"n": {"DataType": "Number", "StringValue": "7"}},
                }
            ]
        },
        "rid",
    )
    assert (status, headers["content-type"]) == (200, "text/xml")
    assert body.endswith(
        b'<ReceiveMessageResponse xmlns="http://queue.amazonaws.com/doc/2012-11-05/"><ReceiveMessageResult>'
        b"<Message><Body>b</Body><Attribute><Name>SentTimestamp</Name><Value>1</Value></Attribute>"
        b"<MessageAttribute><Name>n</Name><Value><DataType>Number</DataType><StringValue>7</StringValue></Value>"
        b"</MessageAttribute></Message></ReceiveMessageResult>"
        b"<ResponseMetadata><RequestId>rid</RequestId></ResponseMetadata></ReceiveMessageResponse>"
    )
    status, _, body = query_error(SqsError("TooManyEntriesInBatchRequest", "too many"), "rid")
    assert status == 400
    assert b"<Type>Sender</Type><Code>AWS.SimpleQueueService.TooManyEntriesInBatchRequest</Code>" in body


def test_every_action_named_is_served(gateway: RunningGateway) -> None:
    # ACTIONS is what both protocols accept; the table is what runs them.
    assert set(SqsActions(gateway.services).table) == ACTIONS
