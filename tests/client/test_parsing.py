"""The client's sans-I/O parts: SSE parsing, backoff, close-code decisions."""

from __future__ import annotations

import random

from pushgate_client import Backoff, SseParser
from pushgate_client.http_api import should_reconnect


def test_sse_parser_handles_split_chunks_comments_and_ids() -> None:
    parser = SseParser()
    stream = (
        'retry: 2000\n\n: ping\n\nid: s.1\nevent: message\ndata: {"a":1}\n\nid: s.2\ndata: x\ndata: y\n\n'
    )
    events = []
    for i in range(0, len(stream), 7):
        events += parser.feed(stream[i : i + 7])
    assert [(e.event, e.data, e.id) for e in events] == [
        ("message", '{"a":1}', "s.1"),
        ("message", "x\ny", "s.2"),
    ]
    assert parser.last_event_id == "s.2"
    assert parser.retry_ms == 2000
    assert parser.feed("event: close\r\ndata: {}\r\n\r\n")[0].event == "close"


def test_backoff_grows_with_full_jitter_and_resets() -> None:
    # docs/push.md: exponential backoff with *full* jitter: each delay is uniform in
    # [0, min(max_s, initial_s * 2**attempt)].
    backoff = Backoff(initial_s=0.1, max_s=1.0, rng=random.Random(7))
    ceilings = [min(1.0, 0.1 * 2**attempt) for attempt in range(8)]
    delays = [backoff.next_delay() for _ in ceilings]
    assert all(0 <= d <= c for d, c in zip(delays, ceilings, strict=True)), delays
    backoff.reset()
    assert backoff.next_delay() <= 0.1
    # Full, not equal, jitter: at the cap, delays cover the whole window, the lower half too.
    capped = Backoff(initial_s=1.0, max_s=1.0, rng=random.Random(11))
    samples = [capped.next_delay() for _ in range(400)]
    assert min(samples) < 0.1 and max(samples) > 0.9
    assert 0.4 < sum(samples) / len(samples) < 0.6
    assert sum(1 for s in samples if s < 0.5) > 150


def test_close_codes() -> None:
    assert should_reconnect(1001) and should_reconnect(4008) and should_reconnect(1006)
    assert not should_reconnect(4001) and not should_reconnect(4003) and not should_reconnect(4400)
