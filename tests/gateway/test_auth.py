"""Auth over HTTP: scopes and globs, tenant isolation, POST /v1/tokens, JWT edge cases."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import jwt
import pytest

from tests.fixtures.dev_cluster import StoreTarget

from .conftest import Api, RunningGateway, api_for, problem_code, start_gateway


@pytest.fixture
def user(gateway: RunningGateway, qname: str) -> Iterator[Api]:
    """send to ``<qname>-out-*`` and receive from ``<qname>-in-*`` in tenant default."""
    yield from api_for(gateway, gateway.make_key(f"send:{qname}-out-* receive:{qname}-in-*"))


def test_scope_globs_decide_send_and_receive(admin: Api, user: Api, qname: str) -> None:
    out, inbox, other = f"{qname}-out-1", f"{qname}-in-1", f"{qname}-else"
    for name in (out, inbox, other):
        admin.put_queue(name)
    admin.send(inbox, "for user")
    assert user.send(out).status_code == 201
    assert problem_code(user.send(inbox), 403) == "forbidden"
    assert problem_code(user.send(other), 403) == "forbidden"
    assert problem_code(user.receive(out), 403) == "forbidden"
    (m,) = user.receive(inbox).json()["messages"]
    assert user.ack(inbox, [m["receipt"]]).json()["acked"] == 1
    for path in ("ack", "nack"):
        assert (
            problem_code(user.client.post(f"/v1/queues/{out}/{path}", json={"receipts": ["x"]}), 403)
            == "forbidden"
        )
    vis = user.client.post(f"/v1/queues/{out}/visibility", json={"receipt": "x", "timeout_s": 1})
    assert problem_code(vis, 403) == "forbidden"
    assert problem_code(user.client.delete(f"/v1/queues/{out}/messages/x"), 403) == "forbidden"


def test_queue_reads_need_some_scope_on_the_queue(admin: Api, user: Api, qname: str) -> None:
    out, other = f"{qname}-out-1", f"{qname}-else"
    admin.put_queue(out)
    admin.put_queue(other)
    assert user.client.get(f"/v1/queues/{out}").status_code == 200
    assert problem_code(user.client.get(f"/v1/queues/{other}"), 403) == "forbidden"
    names = {q["name"] for q in user.client.get("/v1/queues").json()["queues"]}
    assert out in names and other not in names
    # Defining a queue as it is needs only a scope on its name (applications do it at start-up);
    # creating or changing one needs manage: (tests/gateway/test_manage_scope.py).
    assert user.put_queue(out).status_code == 200
    assert problem_code(user.put_queue(f"{qname}-in-new"), 403) == "forbidden"
    assert problem_code(user.put_queue(f"{qname}-nope"), 403) == "forbidden"
    assert problem_code(user.client.patch(f"/v1/queues/{out}", json={"delay_s": 1}), 403) == "forbidden"
    assert problem_code(user.client.patch(f"/v1/queues/{other}", json={"delay_s": 1}), 403) == "forbidden"


def test_bad_queue_name_is_400_even_without_scope(user: Api) -> None:
    assert problem_code(user.client.get("/v1/queues/bad.name"), 400) == "invalid_request"


def test_tenants_are_isolated(gateway: RunningGateway, admin: Api, qname: str) -> None:
    tenant = gateway.make_tenant()
    for other in api_for(gateway, gateway.make_key("admin", tenant)):
        admin.put_queue(qname)
        admin.send(qname, "default's")
        # The other tenant's admin does not see it at all...
        assert problem_code(other.client.get(f"/v1/queues/{qname}"), 404) == "queue_not_found"
        assert qname not in {q["name"] for q in other.client.get("/v1/queues").json()["queues"]}
        assert problem_code(other.send(qname), 404) == "queue_not_found"
        assert problem_code(other.client.delete(f"/v1/queues/{qname}"), 404) == "queue_not_found"
        # ...and its queue of the same name is its own.
        assert other.put_queue(qname, visibility_timeout_s=9).status_code == 201
        assert other.receive(qname).json()["messages"] == []
        other.send(qname, "other's")
        (m,) = other.receive(qname).json()["messages"]
        assert m["body"] == "other's"
        # A receipt from one tenant does nothing in the other.
        assert admin.ack(qname, [m["receipt"]]).json()["acked"] == 0
        assert admin.client.get(f"/v1/queues/{qname}").json()["attributes"]["visibility_timeout_s"] == 30


def test_mint_token_and_use_it(gateway: RunningGateway, admin: Api, qname: str) -> None:
    admin.put_queue(qname)
    r = admin.client.post("/v1/tokens", json={"scope": f"send:{qname}", "ttl_s": 60})
    assert r.status_code == 201, r.text
    doc = r.json()
    assert set(doc) == {"token", "expires_at"}
    assert time.time() + 50 < doc["expires_at"] <= time.time() + 61
    for bearer in api_for(gateway, doc["token"]):
        assert bearer.send(qname).status_code == 201
        assert problem_code(bearer.receive(qname), 403) == "forbidden"
        # A JWT cannot mint more tokens.
        assert problem_code(bearer.client.post("/v1/tokens", json={}), 403) == "forbidden"


def test_mint_defaults_to_the_keys_scopes(gateway: RunningGateway, user: Api, qname: str) -> None:
    r = user.client.post("/v1/tokens")
    assert r.status_code == 201
    claims = jwt.decode(r.json()["token"], options={"verify_signature": False})
    assert set(claims["scope"].split()) == {f"send:{qname}-out-*", f"receive:{qname}-in-*"}


def test_mint_cannot_widen_scope(user: Api, qname: str) -> None:
    for scope in ("admin", "send:*", f"receive:{qname}-out-*", f"send:{qname}-*"):
        assert problem_code(user.client.post("/v1/tokens", json={"scope": scope}), 403) == "forbidden", scope
    narrower = user.client.post("/v1/tokens", json={"scope": f"send:{qname}-out-eu-*"})
    assert narrower.status_code == 201


def test_mint_validation(admin: Api) -> None:
    for body in ({"ttl_s": 0}, {"ttl_s": 86401}, {"scope": 5}, {"scope": "fly:*"}, {"other": 1}):
        assert problem_code(admin.client.post("/v1/tokens", json=body), 400) == "invalid_request", body


@pytest.fixture
def hs_key(gateway: RunningGateway) -> tuple[str, str, bytes]:
    """A tenant with an HS256 key registered under a kid."""
    tenant = gateway.make_tenant()
    secret = secrets.token_bytes(32)
    gateway.call(gateway.services.authenticator.jwt_keys.add(tenant, "k1", "HS256", secret))
    return tenant, "k1", secret


def _get_queues(gateway: RunningGateway, token: str) -> httpx.Response:
    return httpx.get(f"{gateway.url}/v1/queues", headers={"Authorization": f"Bearer {token}"})


def test_jwt_signed_with_a_registered_key(gateway: RunningGateway, hs_key: tuple[str, str, bytes]) -> None:
    tenant, kid, secret = hs_key
    now = int(time.time())
    claims = {"sub": "svc", "tenant": tenant, "scope": "receive:* send:*", "exp": now + 60}
    good = jwt.encode(claims, secret, algorithm="HS256", headers={"kid": kid})
    assert _get_queues(gateway, good).status_code == 200
    bad = {
        "expired": jwt.encode({**claims, "exp": now - 10}, secret, algorithm="HS256", headers={"kid": kid}),
        "no exp": jwt.encode(
            {k: v for k, v in claims.items() if k != "exp"}, secret, "HS256", headers={"kid": kid}
        ),
        "not yet": jwt.encode({**claims, "nbf": now + 600}, secret, algorithm="HS256", headers={"kid": kid}),
        "wrong key": jwt.encode(claims, secrets.token_bytes(32), algorithm="HS256", headers={"kid": kid}),
        "wrong kid": jwt.encode(claims, secret, algorithm="HS256", headers={"kid": "k2"}),
        # "none" takes no key: PyJWT reads "" as None, and its types only allow the "".
        "alg none": jwt.encode(claims, "", algorithm="none", headers={"kid": kid}),
        "audience": jwt.encode(
            {**claims, "aud": "elsewhere"}, secret, algorithm="HS256", headers={"kid": kid}
        ),
        "other tenant": jwt.encode(
            {**claims, "tenant": "default"}, secret, algorithm="HS256", headers={"kid": kid}
        ),
    }
    for name, token in bad.items():
        assert problem_code(_get_queues(gateway, token), 401) == "unauthorized", name


def test_jwt_scope_limits_what_it_can_do(gateway: RunningGateway, hs_key: tuple[str, str, bytes]) -> None:
    tenant, kid, secret = hs_key
    scope = "manage:jobs-1 send:jobs-*"
    claims = {"sub": "svc", "tenant": tenant, "scope": scope, "exp": int(time.time()) + 60}
    token = jwt.encode(claims, secret, algorithm="HS256", headers={"kid": kid})
    for api in api_for(gateway, token):
        assert api.put_queue("jobs-1").status_code == 201
        assert problem_code(api.put_queue("jobs-2"), 403) == "forbidden"  # send: does not create
        assert api.send("jobs-1").status_code == 201
        assert problem_code(api.receive("jobs-1"), 403) == "forbidden"
        assert problem_code(api.client.delete("/v1/queues/jobs-2"), 403) == "forbidden"


def test_jwt_audience_setting(tmp_path: Path, store_target: StoreTarget) -> None:
    gateway = start_gateway(tmp_path / "aud", target=store_target, jwt_audience="pushgate-prod")
    try:
        tenant = gateway.make_tenant()
        secret = secrets.token_bytes(32)
        gateway.call(gateway.services.authenticator.jwt_keys.add(tenant, "k1", "HS256", secret))
        claims = {"sub": "svc", "tenant": tenant, "scope": "receive:*", "exp": int(time.time()) + 60}

        def token(**extra: str) -> str:
            return jwt.encode({**claims, **extra}, secret, algorithm="HS256", headers={"kid": "k1"})

        assert _get_queues(gateway, token(aud="pushgate-prod")).status_code == 200
        for bad in (token(aud="elsewhere"), token()):
            assert problem_code(_get_queues(gateway, bad), 401) == "unauthorized"
    finally:
        gateway.stop()
