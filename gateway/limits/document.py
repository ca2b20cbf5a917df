"""The limits document of ``GET/PUT /v1/limits`` (API.md "Limits").

::

    {"send": "1000/second", "receive": "1000/second", "connect": "50/second",
     "per_key": {"send": "100/second", "receive": null, "connect": null},
     "per_queue": {"send": "500/second", "receive": null},
     "max_queues": 1000, "max_stored_messages": 10000000}

Top-level rates count the whole tenant; ``per_key`` counts each credential (API key id,
or a JWT's ``sub``) on its own; ``per_queue`` each queue on its own. A rate counts
requests: an HTTP send or receive (a batch is one), a WebSocket ``send`` or
``subscribe`` frame, an SSE stream or WebSocket opened (``connect``).
A PUT merges: fields left out keep their value, ``null`` removes a limit, and the same
holds inside ``per_key`` and ``per_queue``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from backend_store.errors import InvalidRequest
from push.principal import Operation
from throttling import InvalidLimit, Rate, parse_rate

OPERATIONS: tuple[Operation, ...] = ("send", "receive", "connect")
# A queue sees sends and receives; connections are not to a queue.
QUEUE_OPERATIONS: tuple[Operation, ...] = ("send", "receive")
QUOTA_BOUNDS: dict[str, tuple[int, int]] = {
    "max_queues": (1, 1_000_000),
    "max_stored_messages": (1, 10**12),
}
_SCOPES: dict[str, tuple[Operation, ...]] = {"per_key": OPERATIONS, "per_queue": QUEUE_OPERATIONS}
FIELDS = frozenset({*OPERATIONS, *_SCOPES, *QUOTA_BOUNDS})

Rates = Mapping[Operation, Rate]


@dataclass(frozen=True, slots=True)
class TenantLimits:
    """One tenant's limits; an absent entry is no limit."""

    tenant: dict[Operation, Rate] = field(default_factory=dict)
    per_key: dict[Operation, Rate] = field(default_factory=dict)
    per_queue: dict[Operation, Rate] = field(default_factory=dict)
    max_queues: int | None = None
    max_stored_messages: int | None = None

    @property
    def empty(self) -> bool:
        return not (self.tenant or self.per_key or self.per_queue) and self.quota_free

    @property
    def quota_free(self) -> bool:
        return self.max_queues is None and self.max_stored_messages is None

    def to_dict(self) -> dict[str, Any]:
        """The API document: every field present, ``null`` where there is no limit."""
        return {
            **_rates_json(self.tenant, OPERATIONS),
            "per_key": _rates_json(self.per_key, OPERATIONS),
            "per_queue": _rates_json(self.per_queue, QUEUE_OPERATIONS),
            "max_queues": self.max_queues,
            "max_stored_messages": self.max_stored_messages,
        }

    def to_bytes(self) -> bytes:
        return orjson.dumps(self.to_dict())

    @classmethod
    def from_bytes(cls, raw: bytes) -> TenantLimits:
        return NO_LIMITS.merged(orjson.loads(raw))

    def merged(self, changes: Any) -> TenantLimits:
        """The limits after a PUT of ``changes``; :class:`InvalidRequest` if it is not valid."""
        if not isinstance(changes, Mapping):
            raise InvalidRequest("the limits document must be a JSON object")
        unknown = sorted(set(changes) - FIELDS)
        if unknown:
            raise InvalidRequest(f"unknown limits field(s): {', '.join(unknown)}")
        scoped: dict[str, dict[Operation, Rate]] = {"per_key": self.per_key, "per_queue": self.per_queue}
        for scope, operations in _SCOPES.items():
            if scope not in changes:
                continue
            inner = changes[scope]
            if inner is None:
                inner = dict.fromkeys(operations)
            if not isinstance(inner, Mapping):
                raise InvalidRequest(f"{scope} must be an object of rates (or null)")
            bad = sorted(set(inner) - set(operations))
            if bad:
                raise InvalidRequest(f"{scope} takes {', '.join(operations)}; not {', '.join(bad)}")
            scoped[scope] = _merge_rates(scoped[scope], inner, scope + ".")
        quotas = {
            name: _quota(name, changes[name], low, high) if name in changes else getattr(self, name)
            for name, (low, high) in QUOTA_BOUNDS.items()
        }
        return TenantLimits(
            tenant=_merge_rates(self.tenant, {k: v for k, v in changes.items() if k in OPERATIONS}, ""),
            per_key=scoped["per_key"],
            per_queue=scoped["per_queue"],
            max_queues=quotas["max_queues"],
            max_stored_messages=quotas["max_stored_messages"],
        )


NO_LIMITS = TenantLimits()


def _rates_json(rates: Rates, operations: tuple[Operation, ...]) -> dict[str, str | None]:
    return {op: (str(rates[op]) if op in rates else None) for op in operations}


def _merge_rates(current: Rates, changes: Mapping[str, Any], where: str) -> dict[Operation, Rate]:
    out = dict(current)
    for name, value in changes.items():
        op: Operation = name  # type: ignore[assignment]  # checked by the caller
        if value is None:
            out.pop(op, None)
            continue
        try:
            out[op] = parse_rate(value)
        except InvalidLimit as exc:
            raise InvalidRequest(f"{where}{name}: {exc.detail}") from None
    return out


def _quota(name: str, value: Any, low: int, high: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidRequest(f"{name} must be an integer {low}..{high} or null")
    return value
