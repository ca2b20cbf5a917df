"""SigV4 verification against AWS's published test suite and botocore's own signer."""

from __future__ import annotations

import json
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from botocore.auth import SigV4Auth  # type: ignore[import-untyped]
from botocore.awsrequest import AWSRequest  # type: ignore[import-untyped]
from botocore.credentials import Credentials  # type: ignore[import-untyped]

from gateway.sqs.errors import SqsError
from gateway.sqs.sigv4 import canonical_request, parse_authorization, verify

BODY = b'{"QueueName":"jobs"}'


def _signed(secret: str, url: str = "http://127.0.0.1:8080/") -> AWSRequest:
    request = AWSRequest(
        method="POST",
        url=url,
        data=BODY,
        headers={"Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": "AmazonSQS.CreateQueue"},
    )
    SigV4Auth(Credentials("AKIDEXAMPLE", secret), "sqs", "eu-west-1").add_auth(request)
    return request


def _verify(request: AWSRequest, secret: str, now: float) -> None:
    headers = {k.lower(): v for k, v in request.headers.items()}
    headers["host"] = "127.0.0.1:8080"
    auth = parse_authorization(headers.get("authorization"))
    verify(auth, secret, "POST", "/", [], headers, BODY, now)


def test_a_request_botocore_signed_verifies() -> None:
    request = _signed("s3cret")
    _verify(request, "s3cret", time.time())
    assert parse_authorization(request.headers["Authorization"]).access_key_id == "AKIDEXAMPLE"


@pytest.mark.parametrize(
    ("secret", "skew", "code"),
    [("wrong", 0.0, "SignatureDoesNotMatch"), ("s3cret", 16 * 60.0, "SignatureDoesNotMatch")],
)
def test_a_wrong_secret_or_an_old_date_is_refused(secret: str, skew: float, code: str) -> None:
    with pytest.raises(SqsError) as refused:
        _verify(_signed("s3cret"), secret, time.time() + skew)
    assert refused.value.aws.type == code
    assert refused.value.aws.status == 403
    assert "s3cret" not in refused.value.message


def test_an_unsigned_request_is_refused() -> None:
    with pytest.raises(SqsError) as refused:
        parse_authorization(None)
    assert refused.value.aws.type == "MissingAuthenticationToken"
    assert refused.value.aws.status == 403


# AWS's published SigV4 test suite (tests/sqs/data/sigv4_test_suite.json names its source).
SUITE = json.loads((Path(__file__).parent / "data" / "sigv4_test_suite.json").read_text())
SIGNED_AT = datetime.fromisoformat(SUITE["signed_at"].replace("Z", "+00:00")).timestamp()


def _vector_request(vector: dict[str, Any]) -> tuple[list[tuple[str, str]], dict[str, str], bytes]:
    query = [(k, v) for k, v in vector["query"]]
    headers = {k.lower(): v for k, v in vector["headers"].items()}
    return query, headers, vector["body"].encode()


@pytest.mark.parametrize("vector", SUITE["vectors"], ids=[v["name"] for v in SUITE["vectors"]])
def test_aws_sigv4_test_suite(vector: dict[str, Any]) -> None:
    query, headers, body = _vector_request(vector)
    auth = parse_authorization(vector["authz"])
    assert (auth.access_key_id, auth.region, auth.service) == (
        SUITE["access_key_id"],
        SUITE["region"],
        SUITE["service"],
    )
    canonical = canonical_request(vector["method"], vector["path"], query, headers, auth.signed_headers, body)
    assert canonical == vector["creq"]
    verify(
        auth,
        SUITE["secret"],
        vector["method"],
        vector["path"],
        query,
        headers,
        body,
        SIGNED_AT,
        service="service",
    )
    # One flipped hex digit of the signature, or another secret, is refused.
    flipped = vector["authz"][:-1] + ("0" if vector["authz"][-1] != "0" else "1")
    for bad_auth, secret in [(parse_authorization(flipped), SUITE["secret"]), (auth, "not-the-secret")]:
        with pytest.raises(SqsError) as refused:
            verify(
                bad_auth,
                secret,
                vector["method"],
                vector["path"],
                query,
                headers,
                body,
                SIGNED_AT,
                service="service",
            )
        assert refused.value.aws.type == "SignatureDoesNotMatch"
