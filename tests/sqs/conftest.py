"""A real gateway on an ephemeral port and boto3 clients signed with AWS credentials made for it.

The ``sqs`` and ``make_client`` fixtures run each test twice: once with boto3 as it is (the
AWS JSON 1.0 protocol) and once with boto3 on the query protocol (form fields, XML), as
older SDKs and Debian's aws CLI speak it. The query client loads the SQS model that Debian's
``awscli`` package ships (a query-protocol model from before SQS moved to JSON;
``scripts/test`` installs the package), so its requests and its XML parsing are botocore's
own, not this project's.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3  # type: ignore[import-untyped]
import botocore.session  # type: ignore[import-untyped]
import pytest

from tests.fixtures.dev_cluster import StoreTarget
from tests.gateway.conftest import RunningGateway, start_gateway

# Debian's awscli 2.9 (bookworm): its botocore's SQS model is the query protocol's.
DEBIAN_QUERY_MODEL = Path("/usr/lib/python3/dist-packages/awscli/botocore/data/sqs/2012-11-05/service-2.json")
DEBIAN_AWS = Path("/usr/bin/aws")
PROTOCOLS = ("json", "query")


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, store_target: StoreTarget) -> Iterator[RunningGateway]:
    """A gateway on the embedded store, or on the session's dev cluster with
    ``PUSHGATE_TEST_STORE=cluster`` (tests/fixtures/dev_cluster.py)."""
    running = start_gateway(tmp_path_factory.mktemp("sqs-gateway"), target=store_target)
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="session")
def query_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A botocore data directory holding only the query protocol's SQS model."""
    assert DEBIAN_QUERY_MODEL.exists(), "Debian's awscli package is needed (scripts/test installs it)"
    root = tmp_path_factory.mktemp("query-models")
    (root / "sqs" / "2012-11-05").mkdir(parents=True)
    shutil.copy(DEBIAN_QUERY_MODEL, root / "sqs" / "2012-11-05" / "service-2.json")
    return root


def aws_credentials(gateway: RunningGateway, scopes: str, tenant: str = "default") -> tuple[str, str, str]:
    """A new API key with AWS credentials: (API token, access key id, secret)."""
    authenticator = gateway.services.authenticator
    key, token = gateway.call(authenticator.api_keys.create(tenant, scopes))
    access_key_id, secret = gateway.call(authenticator.aws_keys.create(key.key_id))
    return token, access_key_id, secret


def sqs_client(
    gateway: RunningGateway, access_key_id: str, secret: str, query_models: Path | None = None, **config: Any
) -> Any:
    """boto3's SQS client; on the query protocol when ``query_models`` is given."""
    session = None
    if query_models is not None:
        core = botocore.session.Session()
        core.get_component("data_loader").search_paths.insert(0, str(query_models))
        session = boto3.session.Session(botocore_session=core)
    return (session or boto3).client(
        "sqs",
        endpoint_url=gateway.url,
        region_name="eu-west-1",
        aws_access_key_id=access_key_id,
        aws_secret_access_key=secret,
        **config,
    )


@pytest.fixture(scope="module", params=PROTOCOLS)
def protocol(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def client_factory(
    gateway: RunningGateway, protocol: str, request: pytest.FixtureRequest
) -> Callable[[str], Any]:
    models: Path | None = request.getfixturevalue("query_models") if protocol == "query" else None

    def make(scopes: str) -> Any:
        _, access_key_id, secret = aws_credentials(gateway, scopes)
        client = sqs_client(gateway, access_key_id, secret, models)
        assert client.meta.service_model.protocol == protocol
        return client

    return make


@pytest.fixture(scope="module")
def sqs(client_factory: Callable[[str], Any]) -> Any:
    """A boto3 SQS client with every scope of tenant ``default``, on each protocol in turn."""
    return client_factory("admin send:* receive:*")


@pytest.fixture
def make_client(client_factory: Callable[[str], Any]) -> Callable[[str], Any]:
    return client_factory
