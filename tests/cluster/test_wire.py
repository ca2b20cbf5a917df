"""The node protocol without sockets: frames split anywhere, oversized and garbage frames,
and the connection's rules (handshake, request ids, closing)."""

from __future__ import annotations

import struct

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backend_store.cluster.protocol.connection import Closed, Connection, ConnectionClosedError, State
from backend_store.cluster.protocol.wire import (
    HEADER,
    PROTOCOL_VERSION,
    Close,
    CloseCode,
    Delivery,
    Demand,
    ErrorReply,
    Events,
    FrameReader,
    Hello,
    Kind,
    Message,
    Notify,
    Replicate,
    Replicated,
    Reply,
    Request,
    SnapshotChunk,
    WireError,
    Withdraw,
    encode,
)
from backend_store.types import Epoch, LogEntry, Lsn

EVERY_MESSAGE: list[Message] = [
    Hello("node-a"),
    Hello("node-a", partition=3),
    Request(7, "send", 3, Epoch(12), {"queue": "orders", "bodies": [b"\x00\xff", "text"]}),
    Reply(7, {"results": [[1, "id-1", False]]}),
    Reply(8, None),
    ErrorReply(9, "not_leader", "partition 3 is led by node-b", Epoch(13), "node-b:7001"),
    ErrorReply(10, "queue_not_found"),
    Replicate(
        3, Epoch(12), (LogEntry(Lsn(41), Epoch(12), b"r1"), LogEntry(Lsn(42), Epoch(12), b"")), Lsn(40)
    ),
    Replicate(3, Epoch(12), (), Lsn(42)),
    Replicated(3, Epoch(12), Lsn(42)),
    Replicated(3, Epoch(13), Lsn(40), "stale_epoch"),
    Close(CloseCode.NORMAL, "draining"),
    SnapshotChunk(3, Epoch(12), 1 << 20, b"\x00" * 64),
    SnapshotChunk(3, Epoch(12), 2 << 20, b"", done=True),
    Notify(3, "tenant-one", "orders"),
    Demand(5, 3, Epoch(12), "tenant-one", "orders", 10, 30.0),
    Demand(6, 3, Epoch(0), "tenant-one", "orders", 1, None),
    Withdraw(5, 3),
    Delivery(
        5, 3, "tenant-one", "orders", (["orders", "id-1", 4, "r1", b"\x00", False, {}, None, 1.5, 1, 31.5],)
    ),
    Delivery(6, 3, "tenant-one", "orders", ()),
    Events(3, (("tenant-one", "orders", "dead_lettered", 2), ("tenant-one", "orders", "expired", 1))),
]


def frame(value: object) -> bytes:
    body: bytes = msgpack.packb(value, use_bin_type=True)
    return HEADER.pack(len(body)) + body


def opened(node_id: str = "me") -> Connection:
    """A connection past the handshake, with its own hello already taken out."""
    conn = Connection(node_id)
    conn.receive_data(encode(Hello("peer")))
    assert conn.state is State.OPEN
    assert conn.events_received() == [Hello("peer")]
    conn.data_to_send()
    return conn


def closed_event(conn: Connection) -> Closed:
    events = conn.events_received()
    assert events and isinstance(events[-1], Closed), events
    return events[-1]


def sent(conn: Connection) -> list[Message]:
    return FrameReader().feed(conn.data_to_send())


# ---------------------------------------------------------------------------
# Frames
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("message", EVERY_MESSAGE, ids=lambda m: type(m).__name__)
def test_every_message_survives_a_round_trip(message: Message) -> None:
    assert FrameReader().feed(encode(message)) == [message]


def test_frames_split_at_every_byte_come_out_whole_and_in_order() -> None:
    stream = b"".join(encode(m) for m in EVERY_MESSAGE)
    reader = FrameReader()
    out: list[Message] = []
    for i in range(len(stream)):
        out += reader.feed(stream[i : i + 1])
    assert out == EVERY_MESSAGE
    assert reader.buffered == 0


def test_a_partial_header_or_body_waits_for_more() -> None:
    data = encode(Reply(1, "x" * 100))
    reader = FrameReader()
    assert reader.feed(data[:3]) == []
    assert reader.feed(data[3:50]) == []
    assert reader.feed(data[50:]) == [Reply(1, "x" * 100)]


def test_an_oversized_frame_is_refused_from_its_header_alone() -> None:
    reader = FrameReader(max_frame=1024)
    assert reader.feed(encode(Reply(1, b"x" * 1000))) != []
    with pytest.raises(WireError) as caught:
        # Only the header of a 2 GiB frame: refused before a byte of the body is buffered.
        reader.feed(HEADER.pack(2**31))
    assert caught.value.code is CloseCode.FRAME_TOO_LARGE


@pytest.mark.parametrize(
    "body",
    [
        b"\xc1",  # never used in msgpack
        msgpack.packb({"kind": 1}),  # not an array
        msgpack.packb([]),
        msgpack.packb([99, "x"]),  # unknown kind
        msgpack.packb([True, "node", 1]),  # a bool is not a kind
        msgpack.packb([Kind.HELLO, "node", 1]),  # too few fields
        msgpack.packb([Kind.HELLO, "node", 1, None, 2]),  # too many
        msgpack.packb([Kind.HELLO, b"bytes-not-str", 1, None]),
        msgpack.packb([Kind.HELLO, "node", 1, "partition-not-int"]),
        msgpack.packb([Kind.REQUEST, -1, "send", 0, 0, {}]),  # negative id
        msgpack.packb([Kind.REQUEST, 1, "send", 0, 0, []]),  # args not a map
        msgpack.packb([Kind.REQUEST, 1, "send", 0, 0, {1: "int key"}]),
        msgpack.packb([Kind.REPLICATE, 0, 1, [[0, 1, b"r"]], 0, 0, 0]),  # LSN 0
        msgpack.packb([Kind.REPLICATE, 0, 1, [[1, 1, "str record"]], 0, 0, 0]),
        msgpack.packb([Kind.REPLICATE, 0, 1, "entries", 0, 0, 0]),
        msgpack.packb([Kind.REPLICATE, 0, 1, [], 0]),  # no prev
        msgpack.packb([Kind.SNAPSHOT, 0, 1, 0, "text", False]),
        msgpack.packb([Kind.CLOSE, "no_such_code", ""]),
        msgpack.packb([Kind.NOTIFY, 0, "tenant"]),  # no queue
        msgpack.packb([Kind.NOTIFY, -1, "tenant", "queue"]),
        msgpack.packb([Kind.DEMAND, 1, 0, 1, "t", "q", 10]),  # no visibility timeout
        msgpack.packb([Kind.DEMAND, 1, 0, 1, "t", "q", 0, None]),  # a demand of nothing
        msgpack.packb([Kind.DEMAND, 1, 0, 1, "t", "q", 10, "30"]),
        msgpack.packb([Kind.DEMAND, 1, 0, 1, "t", "q", 10, True]),
        msgpack.packb([Kind.WITHDRAW, 1]),
        msgpack.packb([Kind.DELIVERY, 1, 0, "t", "q", "messages"]),
        msgpack.packb([Kind.DELIVERY, 1, 0, "t", "q", [b"not a record"]]),
        msgpack.packb([Kind.EVENTS, 0, [["t", "q", "expired"]]]),  # no count
        msgpack.packb([Kind.EVENTS, 0, [["t", "q", "expired", 0]]]),  # nothing happened
        msgpack.packb([Kind.EVENTS, 0, "events"]),
        msgpack.packb([Kind.HELLO, "node", 1, None]) + b"trailing",
    ],
)
def test_malformed_frames_are_refused_with_a_code(body: bytes) -> None:
    with pytest.raises(WireError) as caught:
        FrameReader().feed(struct.pack(">I", len(body)) + body)
    assert caught.value.code is CloseCode.MALFORMED_FRAME


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_garbage_never_escapes_as_anything_but_a_close(data: bytes) -> None:
    conn = opened()
    conn.receive_data(data)
    for event in conn.events_received():
        assert isinstance(event, Message | Closed)
    if conn.closed:
        assert conn.close_code is not None


# ---------------------------------------------------------------------------
# The connection
# ---------------------------------------------------------------------------


def test_both_sides_say_hello_first_and_open_on_the_peers_hello() -> None:
    client, server = Connection("gateway-1"), Connection("node-a")
    assert client.state is server.state is State.HANDSHAKE
    # Requests may go before the peer's hello has arrived.
    rid = client.request("get_queue", 0, Epoch(5), {"name": "orders"})
    server.receive_data(client.data_to_send())
    client.receive_data(server.data_to_send())
    assert client.peer == Hello("node-a") and server.peer == Hello("gateway-1")
    assert {client.state, server.state} == {State.OPEN}

    [hello, request] = server.events_received()
    assert hello == Hello("gateway-1")
    assert request == Request(rid, "get_queue", 0, Epoch(5), {"name": "orders"})
    server.reply(rid, {"name": "orders"})
    client.events_received()
    client.receive_data(server.data_to_send())
    assert client.events_received() == [Reply(rid, {"name": "orders"})]
    assert client.pending_requests == frozenset()


def test_request_ids_count_up_and_answers_may_come_in_any_order() -> None:
    client = opened()
    ids = [client.request("receive", 1, Epoch(2)) for _ in range(3)]
    assert ids == [1, 2, 3]
    client.receive_data(encode(ErrorReply(3, "not_leader", "", Epoch(4), "node-b")) + encode(Reply(1, [])))
    assert client.events_received() == [ErrorReply(3, "not_leader", "", Epoch(4), "node-b"), Reply(1, [])]
    assert client.pending_requests == {2}


def test_the_first_frame_must_be_a_hello() -> None:
    conn = Connection("me")
    conn.data_to_send()
    conn.receive_data(encode(Request(1, "send", 0, Epoch(1))))
    event = closed_event(conn)
    assert event.code is CloseCode.UNEXPECTED_FRAME and not event.by_peer
    assert sent(conn) == [Close(CloseCode.UNEXPECTED_FRAME, "the first frame must be a hello")]


def test_another_protocol_version_is_refused() -> None:
    conn = Connection("me")
    conn.data_to_send()
    conn.receive_data(encode(Hello("future", PROTOCOL_VERSION + 1)))
    assert closed_event(conn).code is CloseCode.PROTOCOL_VERSION
    assert conn.peer is None


def test_a_second_hello_closes() -> None:
    conn = opened()
    conn.receive_data(encode(Hello("again")))
    assert closed_event(conn).code is CloseCode.UNEXPECTED_FRAME


def test_a_reply_to_no_pending_request_closes_and_fails_the_pending_ones() -> None:
    conn = opened()
    waiting = conn.request("send", 0, Epoch(1))
    conn.receive_data(encode(Reply(waiting + 100, None)))
    event = closed_event(conn)
    assert event.code is CloseCode.UNKNOWN_REQUEST
    assert event.pending == (waiting,)


def test_a_request_id_reused_while_pending_closes() -> None:
    conn = opened()
    conn.receive_data(encode(Request(5, "send", 0, Epoch(1))))
    conn.receive_data(encode(Request(5, "ack", 0, Epoch(1))))
    events = conn.events_received()
    assert isinstance(events[0], Request)
    assert isinstance(events[1], Closed) and events[1].code is CloseCode.DUPLICATE_REQUEST


def test_an_answered_id_may_be_reused_and_we_cannot_answer_twice() -> None:
    conn = opened()
    conn.receive_data(encode(Request(5, "send", 0, Epoch(1))))
    conn.reply(5, "ok")
    with pytest.raises(ValueError):
        conn.reply(5, "again")
    with pytest.raises(ValueError):
        conn.error(6, "unavailable")
    conn.receive_data(encode(Request(5, "send", 0, Epoch(1))))
    assert [type(e) for e in conn.events_received()] == [Request, Request]


def test_replication_frames_flow_both_ways() -> None:
    leader, follower = opened("leader"), opened("follower")
    entries = [LogEntry(Lsn(1), Epoch(3), b"a"), LogEntry(Lsn(2), Epoch(3), b"b")]
    leader.replicate(0, Epoch(3), entries, Lsn(0), (Lsn(0), Epoch(0)))
    follower.receive_data(leader.data_to_send())
    assert follower.events_received() == [Replicate(0, Epoch(3), tuple(entries), Lsn(0))]
    follower.replicated(0, Epoch(3), Lsn(2))
    follower.replicated(0, Epoch(4), Lsn(2), "stale_epoch")
    leader.receive_data(follower.data_to_send())
    assert leader.events_received() == [
        Replicated(0, Epoch(3), Lsn(2)),
        Replicated(0, Epoch(4), Lsn(2), "stale_epoch"),
    ]


def test_a_close_from_the_peer_ends_the_connection() -> None:
    conn = opened()
    rid = conn.request("send", 0, Epoch(1))
    conn.receive_data(encode(Close(CloseCode.NORMAL, "draining")) + encode(Reply(rid, None)))
    event = closed_event(conn)
    assert (event.code, event.detail, event.by_peer, event.pending) == (
        CloseCode.NORMAL,
        "draining",
        True,
        (rid,),
    )
    # Nothing after the close is read, and nothing more can be sent.
    conn.receive_data(encode(Reply(rid, None)))
    assert conn.events_received() == []
    with pytest.raises(ConnectionClosedError):
        conn.request("send", 0, Epoch(1))


def test_eof_without_a_close_is_connection_lost() -> None:
    conn = opened()
    rid = conn.request("send", 0, Epoch(1))
    conn.receive_eof()
    event = closed_event(conn)
    assert (event.code, event.by_peer, event.pending) == (CloseCode.CONNECTION_LOST, True, (rid,))
    conn.receive_eof()
    assert conn.events_received() == []


def test_closing_sends_a_close_once() -> None:
    conn = opened()
    conn.close(CloseCode.NORMAL, "bye")
    conn.close()
    assert sent(conn) == [Close(CloseCode.NORMAL, "bye")]
    assert closed_event(conn).by_peer is False


def test_an_oversized_frame_closes_the_connection_with_its_code() -> None:
    conn = Connection("me", max_frame=64)
    conn.receive_data(encode(Hello("peer")))
    conn.data_to_send()
    conn.receive_data(encode(Reply(1, b"x" * 100)))
    assert closed_event(conn).code is CloseCode.FRAME_TOO_LARGE
    [close] = sent(conn)
    assert isinstance(close, Close) and close.code is CloseCode.FRAME_TOO_LARGE


def test_standing_receive_frames_pass_both_ways_unanswered() -> None:
    gateway, node = opened("gateway-1"), opened("node-a")
    gateway.demand(Demand(1, 3, Epoch(12), "t", "orders", 10, None))
    gateway.withdraw(1, 3)
    node.receive_data(gateway.data_to_send())
    assert node.events_received() == [Demand(1, 3, Epoch(12), "t", "orders", 10, None), Withdraw(1, 3)]
    record = ["orders", "id-1", 4, "r1", b"x", False, {}, None, 1.5, 1, 31.5]
    node.deliver(1, 3, "t", "orders", [record])
    gateway.receive_data(node.data_to_send())
    assert gateway.events_received() == [Delivery(1, 3, "t", "orders", (record,))]
    # One-way: nothing is pending on either side, nothing needs an answer.
    assert gateway.pending_requests == node.pending_requests == frozenset()
    assert not gateway.closed and not node.closed


def test_a_peer_of_the_version_before_standing_receives_is_refused_at_the_hello() -> None:
    conn = Connection("me")
    conn.receive_data(encode(Hello("old-node", 1)))
    assert closed_event(conn).code is CloseCode.PROTOCOL_VERSION
