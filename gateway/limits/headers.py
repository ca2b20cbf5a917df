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

from throttling import Decision


def rate_limit_headers(decision: Decision) -> dict[str, str]:
    """The header fields for a decision (none when no limit applied).

    Runs on every limited request: list comprehensions into ``join`` (not generators), and
    one window, the common case, without a join at all.
    """
    windows = decision.windows
    if not windows:
        return {}
    if len(windows) == 1:
        (w,) = windows
        return {
            "RateLimit-Policy": f'"{w.policy}";q={w.quota};w={w.window_s}',
            "RateLimit": f'"{w.policy}";r={w.remaining};t={w.reset_s}',
        }
    return {
        "RateLimit-Policy": ", ".join([f'"{w.policy}";q={w.quota};w={w.window_s}' for w in windows]),
        "RateLimit": ", ".join([f'"{w.policy}";r={w.remaining};t={w.reset_s}' for w in windows]),
    }
