"""The WebSocket protocol's rule for rate-limit refusals, without sockets (sans-I/O)."""

from __future__ import annotations

import orjson

from backend_store.errors import RateLimited
from push.close_codes import CloseCode
from push.settings import PushSettings
from push.ws_protocol import State, WsProtocol


def frames(proto: WsProtocol) -> list[dict[str, object]]:
    return [orjson.loads(f) for f in proto.data_to_send()]


def state_of(proto: WsProtocol) -> State:
    """The state read afresh: mypy would keep the earlier ``assert proto.state is not ...`` narrowing."""
    return proto.state


def test_refusals_are_error_frames_until_too_many_in_a_row_then_4008() -> None:
    proto = WsProtocol(PushSettings(rate_limited_frames=3))
    proto.refused(1, RateLimited("slow down", 7))
    proto.refused(2, RateLimited("slow down", 7))
    assert frames(proto) == [
        {"op": "error", "id": 1, "code": "rate_limited", "message": "slow down", "retry_after_s": 7},
        {"op": "error", "id": 2, "code": "rate_limited", "message": "slow down", "retry_after_s": 7},
    ]
    assert proto.state is not State.CLOSING
    proto.refused(3, RateLimited("slow down", 7))
    assert state_of(proto) is State.CLOSING and proto.close_code is CloseCode.POLICY
    assert frames(proto) == []


def test_an_admitted_request_resets_the_count() -> None:
    proto = WsProtocol(PushSettings(rate_limited_frames=2))
    proto.refused(1, RateLimited("slow down", 1))
    proto.admitted()
    proto.refused(2, RateLimited("slow down", 1))
    assert proto.state is not State.CLOSING
    assert len(frames(proto)) == 2
