"""Default alert rules: a fresh gateway's operator starts with them, a store whose operator
set rules keeps exactly those, and a default deleted stays deleted across restarts.

Real gateways (``pushgate serve`` in process, on a data directory of the test's own) and
``pushgate admin`` as a separate process, as an operator would run them.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson

from backend_store import StoreOptions, open_backend
from tests.conftest import scaled
from tests.fixtures.dev_cluster import StoreTarget
from tests.gateway.conftest import RunningGateway, api_for, start_gateway
from web_console.alerts import RuleStore
from web_console.alerts.defaults import default_rules
from web_console.alerts.store import DEFAULTS_NAMESPACE

from .conftest import operations, wait_until

DEFAULT_IDS = [r.id for r in default_rules("default")]


def rules_of(gateway: RunningGateway, token: str) -> list[dict[str, Any]]:
    for api in api_for(gateway, token):
        rules: list[dict[str, Any]] = api.client.get("/v1/alerts/rules").json()["rules"]
        return rules
    raise AssertionError("unreachable")


def wait_first_evaluation(gateway: RunningGateway) -> None:
    engine = operations(gateway).alerts
    wait_until(lambda: engine.evaluations > 0, what="the first sample's evaluation")


def admin_cli(data: Path, *args: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "admin", "--data", str(data), "alerts", *args],
        capture_output=True,
        text=True,
        timeout=scaled(60),
        check=True,
    )
    doc: dict[str, Any] = orjson.loads(out.stdout)
    return doc


def test_a_fresh_gateway_gives_the_operator_the_default_rules_once(tmp_path: Path) -> None:
    data = tmp_path / "data"
    gateway = start_gateway(data, monitor_interval_s=0.2)
    try:
        wait_first_evaluation(gateway)
        rules = rules_of(gateway, gateway.admin_key)
        assert sorted(r["id"] for r in rules) == sorted(DEFAULT_IDS)
        kinds = {r["kind"]: r for r in rules}
        assert set(kinds) == {
            "dead_lettered",
            "oldest_age",
            "node_down",
            "replication_lag",
            "map_use",
            "disk_use",
        }
        assert kinds["map_use"]["threshold"] == 85 and kinds["oldest_age"]["threshold"] == 3600
        # Another tenant's admin starts with none (rules belong to a tenant).
        other = gateway.make_key("admin", gateway.make_tenant())
        assert rules_of(gateway, other) == []
        # Editable as any rule: the operator deletes one.
        for api in api_for(gateway, gateway.admin_key):
            assert api.client.delete("/v1/alerts/rules/default-oldest-age").status_code == 204
    finally:
        gateway.stop()
    # A restart does not put it back.
    again = start_gateway(data, target=StoreTarget(admin_key=gateway.admin_key), monitor_interval_s=0.2)
    try:
        wait_first_evaluation(again)
        ids = [r["id"] for r in rules_of(again, again.admin_key)]
        assert sorted(ids) == sorted(i for i in DEFAULT_IDS if i != "default-oldest-age")
    finally:
        again.stop()


def test_a_store_whose_operator_set_rules_keeps_exactly_those(tmp_path: Path) -> None:
    data = tmp_path / "data"
    first = start_gateway(data, monitor_interval_s=3600)
    wait_first_evaluation(first)
    key = StoreTarget(admin_key=first.admin_key)
    first.stop()
    asyncio.run(as_before_default_rules(first.settings.resolved_store_url))
    own = admin_cli(data, "add", "--tenant", "default", "--kind", "queue_depth", "--threshold", "500")
    gateway = start_gateway(data, target=key, monitor_interval_s=0.2)
    try:
        wait_first_evaluation(gateway)
        assert [r["id"] for r in rules_of(gateway, gateway.admin_key)] == [own["id"]]
    finally:
        gateway.stop()
    # Deleting its only rule later does not bring the defaults in either.
    admin_cli(data, "remove", "--tenant", "default", own["id"])
    gateway = start_gateway(data, target=key, monitor_interval_s=0.2)
    try:
        wait_first_evaluation(gateway)
        assert rules_of(gateway, gateway.admin_key) == []
    finally:
        gateway.stop()


async def as_before_default_rules(url: str) -> None:
    """Make the store what a gateway from before default rules left: no rules, no record."""
    backend = open_backend(url, StoreOptions(sweep_interval_s=0))
    await backend.start()
    try:
        rules = RuleStore(backend)
        for rule in await rules.list():
            await rules.delete(rule.tenant, rule.id)
        assert await backend.meta_delete(DEFAULTS_NAMESPACE, "default")
    finally:
        await backend.close()
