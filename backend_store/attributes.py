"""Validation of queue attributes against docs/api.md's bounds.

Pure functions: the store calls them inside its writer, the gateway may call them
early to fail fast. Both give the same answer because there is one table.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .errors import InvalidRequest
from .limits import MAX_DELAY_S, MAX_RECEIVE_PER_CALL, MAX_VISIBILITY_S, MAX_WAIT_S
from .types import QueueAttributes

# 1-80 characters of [A-Za-z0-9_-], or such a name ending in ".fifo" (as SQS requires of FIFO
# queues; 80 characters in all). The suffix does not make a queue FIFO: ordering is an attribute.
# Anchored because OpenAPI's patterns are searches, not full matches.
QUEUE_NAME = re.compile(r"^(?:[A-Za-z0-9_-]{1,80}|[A-Za-z0-9_-]{1,75}\.fifo)$")
QUEUE_NAME_RULE = "1-80 characters of [A-Za-z0-9_-], or such a name ending in .fifo (80 in all)"

# Attributes that can never change after creation (SQS: FifoQueue).
IMMUTABLE = frozenset({"ordering", "partitions"})


@dataclass(frozen=True, slots=True)
class Bound:
    kind: type
    low: float | None = None
    high: float | None = None
    nullable: bool = False
    choices: tuple[str, ...] = ()


BOUNDS: dict[str, Bound] = {
    "max_message_bytes": Bound(int, 1, 1048576),
    "max_messages": Bound(int, 1, 10**9, nullable=True),
    "visibility_timeout_s": Bound(float, 0, MAX_VISIBILITY_S),
    "retention_s": Bound(float, 60, 1209600),
    "delay_s": Bound(float, 0, MAX_DELAY_S),
    "receive_wait_s": Bound(float, 0, MAX_WAIT_S),
    "max_receives": Bound(int, 1, 1000, nullable=True),
    "dead_letter_queue": Bound(str, nullable=True),
    "ordering": Bound(str, choices=("best_effort", "fifo")),
    "dedupe_window_s": Bound(float, 0, 86400),
    "content_dedupe": Bound(bool),
    "replication_factor": Bound(int, 1, 5),
    "replication_mode": Bound(str, choices=("sync", "async")),
    "partitions": Bound(int, 1, 64),
}


def check_queue_name(name: str, what: str = "queue name") -> None:
    if not isinstance(name, str) or not QUEUE_NAME.fullmatch(name):
        raise InvalidRequest(f"{what} must be {QUEUE_NAME_RULE}")


def _check_value(name: str, value: Any) -> Any:
    bound = BOUNDS[name]
    if value is None:
        if bound.nullable:
            return None
        raise InvalidRequest(f"{name} cannot be null")
    if bound.kind is bool:
        if not isinstance(value, bool):
            raise InvalidRequest(f"{name} must be a boolean")
        return value
    if bound.kind is str:
        if not isinstance(value, str):
            raise InvalidRequest(f"{name} must be a string")
        if bound.choices and value not in bound.choices:
            raise InvalidRequest(f"{name} must be one of {', '.join(bound.choices)}")
        if name == "dead_letter_queue":
            check_queue_name(value, "dead_letter_queue")
        return value
    # Numbers: bool is an int in Python but never a valid number here.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidRequest(f"{name} must be a number")
    if bound.kind is int:
        if isinstance(value, float) and not value.is_integer():
            raise InvalidRequest(f"{name} must be an integer")
        value = int(value)
    elif not math.isfinite(value):
        raise InvalidRequest(f"{name} must be finite")
    assert bound.low is not None and bound.high is not None
    if not bound.low <= value <= bound.high:
        raise InvalidRequest(f"{name} must be between {bound.low:g} and {bound.high:g}")
    return value


def check_number(name: str, value: Any, low: float, high: float, *, integer: bool = False) -> float:
    """Validate a request parameter (``max``, ``wait_s``, ...) against inclusive bounds."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidRequest(f"{name} must be a number")
    if integer and isinstance(value, float) and not value.is_integer():
        raise InvalidRequest(f"{name} must be an integer")
    if not math.isfinite(value) or not low <= value <= high:
        raise InvalidRequest(f"{name} must be between {low:g} and {high:g}")
    return value


def check_receive(max_messages: Any, visibility_timeout_s: Any) -> None:
    """Validate a receive's (or a standing demand's) count and visibility override."""
    check_number("max", max_messages, 1, MAX_RECEIVE_PER_CALL, integer=True)
    if visibility_timeout_s is not None:
        check_number("visibility_timeout_s", visibility_timeout_s, 0, MAX_VISIBILITY_S)


def _validated(changes: Mapping[str, Any]) -> dict[str, Any]:
    if not isinstance(changes, Mapping):
        raise InvalidRequest("attributes must be an object")
    unknown = sorted(set(changes) - set(BOUNDS))
    if unknown:
        raise InvalidRequest(f"unknown attribute: {', '.join(unknown)}")
    return {name: _check_value(name, value) for name, value in changes.items()}


def _cross_check(attrs: QueueAttributes) -> QueueAttributes:
    if (attrs.max_receives is None) != (attrs.dead_letter_queue is None):
        raise InvalidRequest("max_receives and dead_letter_queue go together")
    return attrs


def parse_attributes(raw: Mapping[str, Any]) -> QueueAttributes:
    """Build attributes for a new queue: defaults for what is left out."""
    return _cross_check(QueueAttributes(**_validated(raw)))


def apply_patch(current: QueueAttributes, changes: Mapping[str, Any]) -> QueueAttributes:
    """Apply a PATCH: only mutable attributes, the rest kept."""
    values = _validated(changes)
    for name in IMMUTABLE & set(values):
        if values[name] != getattr(current, name):
            raise InvalidRequest(f"{name} cannot be changed after creation")
    return _cross_check(dataclasses.replace(current, **values))


def attributes_from_record(raw: Mapping[str, Any]) -> QueueAttributes:
    """Read attributes back from storage, tolerating attributes added in later versions."""
    known = {k: v for k, v in raw.items() if k in BOUNDS}
    return QueueAttributes(**known)
