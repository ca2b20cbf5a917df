"""``/v1/limits``, 429 with exact headers, quotas: one real gateway on each shared-state backend."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import scaled
from tests.fixtures.redis_server import RedisServer
from tests.gateway.conftest import Api, RunningGateway, api_for, problem_code, start_gateway

NO_KEY_LIMITS: dict[str, str | None] = {"send": None, "receive": None, "connect": None}
NO_LIMITS: dict[str, object] = {
    "send": None,
    "receive": None,
    "connect": None,
    "per_key": NO_KEY_LIMITS,
    "per_queue": {"send": None, "receive": None},
    "max_queues": None,
    "max_stored_messages": None,
}


@pytest.fixture(scope="module", params=["memory", "redis"])
def gateway(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningGateway]:
    redis_url = request.getfixturevalue("redis_url") if request.param == "redis" else None
    running = start_gateway(tmp_path_factory.mktemp("gateway"), redis_url=redis_url)
    try:
        yield running
    finally:
        running.stop()


class Tenant:
    """A fresh tenant (so limits never leak between tests) with an admin key and a client."""

    def __init__(self, gateway: RunningGateway) -> None:
        self.gateway = gateway
        self.name = gateway.make_tenant()
        self.admin_key = gateway.make_key("admin", self.name)

    def api(self, scopes: str | None = None) -> Iterator[Api]:
        key = self.admin_key if scopes is None else self.gateway.make_key(scopes, self.name)
        return api_for(self.gateway, key)


@pytest.fixture
def qname(unique: str) -> str:
    return "q" + unique


@pytest.fixture
def tenant(gateway: RunningGateway) -> Tenant:
    return Tenant(gateway)


@pytest.fixture
def admin(tenant: Tenant) -> Iterator[Api]:
    yield from tenant.api()


def put_limits(api: Api, doc: object) -> httpx.Response:
    return api.client.put("/v1/limits", json=doc)


def test_limits_start_empty_and_a_put_merges(admin: Api) -> None:
    assert admin.client.get("/v1/limits").json() == NO_LIMITS
    r = put_limits(admin, {"send": "10 per second; 100/minute", "per_key": {"send": "5/second"}})
    assert r.status_code == 200
    per_key = NO_KEY_LIMITS | {"send": "5/second"}
    expected = NO_LIMITS | {"send": "10/second;100/minute", "per_key": per_key}
    assert r.json() == expected
    r = put_limits(admin, {"max_queues": 10, "per_key": {"receive": "1/second"}})
    expected["per_key"] = per_key | {"receive": "1/second"}
    assert r.json() == expected | {"max_queues": 10}
    r = put_limits(admin, {"send": None, "per_key": None, "max_queues": None})
    assert r.json() == NO_LIMITS
    assert admin.client.get("/v1/limits").json() == NO_LIMITS


@pytest.mark.parametrize(
    "doc",
    [
        {"send": "fast"},
        {"send": "10/year"},
        {"sned": "1/second"},
        {"per_queue": {"connect": "1/second"}},
        {"per_key": "1/second"},
        {"max_queues": 0},
        {"max_stored_messages": True},
        ["send"],
    ],
)
def test_bad_documents_are_400(admin: Api, doc: object) -> None:
    assert problem_code(put_limits(admin, doc), 400) == "invalid_request"


def test_reading_needs_a_token_and_changing_needs_admin(tenant: Tenant, gateway: RunningGateway) -> None:
    for api in api_for(gateway, None):
        assert problem_code(api.client.get("/v1/limits"), 401) == "unauthorized"
    for api in tenant.api("send:*"):
        assert api.client.get("/v1/limits").status_code == 200
        assert problem_code(put_limits(api, {"send": "1/second"}), 403) == "forbidden"


def test_sends_past_the_rate_get_429_with_exact_headers(admin: Api, qname: str) -> None:
    admin.put_queue(qname)
    assert put_limits(admin, {"send": "3/hour"}).status_code == 200
    for remaining in (2, 1, 0):
        r = admin.send(qname)
        assert r.status_code == 201
        assert r.headers["RateLimit-Policy"] == '"tenant-send";q=3;w=3600'
        match = re.fullmatch(r'"tenant-send";r=(\d+);t=(\d+)', r.headers["RateLimit"])
        assert match is not None and int(match[1]) == remaining and 1 <= int(match[2]) <= 3600
        assert "Retry-After" not in r.headers
    r = admin.send(qname)
    assert problem_code(r, 429) == "rate_limited"
    assert r.headers["RateLimit-Policy"] == '"tenant-send";q=3;w=3600'
    match = re.fullmatch(r'"tenant-send";r=0;t=(\d+)', r.headers["RateLimit"])
    assert match is not None
    assert 1 <= int(r.headers["Retry-After"]) <= 3600
    # Other operations are not limited, and carry no rate-limit fields.
    r = admin.receive(qname, max=1)
    assert r.status_code == 200 and "RateLimit" not in r.headers


def test_per_key_and_per_queue_counters_are_separate(tenant: Tenant, admin: Api, qname: str) -> None:
    other_queue = qname + "-b"
    admin.put_queue(qname)
    admin.put_queue(other_queue)
    put_limits(admin, {"per_key": {"send": "1/hour"}, "per_queue": {"receive": "2/hour"}})
    for api in tenant.api("send:* receive:*"):
        r = api.send(qname)
        assert r.status_code == 201 and r.headers["RateLimit-Policy"] == '"key-send";q=1;w=3600'
        assert problem_code(api.send(other_queue), 429) == "rate_limited"
    assert admin.send(qname).status_code == 201  # another key, another counter
    for queue in (qname, other_queue):
        for _ in range(2):
            r = admin.receive(queue)
            assert r.status_code == 200 and r.headers["RateLimit-Policy"] == '"queue-receive";q=2;w=3600'
        assert problem_code(admin.receive(queue), 429) == "rate_limited"


def test_several_policies_are_all_reported(admin: Api, qname: str) -> None:
    admin.put_queue(qname)
    put_limits(admin, {"send": "100/second;1000/hour", "per_queue": {"send": "50/minute"}})
    r = admin.send(qname)
    assert r.status_code == 201
    assert r.headers["RateLimit-Policy"] == (
        '"tenant-send-1s";q=100;w=1, "tenant-send-3600s";q=1000;w=3600, "queue-send";q=50;w=60'
    )
    assert re.fullmatch(
        r'"tenant-send-1s";r=99;t=\d+, "tenant-send-3600s";r=999;t=\d+, "queue-send";r=49;t=\d+',
        r.headers["RateLimit"],
    )


def test_queue_quota_is_409_but_an_existing_queue_still_answers(admin: Api, qname: str) -> None:
    put_limits(admin, {"max_queues": 2})
    assert admin.put_queue(qname + "-1").status_code == 201
    assert admin.put_queue(qname + "-2").status_code == 201
    assert problem_code(admin.put_queue(qname + "-3"), 409) == "quota_exceeded"
    assert admin.put_queue(qname + "-1").status_code == 200
    put_limits(admin, {"max_queues": None})
    assert admin.put_queue(qname + "-3").status_code == 201


def test_stored_message_quota_is_409(admin: Api, qname: str) -> None:
    admin.put_queue(qname)
    put_limits(admin, {"max_stored_messages": 3})
    assert (
        admin.client.post(f"/v1/queues/{qname}/messages", json={"messages": [{"body": "a"}] * 2}).status_code
        == 200
    )
    assert admin.send(qname).status_code == 201
    r = admin.send(qname)
    assert problem_code(r, 409) == "quota_exceeded"
    batch = admin.client.post(f"/v1/queues/{qname}/messages", json={"messages": [{"body": "a"}] * 2})
    assert problem_code(batch, 409) == "quota_exceeded"


def test_rate_limited_requests_are_counted_in_metrics(
    gateway: RunningGateway, admin: Api, qname: str
) -> None:
    admin.put_queue(qname)
    put_limits(admin, {"receive": "1/hour"})
    admin.receive(qname)
    admin.receive(qname)
    text = admin.client.get("/metrics").text  # /metrics needs the metrics scope (admin has it)
    assert re.search(r'^pushgate_rate_limited_total\{op="receive"\} [1-9]', text, re.M)
    assert re.search(r"^pushgate_shared_state_up 1\.0$", text, re.M)


def test_fail_closed_refuses_limited_requests_while_redis_is_down(
    redis_server: RedisServer, tmp_path: Path, qname: str
) -> None:
    running = start_gateway(tmp_path / "closed", redis_url=redis_server.url, redis_fail="closed")
    try:
        tenant = Tenant(running)
        for api in tenant.api():
            api.put_queue(qname)
            put_limits(api, {"per_queue": {"send": "100/hour"}})
            assert api.send(qname).status_code == 201
            redis_server.kill()
            # A gateway may hold a share of the counter, already counted in Redis: at most
            # s = floor(100 x 1%) = 1 unit (docs/throttling.md, "local shares"), which it
            # spends without asking Redis. Past that, the outage is found and refused.
            refused = api.send(qname)
            if refused.status_code == 201:
                refused = api.send(qname)
            assert problem_code(refused, 503) == "unavailable" and refused.headers["Retry-After"] == "1"
            assert problem_code(api.send(qname), 503) == "unavailable"
            # Nothing limits reading a queue: still served.
            assert api.client.get(f"/v1/queues/{qname}").status_code == 200
            ready = api.client.get("/readyz")
            assert problem_code(ready, 503) == "unavailable"
            redis_server.restart()
            deadline = time.monotonic() + scaled(5)
            while api.send(qname).status_code != 201:
                assert time.monotonic() < deadline, "the gateway did not use Redis again"
                time.sleep(0.05)
            assert api.client.get("/readyz").status_code == 200
    finally:
        running.stop()
