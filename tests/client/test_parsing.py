"""The client's sans-I/O parts: SSE parsing, backoff, close-code decisions."""

from __future__ import annotations

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


def test_backoff_grows_jitters_and_resets() -> None:
    backoff = Backoff(initial_s=0.1, max_s=1.0)
    delays = [backoff.next_delay() for _ in range(8)]
    assert 0.05 <= delays[0] <= 0.1
    assert all(d <= 1.0 for d in delays) and delays[-1] >= 0.5
    backoff.reset()
    assert backoff.next_delay() <= 0.1


def test_close_codes() -> None:
    assert should_reconnect(1001) and should_reconnect(4008) and should_reconnect(1006)
    assert not should_reconnect(4001) and not should_reconnect(4003) and not should_reconnect(4400)
