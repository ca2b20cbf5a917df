"""What each rule sees in a snapshot: a value per subject. Pure functions, no I/O, no HTTP.

A subject is what an alert is about: a queue (``tenant/queue``), a node (``node/<id>``)
or the store (``store``). The engine turns values into firing and resolved alerts.
"""

from __future__ import annotations

from collections.abc import Iterable
from fnmatch import fnmatchcase

from web_console.monitor import DepthHistory, QueueSample, RateHistory, Snapshot

from .rules import AlertRule


def observe(
    rule: AlertRule,
    snapshot: Snapshot,
    history: DepthHistory,
    rates: RateHistory | None = None,
    queues: Iterable[QueueSample] | None = None,
) -> dict[str, float]:
    """``subject -> value`` for one rule; a subject missing from the result does not exist
    (now). A queue rule looks at ``queues`` (by default every queue of the snapshot)."""
    out: dict[str, float] = {}
    if rule.kind == "map_use":
        if snapshot.storage is not None:
            out["store"] = 100.0 * snapshot.storage.used_ratio
        return out
    if rule.kind == "disk_use":
        # Nodes publish their file system's figures; the embedded store has none (inert).
        for node in snapshot.nodes:
            if node.storage is not None and node.storage.disk_total_bytes > 0:
                out[f"node/{node.id}"] = 100.0 * node.storage.disk_used_ratio
        return out
    if rule.kind in ("node_down", "replication_lag"):
        for node in snapshot.nodes:
            value = (0.0 if node.healthy else 1.0) if rule.kind == "node_down" else float(node.lag)
            out[f"node/{node.id}"] = value
        return out
    for q in snapshot.queues if queues is None else queues:
        if q.tenant != rule.tenant or (rule.queue is not None and not fnmatchcase(q.name, rule.queue)):
            continue
        subject = f"{q.tenant}/{q.name}"
        if rule.kind == "queue_depth":
            out[subject] = float(q.visible)
        elif rule.kind == "oldest_age":
            out[subject] = q.oldest_age_s or 0.0
        elif rule.kind == "dlq_growth":
            out[subject] = float(history.growth(q.tenant, q.name, rule.window_s, snapshot.at))
        elif rule.kind == "dead_lettered":
            moved = (
                rates.increase(q.tenant, q.name, "dead_lettered", rule.window_s, snapshot.at) if rates else 0
            )
            out[subject] = float(moved)
        elif rule.kind == "no_consumers":
            out[subject] = 1.0 if q.consumers == 0 and q.visible > 0 else 0.0
    return out


def breaches(rule: AlertRule, value: float) -> bool:
    """Whether a value is past the rule's threshold (the firing side)."""
    if rule.kind in ("no_consumers", "node_down"):
        return value > 0
    return value > rule.threshold


def cleared(rule: AlertRule, value: float) -> bool:
    """Whether a value is back at or below the resolve level (the other side of the hysteresis band)."""
    if rule.kind in ("no_consumers", "node_down"):
        return value <= 0
    return value <= rule.clear_level
