"""Alert rules: what they watch, their thresholds, and how they are checked and stored.

A rule belongs to a tenant. Queue kinds watch that tenant's queues (all of them, or
those matching ``queue``, a name or a glob); system kinds watch the node (map use) or
the cluster (node down, replication lag) and are for the operator tenant only.
"""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from backend_store.errors import InvalidRequest

QUEUE_KINDS = ("queue_depth", "oldest_age", "dlq_growth", "dead_lettered", "no_consumers")
SYSTEM_KINDS = ("map_use", "disk_use", "node_down", "replication_lag")
KINDS = QUEUE_KINDS + SYSTEM_KINDS

# What ``threshold`` means per kind (documented in docs/console.md and the OpenAPI schema).
THRESHOLD_MEANING = {
    "queue_depth": "visible messages above this",
    "oldest_age": "oldest message older than this many seconds",
    "dlq_growth": "the queue (a dead-letter queue) grew by more than this many messages over window_s",
    "dead_lettered": "more than this many of the queue's messages moved to its dead-letter queue over window_s",
    "no_consumers": "no consumers for this many seconds while messages wait",
    "map_use": "LMDB map use above this percentage of its maximum size",
    "disk_use": "a node's file system (under its data directory) used above this percentage",
    "node_down": "(unused: a node that is not up fires)",
    "replication_lag": "a node's replication lag above this many log entries",
}
# Resolve level as a fraction of the threshold when ``clear`` is not given (hysteresis):
# a depth alert at 1000 resolves only once the depth is back to 800.
DEFAULT_CLEAR_FRACTION = 0.8
_PATTERN = re.compile(r"[A-Za-z0-9_.*?-]{1,80}")
_FIELDS = {"kind", "queue", "threshold", "for_s", "clear", "window_s", "description"}


@dataclass(frozen=True, slots=True)
class AlertRule:
    id: str
    tenant: str
    kind: str
    threshold: float
    queue: str | None = None  # a queue name or glob; None: every queue of the tenant
    for_s: float = 0.0  # the condition must hold this long to fire (and its end this long to resolve)
    clear: float | None = None  # resolve at or below this (None: DEFAULT_CLEAR_FRACTION * threshold)
    window_s: float = 300.0  # dlq_growth, dead_lettered: the growth is measured over this window
    description: str = ""
    created_at: float = 0.0

    @property
    def system(self) -> bool:
        return self.kind in SYSTEM_KINDS

    @property
    def clear_level(self) -> float:
        if self.clear is not None:
            return self.clear
        if self.kind in ("dlq_growth", "dead_lettered", "no_consumers", "node_down"):
            return 0.0
        return self.threshold * DEFAULT_CLEAR_FRACTION

    @property
    def hold_s(self) -> float:
        """How long the condition must last before firing (no_consumers: its threshold)."""
        return max(self.for_s, self.threshold) if self.kind == "no_consumers" else self.for_s

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> AlertRule:
        return cls(**{k: doc[k] for k in cls.__dataclass_fields__ if k in doc})


def parse_rule(tenant: str, body: Mapping[str, Any], *, allow_system: bool) -> AlertRule:
    """Validate a rule as an admin sent it (API or CLI); raise InvalidRequest on any problem."""
    unknown = set(body) - _FIELDS
    if unknown:
        raise InvalidRequest(f"unknown alert rule fields: {', '.join(sorted(unknown))}")
    kind = body.get("kind")
    if kind not in KINDS:
        raise InvalidRequest(f"kind must be one of {', '.join(KINDS)}")
    if kind in SYSTEM_KINDS and not allow_system:
        raise InvalidRequest(f"{kind} rules watch the whole node; only the operator tenant may set them")
    queue = body.get("queue")
    if queue is not None:
        if kind in SYSTEM_KINDS:
            raise InvalidRequest(f"{kind} rules take no queue")
        if not isinstance(queue, str) or not _PATTERN.fullmatch(queue):
            raise InvalidRequest("queue must be a queue name or a glob of [A-Za-z0-9_.-*?]")
    threshold = _number(body, "threshold", 0.0 if kind == "node_down" else None, 0, 1e12)
    if kind in ("map_use", "disk_use") and threshold > 100:
        raise InvalidRequest(f"{kind} threshold is a percentage: 0..100")
    clear = _number(body, "clear", None, 0, 1e12) if body.get("clear") is not None else None
    if clear is not None and clear > threshold:
        raise InvalidRequest("clear must not be above threshold (it is where a firing alert resolves)")
    description = body.get("description", "")
    if not isinstance(description, str) or len(description) > 500:
        raise InvalidRequest("description must be a string of at most 500 characters")
    return AlertRule(
        id="r" + secrets.token_hex(6),
        tenant=tenant,
        kind=kind,
        threshold=threshold,
        queue=queue,
        for_s=_number(body, "for_s", 0.0, 0, 86400),
        clear=clear,
        window_s=_number(body, "window_s", 300.0, 1, 86400),
        description=description,
        created_at=time.time(),
    )


def _number(body: Mapping[str, Any], name: str, default: float | None, low: float, high: float) -> float:
    value = body.get(name, default)
    if value is None:
        raise InvalidRequest(f"{name} is required")
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise InvalidRequest(f"{name} must be a number in {low:g}..{high:g}")
    return float(value)
