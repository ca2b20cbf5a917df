"""SigV4 checks all it signs (issue 47): the credential scope's date, service and region, and
the headers that must be signed, against a real gateway through its SQS route.

Requests are signed here by a small SigV4 signer of the test's own (AWS's algorithm, written
out), so that a scope botocore would never produce (an empty date, service ``s3``) can be
signed correctly and shown to be refused for what it is, not for a bad signature.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json
import logging
import time
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.gateway.conftest import RunningGateway, start_gateway
from tests.sqs.conftest import aws_credentials

JSON_TYPE = "application/x-amz-json-1.0"
FORM_TYPE = "application/x-www-form-urlencoded; charset=utf-8"
_n = itertools.count()


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode(), hashlib.sha256).digest()


def signed_post(
    gateway: RunningGateway,
    access_key_id: str,
    secret: str,
    body: bytes,
    headers: dict[str, str],
    *,
    scope_date: str | None = None,
    region: str = "eu-west-1",
    service: str = "sqs",
    signed: Sequence[str] | None = None,
    after_signing: dict[str, str] | None = None,
    signature: str | None = None,
) -> httpx.Response:
    """POST / signed with SigV4 over ``signed`` headers (default: all), then ``after_signing``
    headers changed; ``scope_date`` and the rest make the credential scope."""
    now = datetime.now(UTC)
    amz_date = now.strftime("%Y%m%dT%H%M%SZ")
    date = now.strftime("%Y%m%d") if scope_date is None else scope_date
    host = gateway.url.split("://", 1)[1]
    all_headers = {"host": host, "x-amz-date": amz_date, **{k.lower(): v for k, v in headers.items()}}
    names = sorted(all_headers) if signed is None else sorted(signed)
    canonical = "\n".join(
        [
            "POST",
            "/",
            "",
            "".join(f"{n}:{all_headers[n].strip()}\n" for n in names),
            ";".join(names),
            hashlib.sha256(body).hexdigest(),
        ]
    )
    scope = f"{date}/{region}/{service}/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = _hmac(_hmac(_hmac(_hmac(f"AWS4{secret}".encode(), date), region), service), "aws4_request")
    sig = signature if signature is not None else hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    authorization = f"AWS4-HMAC-SHA256 Credential={access_key_id}/{scope}, SignedHeaders={';'.join(names)}, Signature={sig}"
    # Bytes: a header value may be any octets on the wire (a non-ASCII signature included).
    sent = {**all_headers, **(after_signing or {}), "authorization": authorization}
    del sent["host"]
    return httpx.post(
        gateway.url + "/", content=body, headers={k.encode(): v.encode() for k, v in sent.items()}, timeout=30
    )


def json_call(
    gateway: RunningGateway,
    credentials: tuple[str, str],
    action: str,
    params: dict[str, object],
    **how: Any,
) -> httpx.Response:
    headers = {"content-type": JSON_TYPE, "x-amz-target": f"AmazonSQS.{action}"}
    return signed_post(gateway, *credentials, json.dumps(params).encode(), headers, **how)


def refused(response: httpx.Response, code: str) -> None:
    assert response.status_code == 403, response.text
    assert response.json()["__type"] == f"com.amazonaws.sqs#{code}"
    assert response.headers["x-amzn-query-error"].startswith(f"{code};")


@pytest.fixture(scope="module")
def credentials(gateway: RunningGateway) -> tuple[str, str]:
    _, access_key_id, secret = aws_credentials(gateway, "admin")
    return access_key_id, secret


def test_a_correctly_signed_request_is_served(gateway: RunningGateway, credentials: tuple[str, str]) -> None:
    answer = json_call(gateway, credentials, "ListQueues", {})
    assert answer.status_code == 200, answer.text
    form = b"Action=ListQueues&Version=2012-11-05"
    # The query protocol needs only host and x-amz-date signed.
    answer = signed_post(
        gateway, *credentials, form, {"content-type": FORM_TYPE}, signed=["host", "x-amz-date"]
    )
    assert answer.status_code == 200, answer.text


@pytest.mark.parametrize("service", ["s3", "execute-api", "SQS", ""])
def test_a_credential_scope_for_another_service_is_refused(
    gateway: RunningGateway, credentials: tuple[str, str], service: str
) -> None:
    refused(json_call(gateway, credentials, "ListQueues", {}, service=service), "SignatureDoesNotMatch")


@pytest.mark.parametrize("date", ["", "2026", "202611", "yesterday", "20000101"])
def test_the_scope_date_must_be_the_requests_date(
    gateway: RunningGateway, credentials: tuple[str, str], date: str
) -> None:
    refused(json_call(gateway, credentials, "ListQueues", {}, scope_date=date), "SignatureDoesNotMatch")


@pytest.mark.parametrize(
    "signed",
    [
        ["host"],
        ["host", "x-amz-date"],
        ["host", "x-amz-date", "x-amz-target"],
        ["x-amz-date", "content-type"],
    ],
)
def test_the_json_protocol_must_sign_host_date_target_and_content_type(
    gateway: RunningGateway, credentials: tuple[str, str], signed: list[str]
) -> None:
    refused(json_call(gateway, credentials, "ListQueues", {}, signed=signed), "IncompleteSignature")


def test_an_unsigned_target_cannot_be_switched_to_purge_the_queue(
    gateway: RunningGateway, credentials: tuple[str, str]
) -> None:
    name = f"sig{next(_n)}-{time.monotonic_ns() % 10**9}"
    url = json_call(gateway, credentials, "CreateQueue", {"QueueName": name}).json()["QueueUrl"]
    assert (
        json_call(gateway, credentials, "SendMessage", {"QueueUrl": url, "MessageBody": "keep"}).status_code
        == 200
    )
    # The probe: signed over host alone as GetQueueAttributes, sent as PurgeQueue.
    purge = json_call(
        gateway,
        credentials,
        "GetQueueAttributes",
        {"QueueUrl": url},
        signed=["host"],
        after_signing={"x-amz-target": "AmazonSQS.PurgeQueue"},
    )
    refused(purge, "IncompleteSignature")
    attrs = json_call(
        gateway, credentials, "GetQueueAttributes", {"QueueUrl": url, "AttributeNames": ["All"]}
    ).json()
    assert attrs["Attributes"]["ApproximateNumberOfMessages"] == "1"


@pytest.mark.parametrize("signature", ["é" * 64, "\u00ff", "Z" * 64, ""])
def test_a_malformed_signature_is_an_aws_error_not_a_500(
    gateway: RunningGateway, credentials: tuple[str, str], signature: str
) -> None:
    answer = json_call(gateway, credentials, "ListQueues", {}, signature=signature)
    assert answer.status_code == 403, answer.text
    assert answer.json()["__type"] in (
        "com.amazonaws.sqs#SignatureDoesNotMatch",
        "com.amazonaws.sqs#IncompleteSignature",
    )


def test_failures_are_logged_once_a_minute_per_key_id(
    gateway: RunningGateway, caplog: pytest.LogCaptureFixture
) -> None:
    _, access_key_id, secret = aws_credentials(gateway, "admin")  # its own: no failure logged yet
    credentials = (access_key_id, secret)
    with caplog.at_level(logging.WARNING, logger="pushgate.auth"):
        for _ in range(20):
            json_call(gateway, credentials, "ListQueues", {}, signature="0" * 64)
        json_call(gateway, ("AKPG" + "0" * 16, "x"), "ListQueues", {})
    lines = [r.getMessage() for r in caplog.records if r.name == "pushgate.auth"]
    assert len([line for line in lines if access_key_id in line]) == 1, lines
    assert len([line for line in lines if "AKPG" + "0" * 16 in line]) == 1, lines
    assert not any(credentials[1] in line for line in lines)  # never the secret


@pytest.fixture(scope="module")
def regional(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    running = start_gateway(Path(tmp_path_factory.mktemp("sqs-region")), sqs_region="eu-west-1")
    try:
        yield running
    finally:
        running.stop()


def test_a_configured_region_is_the_only_one_accepted(regional: RunningGateway) -> None:
    _, access_key_id, secret = aws_credentials(regional, "admin")
    assert json_call(regional, (access_key_id, secret), "ListQueues", {}).status_code == 200
    for region in ("moon-1", "us-east-1", ""):
        refused(
            json_call(regional, (access_key_id, secret), "ListQueues", {}, region=region),
            "SignatureDoesNotMatch",
        )
