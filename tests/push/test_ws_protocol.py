"""The pushgate.v1 frame protocol, fed strings: no sockets."""

from __future__ import annotations

import orjson
import pytest

from backend_store.errors import InvalidRequest
from backend_store.types import NewMessage
from push.close_codes import CloseCode, should_reconnect
from push.settings import PushSettings
from push.ws_protocol import (
    AckRequest,
    AuthRequest,
    FrameError,
    NackRequest,
    PingRequest,
    ProtocolViolation,
    SendRequest,
    State,
    SubscribeRequest,
    UnsubscribeRequest,
    WsProtocol,
    error_frame,
    message_frame,
    message_prefix,
    messages_frame,
    messages_prefix,
    ok_frame,
    pong_frame,
)


def frame(**fields: object) -> str:
    return orjson.dumps(fields).decode()


@pytest.fixture
def proto() -> WsProtocol:
    return WsProtocol(PushSettings(max_frame_bytes=1000), authenticated=True)


def violation(proto: WsProtocol, text: str) -> ProtocolViolation:
    with pytest.raises(ProtocolViolation) as info:
        proto.receive_text(text)
    return info.value


def frame_error(proto: WsProtocol, text: str) -> FrameError:
    with pytest.raises(FrameError) as info:
        proto.receive_text(text)
    return info.value


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        "[1, 2]",
        '"op"',
        "{}",
        '{"op": "dance"}',
        '{"op": 3}',
        '{"op": "ping", "id": true}',
        '{"op": "ping", "id": {"a": 1}}',
        '{"op": "ping", "id": "' + "x" * 200 + '"}',
    ],
)
def test_malformed_frames_close_with_4400(proto: WsProtocol, text: str) -> None:
    assert violation(proto, text).close_code is CloseCode.MALFORMED


def test_binary_frames_are_malformed(proto: WsProtocol) -> None:
    with pytest.raises(ProtocolViolation) as info:
        proto.receive_bytes(b"{}")
    assert info.value.close_code is CloseCode.MALFORMED


def test_too_large_frames_close_with_1009(proto: WsProtocol) -> None:
    assert violation(proto, frame(op="ping", pad="x" * 1000)).close_code is CloseCode.MESSAGE_TOO_BIG
    # Counted in bytes: 400 three-byte characters are 1200 bytes.
    assert violation(proto, frame(op="ping", pad="€" * 400)).close_code is CloseCode.MESSAGE_TOO_BIG
    assert isinstance(proto.receive_text(frame(op="ping", pad="x" * 900)), PingRequest)


def test_before_auth_only_auth_and_ping() -> None:
    proto = WsProtocol(PushSettings())
    assert proto.state is State.AWAITING_AUTH
    assert isinstance(proto.receive_text(frame(op="ping")), PingRequest)
    assert proto.receive_text(frame(op="auth", token="t", id=1)) == AuthRequest(1, "t")
    assert violation(proto, frame(op="subscribe", queue="q")).close_code is CloseCode.AUTH_FAILED
    proto.authenticated()
    assert proto.state is State.OPEN
    assert isinstance(proto.receive_text(frame(op="subscribe", queue="q")), SubscribeRequest)
    proto.closed()
    assert violation(proto, frame(op="ping")).close_code is CloseCode.NORMAL


def test_subscribe_defaults_and_bounds(proto: WsProtocol) -> None:
    assert proto.receive_text(frame(op="subscribe", queue="orders", id="s1")) == SubscribeRequest(
        "s1", "orders", 10, False, None, 1
    )
    request = proto.receive_text(
        frame(op="subscribe", queue="q", prefetch=50, ack="auto", visibility_timeout_s=5, batch=20)
    )
    assert request == SubscribeRequest(None, "q", 50, True, 5.0, 20)
    for bad in (
        {"prefetch": 0},
        {"prefetch": 100_000},
        {"prefetch": "3"},
        {"prefetch": True},
        {"ack": "sometimes"},
        {"batch": 101},
        {"visibility_timeout_s": -1},
        {"visibility_timeout_s": 50_000},
        {"queue": "bad name!"},
        {"queue": None},
    ):
        fields = {"op": "subscribe", "queue": "q", "id": 7, **bad}
        error = frame_error(proto, orjson.dumps(fields).decode())
        assert (error.request_id, error.code) == (7, "invalid_request")


def test_ack_nack_unsubscribe(proto: WsProtocol) -> None:
    assert proto.receive_text(frame(op="ack", receipts=["a", "b"])) == AckRequest(None, ["a", "b"])
    assert proto.receive_text(frame(op="nack", receipts=["a"], delay_s=2, id=3)) == NackRequest(3, ["a"], 2.0)
    assert proto.receive_text(frame(op="unsubscribe", queue="q")) == UnsubscribeRequest(None, "q")
    for bad in ({"receipts": []}, {"receipts": "a"}, {"receipts": [1]}, {"receipts": [""]}):
        assert frame_error(proto, frame(op="ack", **bad)).code == "invalid_request"
    assert frame_error(proto, frame(op="nack", receipts=["a"], delay_s=-1)).code == "invalid_request"


def test_send_single_and_batch(proto: WsProtocol) -> None:
    request = proto.receive_text(
        frame(op="send", id=1, queue="q", body="hi", attributes={"k": "v"}, group_id="g")
    )
    assert isinstance(request, SendRequest)
    assert not request.is_batch
    assert request.entries == [NewMessage(body=b"hi", attributes={"k": "v"}, group_id="g")]
    request = proto.receive_text(frame(op="send", queue="q", messages=[{"body": "a"}, {"bogus": 1}]))
    assert isinstance(request, SendRequest) and request.is_batch
    assert request.entries[0] == NewMessage(body=b"a")
    assert isinstance(request.entries[1], InvalidRequest)
    assert frame_error(proto, frame(op="send", queue="q")).code == "invalid_request"
    assert frame_error(proto, frame(op="send", queue="q", body="x", colour="red")).code == "invalid_request"
    assert frame_error(proto, frame(op="send", queue="q", messages=[])).code == "invalid_request"
    assert frame_error(proto, frame(op="send", queue="q", messages=[{"body": "a"}], body="b")).code == (
        "invalid_request"
    )


def test_built_frames_are_the_api_shapes() -> None:
    payload = orjson.dumps({"id": "m1", "body": "hi"})
    assert orjson.loads(message_frame(message_prefix("q"), payload)) == {
        "op": "message",
        "queue": "q",
        "message": {"id": "m1", "body": "hi"},
    }
    assert orjson.loads(messages_frame(messages_prefix("q"), [payload, payload])) == {
        "op": "messages",
        "queue": "q",
        "messages": [{"id": "m1", "body": "hi"}] * 2,
    }
    assert orjson.loads(ok_frame(5, {"acked": 1})) == {"op": "ok", "id": 5, "acked": 1}
    assert orjson.loads(error_frame("x", "forbidden", "no")) == {
        "op": "error",
        "id": "x",
        "code": "forbidden",
        "message": "no",
    }
    assert orjson.loads(pong_frame(None)) == {"op": "pong"}
    assert orjson.loads(pong_frame(9)) == {"op": "pong", "id": 9}


def test_close_codes_say_whether_to_reconnect() -> None:
    assert CloseCode.GOING_AWAY.reconnect and CloseCode.POLICY.reconnect
    assert not CloseCode.AUTH_FAILED.reconnect and not CloseCode.MALFORMED.reconnect
    assert not CloseCode.FORBIDDEN.reconnect and not CloseCode.MESSAGE_TOO_BIG.reconnect
    assert should_reconnect(1006) and should_reconnect(1012) and not should_reconnect(4001)
    assert all(code.description for code in CloseCode)
