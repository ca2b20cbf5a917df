"""deploy/: the Prometheus rules and the Grafana dashboard parse and name only real metrics."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from gateway.metrics_catalog import CATALOG

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
# Every series name a query may use: families plus their _total/_bucket/_sum/_count forms.
KNOWN = {m.exposed_name for m in CATALOG} | {
    f"{m.name}{suffix}" for m in CATALOG if m.type == "histogram" for suffix in ("_bucket", "_sum", "_count")
}


def metric_names(expr: str) -> set[str]:
    return set(re.findall(r"\b(?:pushgate|process|python)_[a-z0-9_]+\b", expr))


def test_prometheus_rules_use_known_metrics() -> None:
    doc = yaml.safe_load((DEPLOY / "prometheus-alerts.yml").read_text())
    rules = [r for g in doc["groups"] for r in g["rules"]]
    assert len(rules) >= 10
    for rule in rules:
        assert {"alert", "expr", "labels", "annotations"} <= set(rule)
        unknown = metric_names(rule["expr"]) - KNOWN
        assert not unknown, (rule["alert"], unknown)


def test_grafana_dashboard_uses_known_metrics() -> None:
    doc = json.loads((DEPLOY / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in doc["panels"] for t in p["targets"]]
    assert len(exprs) >= 15
    for expr in exprs:
        unknown = metric_names(expr) - KNOWN
        assert not unknown, (expr, unknown)
    shown = {n for e in exprs for n in metric_names(e)}
    assert "pushgate_queue_messages" in shown and "pushgate_store_map_used_ratio" in shown
