"""The pushgate.v1 frame protocol in both directions, fed strings: no sockets."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson
import pytest

from backend_store.errors import InvalidRequest, MessageTooLarge, RateLimited, Unauthorized
from backend_store.types import MessageId, NewMessage, SendResult, TenantId
from push.close_codes import CloseCode, close_code_for, should_reconnect
from push.settings import PushSettings
from push.ws_protocol import (
    AckRequest,
    AuthRequest,
    NackRequest,
    PingRequest,
    SendRequest,
    State,
    SubscribeRequest,
    UnsubscribeRequest,
    WsProtocol,
    delivery_encoder,
)

TENANT = TenantId("t")


@dataclass(frozen=True)
class Caller:
    """A principal with explicit rights: ``send``/``receive`` queue names, or "*"."""

    tenant: TenantId = TENANT
    expires_at: float | None = None
    send: str = "*"
    receive: str = "*"

    def can(self, action: str, queue: str | None = None) -> bool:
        allowed = {"send": self.send, "receive": self.receive}.get(action, "")
        return allowed == "*" or (queue is not None and queue == allowed) or (queue is None and bool(allowed))


def frame(**fields: object) -> str:
    return orjson.dumps(fields).decode()


def sent(proto: WsProtocol) -> list[dict[str, Any]]:
    return [orjson.loads(f) for f in proto.data_to_send()]


@pytest.fixture
def proto() -> WsProtocol:
    p = WsProtocol(PushSettings(max_frame_bytes=1000))
    p.authenticated(Caller())
    return p


def state_of(proto: WsProtocol) -> State:
    """The state read afresh: mypy would keep an earlier ``assert proto.state is ...`` narrowing."""
    return proto.state


def fails_with(proto: WsProtocol, text: str) -> CloseCode:
    assert proto.receive_text(text) is None
    assert proto.state is State.CLOSING and proto.close_code is not None
    return proto.close_code


def answered_with(proto: WsProtocol, text: str) -> dict[str, Any]:
    assert proto.receive_text(text) is None
    assert proto.state is State.OPEN
    [reply] = sent(proto)
    return reply


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
    assert fails_with(proto, text) is CloseCode.MALFORMED


def test_binary_frames_are_malformed(proto: WsProtocol) -> None:
    proto.receive_bytes(b"{}")
    assert (proto.state, proto.close_code) == (State.CLOSING, CloseCode.MALFORMED)


def test_too_large_frames_close_with_1009() -> None:
    def fresh() -> WsProtocol:
        p = WsProtocol(PushSettings(max_frame_bytes=1000))
        p.authenticated(Caller())
        return p

    assert fails_with(fresh(), frame(op="ping", pad="x" * 1000)) is CloseCode.MESSAGE_TOO_BIG
    # Counted in bytes: 400 three-byte characters are 1200 bytes.
    assert fails_with(fresh(), frame(op="ping", pad="€" * 400)) is CloseCode.MESSAGE_TOO_BIG
    assert isinstance(fresh().receive_text(frame(op="ping", pad="x" * 900)), PingRequest)


def test_before_auth_only_auth_and_ping() -> None:
    proto = WsProtocol(PushSettings())
    assert proto.state is State.AWAITING_AUTH
    assert isinstance(proto.receive_text(frame(op="ping")), PingRequest)
    assert proto.receive_text(frame(op="auth", token="t", id=1)) == AuthRequest(1, "t")
    assert proto.authenticated(Caller(), 1)
    assert state_of(proto) is State.OPEN
    assert sent(proto) == [{"op": "ok", "id": 1, "expires_at": None}]
    assert isinstance(proto.receive_text(frame(op="subscribe", queue="q")), SubscribeRequest)
    unauthenticated = WsProtocol(PushSettings())
    assert fails_with(unauthenticated, frame(op="subscribe", queue="q")) is CloseCode.AUTH_FAILED


def test_a_failed_first_auth_closes_a_failed_refresh_is_one_error() -> None:
    proto = WsProtocol(PushSettings())
    proto.authentication_failed(Unauthorized("bad token"), 1)
    assert (proto.state, proto.close_code, proto.close_reason) == (
        State.CLOSING,
        CloseCode.AUTH_FAILED,
        "bad token",
    )
    proto = WsProtocol(PushSettings())
    proto.authenticated(Caller())
    proto.authentication_failed(Unauthorized("expired"), 2)
    assert proto.state is State.OPEN
    assert sent(proto) == [{"op": "error", "id": 2, "code": "unauthorized", "message": "expired"}]


def test_a_refresh_keeps_the_tenant_and_every_subscribed_queue(proto: WsProtocol) -> None:
    assert proto.authenticated(Caller(expires_at=5.0), "r", subscribed=["a"])
    assert sent(proto) == [{"op": "ok", "id": "r", "expires_at": 5.0}]
    assert not proto.authenticated(Caller(receive="b"), "r2", subscribed=["a"])
    assert proto.close_code is CloseCode.FORBIDDEN
    other = WsProtocol(PushSettings())
    other.authenticated(Caller())
    assert not other.authenticated(Caller(tenant=TenantId("u")), "r3")
    assert other.close_code is CloseCode.AUTH_FAILED


def test_scopes_are_checked_before_a_request_reaches_the_engine() -> None:
    proto = WsProtocol(PushSettings())
    proto.authenticated(Caller(send="out", receive="in"))
    assert isinstance(proto.receive_text(frame(op="send", queue="out", body="x")), SendRequest)
    assert isinstance(proto.receive_text(frame(op="subscribe", queue="in")), SubscribeRequest)
    assert fails_with(proto, frame(op="send", queue="in", body="x")) is CloseCode.FORBIDDEN
    proto = WsProtocol(PushSettings())
    proto.authenticated(Caller(send="out", receive=""))
    assert fails_with(proto, frame(op="ack", receipts=["r"])) is CloseCode.FORBIDDEN


def test_subscribe_defaults_and_bounds(proto: WsProtocol) -> None:
    assert proto.receive_text(frame(op="subscribe", queue="orders", id="s1")) == SubscribeRequest(
        "s1", "orders", 10, False, None, 1
    )
    request = proto.receive_text(
        frame(op="subscribe", queue="q", prefetch=50, ack="auto", visibility_timeout_s=5, batch=20)
    )
    assert request == SubscribeRequest(None, "q", 50, True, 5.0, 20)
    bad: Mapping[str, object]
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
        reply = answered_with(proto, frame(**{"op": "subscribe", "queue": "q", "id": 7, **bad}))
        assert (reply["op"], reply["id"], reply["code"]) == ("error", 7, "invalid_request")


def test_ack_nack_unsubscribe(proto: WsProtocol) -> None:
    assert proto.receive_text(frame(op="ack", receipts=["a", "b"])) == AckRequest(None, ["a", "b"])
    assert proto.receive_text(frame(op="nack", receipts=["a"], delay_s=2, id=3)) == NackRequest(3, ["a"], 2.0)
    assert proto.receive_text(frame(op="unsubscribe", queue="q")) == UnsubscribeRequest(None, "q")
    bad: Mapping[str, object]
    for bad in ({"receipts": []}, {"receipts": "a"}, {"receipts": [1]}, {"receipts": [""]}):
        assert answered_with(proto, frame(op="ack", **bad))["code"] == "invalid_request"
    assert answered_with(proto, frame(op="nack", receipts=["a"], delay_s=-1))["code"] == "invalid_request"


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
    for bad in (
        frame(op="send", queue="q"),
        frame(op="send", queue="q", body="x", colour="red"),
        frame(op="send", queue="q", messages=[]),
        frame(op="send", queue="q", messages=[{"body": "a"}], body="b"),
    ):
        assert answered_with(proto, bad)["code"] == "invalid_request"


def test_replies_and_the_close_go_out_in_order(proto: WsProtocol) -> None:
    proto.ok(5, {"acked": 1})
    proto.error("x", RateLimited("slow down", retry_after_s=2.5), queue="q")
    proto.pong(None)
    proto.pong(9)
    assert sent(proto) == [
        {"op": "ok", "id": 5, "acked": 1},
        {
            "op": "error",
            "id": "x",
            "code": "rate_limited",
            "message": "slow down",
            "queue": "q",
            "retry_after_s": 2.5,
        },
        {"op": "pong"},
        {"op": "pong", "id": 9},
    ]
    proto.ok(1)
    proto.fail_with(RateLimited("abuse"))
    # What was queued before the close still goes; nothing after it.
    proto.ok(2)
    assert [f["id"] for f in sent(proto)] == [1]
    assert (proto.close_code, proto.close_reason) == (CloseCode.POLICY, "abuse")
    assert proto.receive_text(frame(op="ping")) is None
    assert sent(proto) == []


def test_delivery_frames_are_the_api_shapes() -> None:
    payload = orjson.dumps({"id": "m1", "body": "hi"})
    [single] = delivery_encoder("q")([payload], 1)
    assert orjson.loads(single) == {"op": "message", "queue": "q", "message": {"id": "m1", "body": "hi"}}
    frames = delivery_encoder("q", batch=2)([payload] * 3, 1)
    assert [orjson.loads(f) for f in frames] == [
        {"op": "messages", "queue": "q", "messages": [{"id": "m1", "body": "hi"}] * 2},
        {"op": "message", "queue": "q", "message": {"id": "m1", "body": "hi"}},
    ]


def test_close_codes_say_whether_to_reconnect() -> None:
    assert CloseCode.GOING_AWAY.reconnect and CloseCode.POLICY.reconnect
    assert not CloseCode.AUTH_FAILED.reconnect and not CloseCode.MALFORMED.reconnect
    assert not CloseCode.FORBIDDEN.reconnect and not CloseCode.MESSAGE_TOO_BIG.reconnect
    assert should_reconnect(1006) and should_reconnect(1012) and not should_reconnect(4001)
    assert all(code.description for code in CloseCode)
    assert close_code_for(Unauthorized()) is CloseCode.AUTH_FAILED
    assert close_code_for(RateLimited()) is CloseCode.POLICY


def test_a_refresh_checks_send_scopes_again() -> None:
    # A queue once found sendable is remembered per connection; new credentials forget it.
    proto = WsProtocol(PushSettings())
    proto.authenticated(Caller())
    assert isinstance(proto.receive_text(frame(op="send", queue="q", body="x")), SendRequest)
    assert isinstance(proto.receive_text(frame(op="send", queue="q", body="y")), SendRequest)
    assert proto.authenticated(Caller(send="other"), "r")
    assert fails_with(proto, frame(op="send", queue="q", body="z")) is CloseCode.FORBIDDEN


def test_a_refresh_checks_the_receive_scope_of_acks_again() -> None:
    # Whether the principal may ack is asked once per connection; new credentials ask again.
    proto = WsProtocol(PushSettings())
    proto.authenticated(Caller())
    assert isinstance(proto.receive_text(frame(op="ack", receipts=["r1"])), AckRequest)
    assert isinstance(proto.receive_text(frame(op="nack", receipts=["r2"])), NackRequest)
    assert proto.authenticated(Caller(receive=""), "r")
    assert fails_with(proto, frame(op="ack", receipts=["r3"])) is CloseCode.FORBIDDEN


def test_a_remembered_queue_still_gets_its_message_checked(proto: WsProtocol) -> None:
    assert isinstance(proto.receive_text(frame(op="send", queue="q", body="x")), SendRequest)
    reply = answered_with(proto, frame(op="send", queue="q", body="x", colour="red", id=2))
    assert (reply["op"], reply["id"], reply["code"]) == ("error", 2, "invalid_request")
    reply = answered_with(proto, frame(op="send", queue="bad name!", body="x", id=3))
    assert (reply["id"], reply["code"]) == (3, "invalid_request")


def test_single_send_replies_are_the_api_shapes_in_order(proto: WsProtocol) -> None:
    proto.sent_many(
        ["a:1", None, 8, 9],
        [
            SendResult(MessageId("m1"), 7, False),
            SendResult(MessageId("m0"), 8, False),
            SendResult(MessageId("m2"), 9, True),
            MessageTooLarge("body is larger than 8 bytes"),
        ],
    )
    assert sent(proto) == [
        {"op": "ok", "id": "a:1", "result": {"id": "m1", "seq": 7, "duplicate": False}},
        {"op": "ok", "id": 8, "result": {"id": "m2", "seq": 9, "duplicate": True}},
        {"op": "error", "id": 9, "code": "message_too_large", "message": "body is larger than 8 bytes"},
    ]
