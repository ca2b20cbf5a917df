"""Peek and redrive over HTTP (API.md "Dead letters")."""

from __future__ import annotations

from tests.gateway.conftest import Api, RunningGateway, api_for, problem_code


def dead_letter(api: Api, source: str, dlq: str, bodies: list[str]) -> None:
    assert api.put_queue(dlq).status_code == 201
    api.put_queue(source, max_receives=1, dead_letter_queue=dlq, visibility_timeout_s=0)
    for body in bodies:
        api.send(source, body)
    api.receive(source, max=10)  # receive_count 1, visible again at once (timeout 0)
    assert api.receive(source, max=10).json() == {"messages": []}  # past max_receives: moved


def test_peek_and_redrive(tenant_admin: Api, ops_gateway: RunningGateway, qname: str) -> None:
    dlq = f"{qname}-dlq"
    dead_letter(tenant_admin, qname, dlq, ["a", "b", "c"])
    peeked = tenant_admin.client.get(f"/v1/queues/{dlq}/peek", params={"max": 2}).json()["messages"]
    assert [m["body"] for m in peeked] == ["a", "b"]
    assert all("receipt" not in m and m["state"] == "visible" for m in peeked)
    r = tenant_admin.client.post(f"/v1/queues/{dlq}/redrive", json={"to": qname, "max": 2})
    assert r.json() == {"moved": 2}
    assert tenant_admin.client.post(f"/v1/queues/{dlq}/redrive", json={"to": qname}).json() == {"moved": 1}
    assert tenant_admin.client.post(f"/v1/queues/{dlq}/redrive", json={"to": qname}).json() == {"moved": 0}
    bodies = [m["body"] for m in tenant_admin.receive(qname, max=10).json()["messages"]]
    assert bodies == ["a", "b", "c"]


def test_peek_and_redrive_permissions(ops_gateway: RunningGateway, qname: str) -> None:
    tenant = ops_gateway.make_tenant()
    dlq = f"{qname}-dlq"
    for admin in api_for(ops_gateway, ops_gateway.make_key("admin", tenant)):
        dead_letter(admin, qname, dlq, ["x"])
    for key, peek, redrive in (
        (f"receive:{dlq}", 200, 403),
        (f"send:{dlq}", 403, 403),
        ("admin", 200, 200),
    ):
        for api in api_for(ops_gateway, ops_gateway.make_key(key, tenant)):
            assert api.client.get(f"/v1/queues/{dlq}/peek").status_code == peek, key
            r = api.client.post(f"/v1/queues/{dlq}/redrive", json={"to": qname})
            assert r.status_code == redrive, key
    # Another tenant's admin: the queue does not exist for it.
    for api in api_for(ops_gateway, ops_gateway.make_key("admin")):
        assert problem_code(api.client.get(f"/v1/queues/{dlq}/peek"), 404) == "queue_not_found"
    for api in api_for(ops_gateway, None):
        assert problem_code(api.client.get(f"/v1/queues/{dlq}/peek"), 401) == "unauthorized"


def test_redrive_validation(tenant_admin: Api, qname: str) -> None:
    tenant_admin.put_queue(qname)
    for body in ({}, {"to": 5}, {"to": qname, "max": 0}, {"to": qname, "max": True}, {"to": qname, "x": 1}):
        r = tenant_admin.client.post(f"/v1/queues/{qname}/redrive", json=body)
        assert problem_code(r, 400) == "invalid_request", body
    r = tenant_admin.client.post(f"/v1/queues/{qname}/redrive", json={"to": "missing"})
    assert problem_code(r, 404) == "queue_not_found"
    r = tenant_admin.client.get(f"/v1/queues/{qname}/peek", params={"max": "lots"})
    assert problem_code(r, 400) == "invalid_request"
