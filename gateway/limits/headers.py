"""The IETF rate-limit header fields, from a limiter :class:`~throttling.Decision`.

Syntax of draft-ietf-httpapi-ratelimit-headers-10 (September 2025; unchanged since -08):
two Structured Field Lists, one member per policy, named by a quoted string::

    RateLimit-Policy: "tenant-send";q=100;w=1, "key-send";q=10;w=60
    RateLimit: "tenant-send";r=99;t=1, "key-send";r=0;t=42

``q`` quota and ``w`` window (seconds) of each policy; ``r`` what is left and ``t``
seconds until the window has room again. A refused request also gets ``Retry-After``
(RFC 9110, integer seconds), from the error's ``retry_after_s`` (``gateway/errors.py``).
The quota unit (``qu``) is the default, ``requests``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, TypeVar

from starlette.responses import Response

from throttling import Decision, Window

if TYPE_CHECKING:
    from throttling.window_counter import WindowCounter

R = TypeVar("R", bound=Response)
K = TypeVar("K")

Fields = list[tuple[bytes, bytes]]
"""Header fields as an ASGI response carries them: lower-case names, latin-1 values."""

_POLICY = b"ratelimit-policy"
_STATE = b"ratelimit"
# Each policy's quoted name and its ``RateLimit-Policy`` member, formatted once: they never
# change for a counter, and formatting them per request was most of what a limited response
# paid for its fields (docs/throttling.md, "What a check costs"). Kept by counter (a window
# counted with room, the common case: an identity lookup) or by (policy, quota, window) (a
# window built at the count); policies are the operators' limits, few, and the dicts are
# emptied when full.
_by_counter: dict[WindowCounter, tuple[bytes, bytes]] = {}
_by_window: dict[tuple[str, int, int], tuple[bytes, bytes]] = {}
_MAX_KEPT = 4096
_ceil = math.ceil


def rate_limit_fields(decision: Decision) -> Fields:
    """The fields for a decision (none when no limit applied), ready for a response's raw
    headers: one loop over the windows as counted, without building a :class:`Window`
    for each, and no header encoding left for Starlette."""
    report = decision.report
    if not report:
        return []
    policies: list[bytes] = []
    states: list[bytes] = []
    for entry in report:
        if isinstance(entry, Window):
            member = _by_window.get(entry[:3])
            if member is None:
                member = _keep(_by_window, entry[:3], entry.policy, entry.quota, entry.window_s)
            remaining, reset_s = entry.remaining, entry.reset_s
        else:
            counter, room, left = entry
            member = _by_counter.get(counter)
            if member is None:
                member = _keep(_by_counter, counter, counter.policy, counter.amount, counter.window_s)
            remaining, reset_s = int(room), _ceil(left)
        policies.append(member[1])
        states.append(b"%s;r=%d;t=%d" % (member[0], remaining, reset_s))
    if len(policies) == 1:
        return [(_POLICY, policies[0]), (_STATE, states[0])]
    return [(_POLICY, b", ".join(policies)), (_STATE, b", ".join(states))]


def _keep(
    kept: dict[K, tuple[bytes, bytes]], key: K, policy: str, quota: int, window_s: int
) -> tuple[bytes, bytes]:
    if len(kept) >= _MAX_KEPT:
        kept.clear()
    name = f'"{policy}"'.encode("latin-1")
    member = kept[key] = (name, b"%s;q=%d;w=%d" % (name, quota, window_s))
    return member


def with_fields(response: R, fields: Fields) -> R:
    """``response`` with ``fields`` appended to its raw headers (Starlette sends them as they
    are: no second encoding)."""
    if fields:
        response.raw_headers.extend(fields)
    return response
