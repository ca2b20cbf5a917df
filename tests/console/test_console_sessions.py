"""A console session lives no longer than the credential that opened it."""

from __future__ import annotations

import threading

import httpx

from tests.conftest import scaled
from tests.gateway.conftest import RunningGateway

from .test_console_http import logged_in


def test_revoking_a_key_ends_its_console_sessions(ops_gateway: RunningGateway) -> None:
    tenant = ops_gateway.make_tenant()
    api_keys = ops_gateway.services.authenticator.api_keys
    record, key = ops_gateway.call(api_keys.create(tenant, "admin"))
    # A JWT minted from the key stands on it too.
    jwt = httpx.post(
        f"{ops_gateway.url}/v1/tokens", json={"ttl_s": 600}, headers={"Authorization": f"Bearer {key}"}
    ).json()["token"]
    _, other_key = ops_gateway.call(api_keys.create(tenant, "admin"))

    with (
        logged_in(ops_gateway, key) as by_key,
        logged_in(ops_gateway, jwt) as by_jwt,
        logged_in(ops_gateway, other_key) as by_other,
    ):
        for client in (by_key, by_jwt, by_other):
            assert client.get("/console/").status_code == 200
        opened, ended = threading.Event(), threading.Event()

        def watch() -> None:
            with by_key.stream("GET", "/console/events") as stream:
                for _ in stream.iter_lines():
                    opened.set()
            ended.set()

        threading.Thread(target=watch, daemon=True).start()
        assert opened.wait(scaled(10)) and not ended.is_set()

        ops_gateway.call(api_keys.revoke(record.key_id))

        # Pages send both sessions to the login page at once, actions are refused, and
        # the live stream ends within its recheck interval (2 s).
        for client in (by_key, by_jwt):
            page = client.get("/console/")
            assert page.status_code == 303 and page.headers["location"] == "/console/login"
            assert client.post("/console/logout", data={"csrf": "x"}).status_code == 403
            assert client.get("/console/events").status_code == 401
        assert ended.wait(scaled(10)), "the live stream of a revoked key's session did not end"
        # Another key's session is untouched.
        assert by_other.get("/console/").status_code == 200
