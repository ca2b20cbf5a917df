"""SSE framing and Last-Event-ID parsing, without sockets."""

from __future__ import annotations

import orjson

from push.close_codes import CloseCode
from push.sse_protocol import PING, SseEncoder, new_stream_id, parse_last_event_id


def parse_events(raw: bytes) -> list[dict[str, str]]:
    events = []
    for block in raw.decode().split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.split("\n"):
            if line and not line.startswith(":"):
                name, _, value = line.partition(": ")
                fields[name] = value
        if fields:
            events.append(fields)
    return events


def test_message_events_carry_stream_and_number() -> None:
    stream = new_stream_id()
    encoder = SseEncoder(stream)
    payload = orjson.dumps({"id": "m", "body": "line1\nline2"})
    (event,) = parse_events(encoder.message(7, payload))
    assert event == {"id": f"{stream}.7", "event": "message", "data": payload.decode()}
    events = parse_events(b"".join(encoder.frames([payload, payload], 3)))
    assert [e["id"] for e in events] == [f"{stream}.3", f"{stream}.4"]


def test_opening_sends_retry_once_and_a_ping() -> None:
    opening = SseEncoder(new_stream_id()).opening(1500)
    assert opening.startswith(b"retry: 1500\n\n")
    assert opening.endswith(PING)
    assert PING == b": ping\n\n"


def test_closing_event_says_whether_to_reconnect() -> None:
    (event,) = parse_events(SseEncoder.closing(CloseCode.POLICY, "slow"))
    assert event["event"] == "close"
    assert orjson.loads(event["data"]) == {"code": 4008, "reason": "slow", "reconnect": True}


def test_last_event_id() -> None:
    stream = new_stream_id()
    assert parse_last_event_id(f"{stream}.12") == (stream, 12)
    for bad in (None, "", "12", "short.1", f"{stream}.", f"{stream}.x", f"{stream}.-1", "a b c d e f g.1"):
        assert parse_last_event_id(bad) is None
