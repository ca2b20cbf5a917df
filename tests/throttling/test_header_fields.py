"""The IETF fields as bytes, for each form a decision's windows take (gateway/limits/headers.py)."""

from __future__ import annotations

from starlette.responses import Response

from gateway.limits.headers import rate_limit_fields, with_fields
from throttling import ALLOWED, Decision, Window
from throttling.window_counter import WindowCounter


def test_windows_counted_with_room_and_windows_built_at_the_count_read_the_same() -> None:
    tenant = WindowCounter("tenant-send-1s", 100, 1, now=10.0)
    queue = Window("queue-send", 50, 60, 0, 42)  # left without room: built at the count
    decision = Decision(False, [(tenant, 98.6, 0.25), queue], retry_after_s=42)
    expected = [
        (b"ratelimit-policy", b'"tenant-send-1s";q=100;w=1, "queue-send";q=50;w=60'),
        (b"ratelimit", b'"tenant-send-1s";r=98;t=1, "queue-send";r=0;t=42'),
    ]
    assert rate_limit_fields(decision) == expected
    assert rate_limit_fields(decision) == expected  # the second time from the kept members
    # The moving window's decisions are tuples of windows; they read as their windows say.
    moving = Decision(True, (Window("key-receive", 10, 3600, 9, 3600),))
    assert rate_limit_fields(moving) == [
        (b"ratelimit-policy", b'"key-receive";q=10;w=3600'),
        (b"ratelimit", b'"key-receive";r=9;t=3600'),
    ]
    assert [(w.policy, w.remaining, w.reset_s) for w in decision.windows] == [
        ("tenant-send-1s", 98, 1),
        ("queue-send", 0, 42),
    ]


def test_no_limit_adds_no_field_and_fields_go_out_as_raw_headers() -> None:
    assert rate_limit_fields(ALLOWED) == []
    response = with_fields(Response(b"{}", media_type="application/json"), rate_limit_fields(ALLOWED))
    assert "ratelimit" not in response.headers
    fields = [(b"ratelimit-policy", b'"p";q=1;w=1'), (b"ratelimit", b'"p";r=0;t=1')]
    response = with_fields(Response(b"{}", media_type="application/json"), fields)
    assert response.headers["RateLimit-Policy"] == '"p";q=1;w=1'
    assert response.headers["content-length"] == "2"
