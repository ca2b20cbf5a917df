"""Malformed parameters are AWS errors, never 500s (issue 47's table), through the real route.

Each request is signed correctly (tests/sqs/test_sigv4_scope.py's signer), so what is refused
is the parameter itself; each answer must be a 400 in AWS's shape, on both protocols.
"""

from __future__ import annotations

import itertools
import json
import time
from typing import Any

import httpx
import pytest

from tests.gateway.conftest import RunningGateway
from tests.sqs.conftest import aws_credentials
from tests.sqs.test_sigv4_scope import FORM_TYPE, json_call, signed_post

_n = itertools.count()


@pytest.fixture(scope="module")
def credentials(gateway: RunningGateway) -> tuple[str, str]:
    _, access_key_id, secret = aws_credentials(gateway, "admin")
    return access_key_id, secret


@pytest.fixture(scope="module")
def queue_url(gateway: RunningGateway, credentials: tuple[str, str]) -> str:
    name = f"bad{next(_n)}-{time.monotonic_ns() % 10**9}"
    created = json_call(gateway, credentials, "CreateQueue", {"QueueName": name})
    assert created.status_code == 200, created.text
    url: str = created.json()["QueueUrl"]
    return url


def aws_400(response: httpx.Response, code: str = "InvalidParameterValue") -> None:
    assert response.status_code == 400, response.text
    assert response.json()["__type"] == f"com.amazonaws.sqs#{code}"
    assert response.headers["x-amzn-query-error"] == f"{code};Sender"


def raw_json_call(
    gateway: RunningGateway, credentials: tuple[str, str], action: str, body: str
) -> httpx.Response:
    headers = {"content-type": "application/x-amz-json-1.0", "x-amz-target": f"AmazonSQS.{action}"}
    return signed_post(gateway, *credentials, body.encode(), headers)


def test_a_max_receive_count_of_1e999(
    gateway: RunningGateway, credentials: tuple[str, str], queue_url: str
) -> None:
    _, tenant, name = queue_url.rsplit("/", 2)
    arn = f"arn:aws:sqs:us-east-1:{tenant}:{name}"
    policy = '{"deadLetterTargetArn": "' + arn + '", "maxReceiveCount": 1e999}'
    for action, params in (
        ("SetQueueAttributes", {"QueueUrl": queue_url}),
        ("CreateQueue", {"QueueName": f"bad{next(_n)}"}),
    ):
        aws_400(json_call(gateway, credentials, action, {**params, "Attributes": {"RedrivePolicy": policy}}))
    deep = "[" * 100_000 + "]" * 100_000
    deeply: dict[str, object] = {"QueueUrl": queue_url, "Attributes": {"RedrivePolicy": deep}}
    aws_400(json_call(gateway, credentials, "SetQueueAttributes", deeply))


@pytest.mark.parametrize("attributes", ["VisibilityTimeout=5", ["VisibilityTimeout", "5"], 5, True])
def test_attributes_that_are_not_a_map(
    gateway: RunningGateway, credentials: tuple[str, str], queue_url: str, attributes: Any
) -> None:
    aws_400(
        json_call(
            gateway, credentials, "CreateQueue", {"QueueName": f"bad{next(_n)}", "Attributes": attributes}
        )
    )
    aws_400(
        json_call(
            gateway, credentials, "SetQueueAttributes", {"QueueUrl": queue_url, "Attributes": attributes}
        )
    )
    aws_400(
        json_call(gateway, credentials, "CreateQueue", {"QueueName": f"bad{next(_n)}", "tags": attributes})
    )
    aws_400(json_call(gateway, credentials, "TagQueue", {"QueueUrl": queue_url, "Tags": attributes}))


@pytest.mark.parametrize("names", [5, "All", {"All": 1}, [5], [None, {}]])
def test_attribute_names_that_are_not_a_list_of_strings(
    gateway: RunningGateway, credentials: tuple[str, str], queue_url: str, names: Any
) -> None:
    aws_400(
        json_call(
            gateway, credentials, "GetQueueAttributes", {"QueueUrl": queue_url, "AttributeNames": names}
        )
    )
    for param in ("AttributeNames", "MessageSystemAttributeNames", "MessageAttributeNames"):
        params = {"QueueUrl": queue_url, param: names, "WaitTimeSeconds": 0}
        aws_400(json_call(gateway, credentials, "ReceiveMessage", params))


def test_a_receive_with_message_attribute_names_7(
    gateway: RunningGateway, credentials: tuple[str, str], queue_url: str
) -> None:
    body = json.dumps({"QueueUrl": queue_url, "MessageAttributeNames": 7, "WaitTimeSeconds": 0})
    aws_400(raw_json_call(gateway, credentials, "ReceiveMessage", body))


def test_a_query_key_3000_levels_deep(gateway: RunningGateway, credentials: tuple[str, str]) -> None:
    form = b"Action=ListQueues&Version=2012-11-05&" + ".".join(["a"] * 3000).encode() + b"=1"
    answer = signed_post(gateway, *credentials, form, {"content-type": FORM_TYPE})
    assert answer.status_code == 400, answer.text
    assert b"<Code>InvalidParameterValue</Code>" in answer.content
