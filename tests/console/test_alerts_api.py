"""Alerts end to end: rules through the API and `pushgate admin alerts`, firing and resolving
on a running gateway, exported as metrics, POSTed to a real webhook receiver with retries."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import orjson

from tests.conftest import scaled
from tests.gateway.conftest import Api, RunningGateway, problem_code

from .conftest import WebhookReceiver, operations, scrape, wait_until


def active(api: Api) -> list[dict[str, object]]:
    alerts: list[dict[str, object]] = api.client.get("/v1/alerts").json()["active"]
    return alerts


def test_rules_api(tenant_admin: Api, ops_gateway: RunningGateway) -> None:
    r = tenant_admin.client.post("/v1/alerts/rules", json={"kind": "queue_depth", "threshold": 5})
    assert r.status_code == 201
    rule = r.json()
    assert rule["kind"] == "queue_depth" and rule["threshold"] == 5
    assert [x["id"] for x in tenant_admin.client.get("/v1/alerts/rules").json()["rules"]] == [rule["id"]]
    # System kinds belong to the operator tenant.
    r = tenant_admin.client.post("/v1/alerts/rules", json={"kind": "map_use", "threshold": 90})
    assert problem_code(r, 400) == "invalid_request"
    assert tenant_admin.client.delete(f"/v1/alerts/rules/{rule['id']}").status_code == 204
    assert problem_code(tenant_admin.client.delete(f"/v1/alerts/rules/{rule['id']}"), 404) == "not_found"
    sender = ops_gateway.make_key("send:* receive:*")
    r = tenant_admin.client.get("/v1/alerts/rules", headers={"Authorization": f"Bearer {sender}"})
    assert problem_code(r, 403) == "forbidden"


def test_an_alert_fires_resolves_is_exported_and_posted(
    ops_gateway: RunningGateway, tenant_admin: Api, qname: str, webhook: WebhookReceiver
) -> None:
    tenant_admin.put_queue(qname, visibility_timeout_s=60)
    rule = tenant_admin.client.post(
        "/v1/alerts/rules", json={"kind": "queue_depth", "threshold": 2, "queue": qname}
    ).json()
    for i in range(3):
        tenant_admin.send(qname, f"m{i}")
    wait_until(lambda: len(active(tenant_admin)) == 1, what="the alert to fire")
    [alert] = active(tenant_admin)
    subject = alert["subject"]
    assert isinstance(subject, str) and subject.endswith(f"/{qname}") and alert["value"] == 3
    text = scrape(ops_gateway.url, ops_gateway.admin_key).text
    assert f'pushgate_alerts_firing{{kind="queue_depth",rule="{rule["id"]}"' in text

    # Down to 2 (= the threshold, above clear 1.6): still firing. Down to 1: resolved.
    [m] = tenant_admin.receive(qname, max=1).json()["messages"]
    tenant_admin.ack(qname, [m["receipt"]])
    operations(ops_gateway).sampler.poke()
    receipts = [m["receipt"] for m in tenant_admin.receive(qname, max=1).json()["messages"]]
    tenant_admin.ack(qname, receipts)
    wait_until(lambda: active(tenant_admin) == [], what="the alert to resolve")
    history = tenant_admin.client.get("/v1/alerts").json()["history"]
    assert [e["state"] for e in history if e["rule_id"] == rule["id"]] == ["resolved", "fired"]

    # The webhook got both, each after one failed attempt (the receiver refuses a first try).
    def mine(events: list[dict[str, Any]]) -> list[str]:  # JSON bodies, as the receiver keeps them
        return [e["alert"]["state"] for e in events if e["alert"]["rule_id"] == rule["id"]]

    delivered = webhook.wait_for(lambda events: len(mine(events)) == 2)
    assert mine(delivered) == ["fired", "resolved"]
    assert mine(webhook.attempts) == ["fired", "fired", "resolved", "resolved"]
    engine = operations(ops_gateway).alerts
    # The receiver records a POST before the gateway has read its answer.
    wait_until(lambda: engine.webhook_outcomes().get("delivered", 0) >= 2, what="the deliveries counted")


def test_pushgate_admin_alerts_on_a_running_gateway(ops_gateway: RunningGateway, qname: str) -> None:
    tenant = ops_gateway.make_tenant()
    data = str(ops_gateway.settings.data_dir)

    def admin(*args: str) -> dict[str, object]:
        out = subprocess.run(
            [sys.executable, "-m", "gateway.cli", "admin", "--data", data, "alerts", *args],
            capture_output=True,
            text=True,
            timeout=scaled(60),
            check=True,
        )
        doc: dict[str, object] = orjson.loads(out.stdout)
        return doc

    rule = admin("add", "--tenant", tenant, "--kind", "oldest_age", "--threshold", "60", "--queue", qname)
    assert rule["kind"] == "oldest_age" and rule["queue"] == qname
    rules = admin("list", "--tenant", tenant)["rules"]
    assert isinstance(rules, list) and [r["id"] for r in rules] == [rule["id"]]
    # The running gateway reads rules from the store on its next sample.
    engine = operations(ops_gateway).alerts
    wait_until(lambda: any(r.id == rule["id"] for r in engine.rules), what="the gateway to load the rule")
    assert admin("remove", "--tenant", tenant, str(rule["id"])) == {"removed": rule["id"], "tenant": tenant}
    wait_until(lambda: all(r.id != rule["id"] for r in engine.rules), what="the gateway to drop the rule")
    failed = subprocess.run(
        [
            sys.executable,
            "-m",
            "gateway.cli",
            "admin",
            "--data",
            data,
            "alerts",
            "add",
            "--tenant",
            tenant,
            "--kind",
            "map_use",
            "--threshold",
            "90",
        ],
        capture_output=True,
        text=True,
        timeout=scaled(60),
    )
    assert failed.returncode == 1 and "operator" in failed.stderr
