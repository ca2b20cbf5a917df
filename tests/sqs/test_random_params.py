"""Every SQS action, sent random values of every JSON type, answers in AWS's shape: never a 5xx.

A property test (Hypothesis) against a real gateway: for each action and each protocol, a
correctly signed request whose parameters are the action's own names (and some others) with
random values (null, booleans, huge and negative numbers, floats, strings, lists, objects,
nested). The answer must be a 2xx, or a 4xx in AWS's error shape (the JSON ``__type`` and
``x-amzn-query-error``, or the query protocol's ``<ErrorResponse>``). The query protocol gets
random flattened keys (``Attribute.1.Name``, ``a.b.c``) and random text values.
"""

from __future__ import annotations

import json
import time
from typing import Any
from xml.etree import ElementTree

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.sqs.protocol import ACTIONS
from gateway.sqs.shapes import ACTION_SHAPES
from tests.gateway.conftest import RunningGateway
from tests.sqs.conftest import aws_credentials
from tests.sqs.test_sigv4_scope import FORM_TYPE, JSON_TYPE, signed_post

QUEUE = f"fuzz-{time.monotonic_ns() % 10**9}"
EXTRA_NAMES = ["Id", "Entries", "Attributes", "QueueName", "Unknown", ""]
_SETTINGS = settings(max_examples=15, deadline=None, database=None, suppress_health_check=list(HealthCheck))

scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=40)
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)


@pytest.fixture(scope="module")
def credentials(gateway: RunningGateway) -> tuple[str, str]:
    _, access_key_id, secret = aws_credentials(gateway, "admin")
    return access_key_id, secret


def _ensure_queue(gateway: RunningGateway, credentials: tuple[str, str]) -> str:
    """The queue the examples aim at (an example may have deleted it), its URL."""
    body = json.dumps({"QueueName": QUEUE}).encode()
    headers = {"content-type": JSON_TYPE, "x-amz-target": "AmazonSQS.CreateQueue"}
    created = signed_post(gateway, *credentials, body, headers)
    if created.status_code != 200:  # an example changed its attributes: start again
        headers["x-amz-target"] = "AmazonSQS.DeleteQueue"
        gone = {"QueueUrl": f"{gateway.url}/default/{QUEUE}"}
        signed_post(gateway, *credentials, json.dumps(gone).encode(), headers)
        headers["x-amz-target"] = "AmazonSQS.CreateQueue"
        created = signed_post(gateway, *credentials, body, headers)
    assert created.status_code == 200, created.text
    url: str = created.json()["QueueUrl"]
    return url


def _params(action: str, url: str) -> st.SearchStrategy[dict[str, Any]]:
    names = sorted(ACTION_SHAPES[action]) + EXTRA_NAMES
    queue_values = st.sampled_from([url, QUEUE, f"arn:aws:sqs:us-east-1:default:{QUEUE}"]) | json_values
    value = st.one_of(json_values, queue_values)
    return st.dictionaries(st.sampled_from(names), value, max_size=6)


def _tame(action: str, params: dict[str, Any]) -> dict[str, Any]:
    # A long-poll would make each example wait up to 20 s; waits have their own tests.
    if action == "ReceiveMessage":
        params["WaitTimeSeconds"] = 0
    return params


def _assert_aws_answer(answer: httpx.Response, query: bool) -> None:
    assert answer.status_code < 500, answer.text
    if answer.status_code < 400:
        return
    if query:
        root = ElementTree.fromstring(answer.content)
        assert root.tag.endswith("ErrorResponse"), answer.text
        assert root.find("{*}Error/{*}Code") is not None, answer.text
    else:
        assert answer.json()["__type"].startswith("com.amazonaws.sqs#"), answer.text
        assert answer.headers["x-amzn-query-error"].endswith((";Sender", ";Receiver")), answer.headers


@pytest.mark.slow
@pytest.mark.parametrize("action", sorted(ACTIONS))
def test_random_json_parameters_get_an_aws_answer(
    gateway: RunningGateway, credentials: tuple[str, str], action: str
) -> None:
    url = _ensure_queue(gateway, credentials)
    headers = {"content-type": JSON_TYPE, "x-amz-target": f"AmazonSQS.{action}"}

    @given(params=_params(action, url))
    @_SETTINGS
    def check(params: dict[str, Any]) -> None:
        body = json.dumps(_tame(action, params)).encode()
        _assert_aws_answer(signed_post(gateway, *credentials, body, headers), query=False)

    check()


def _flattened(names: list[str]) -> st.SearchStrategy[str]:
    suffix = st.lists(
        st.sampled_from(["1", "2", "Name", "Value", "Key", "StringValue", "DataType", "Id", "a"]), max_size=5
    )
    return st.builds(lambda name, parts: ".".join([name, *parts]), st.sampled_from(names), suffix)


@pytest.mark.slow
@pytest.mark.parametrize("action", sorted(ACTIONS))
def test_random_query_parameters_get_an_aws_answer(
    gateway: RunningGateway, credentials: tuple[str, str], action: str
) -> None:
    url = _ensure_queue(gateway, credentials)
    names = (
        sorted(ACTION_SHAPES[action])
        + EXTRA_NAMES
        + ["Attribute", "MessageAttribute", "Tag", "AttributeName"]
    )
    text = st.sampled_from([url, QUEUE, "0", "-1", "99999999999999999999", "true", "All"]) | st.text(
        max_size=20
    )

    @given(fields=st.lists(st.tuples(_flattened(names), text), max_size=8))
    @_SETTINGS
    def check(fields: list[tuple[str, str]]) -> None:
        fields = [(k, v) for k, v in fields if k != "WaitTimeSeconds"] + [("WaitTimeSeconds", "0")]
        body = httpx.QueryParams([("Action", action), ("Version", "2012-11-05"), *fields])
        answer = signed_post(gateway, *credentials, str(body).encode(), {"content-type": FORM_TYPE})
        _assert_aws_answer(answer, query=True)

    check()


def test_an_error_that_echoes_a_control_character_is_still_xml(
    gateway: RunningGateway, credentials: tuple[str, str]
) -> None:
    """Found by the random query test (session 50): StartMessageMoveTask's ``SourceArn`` with a
    control character came back in an ``<ErrorResponse>`` no XML parser reads."""
    fields = {"Action": "StartMessageMoveTask", "Version": "2012-11-05", "SourceArn": "arn:\x01\x00x"}
    body = str(httpx.QueryParams(fields)).encode()
    answer = signed_post(gateway, *credentials, body, {"content-type": FORM_TYPE})
    assert answer.status_code == 400
    _assert_aws_answer(answer, query=True)
