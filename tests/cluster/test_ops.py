"""Backend operations on the wire, without sockets: every op's arguments and results survive
a trip through real frames, a node's store answers them like a local call, and malformed
arguments are refused with invalid_request."""

from __future__ import annotations

from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import pytest

from backend_store.cluster.protocol import ops
from backend_store.cluster.protocol.wire import ErrorReply, FrameReader, Reply, Request, encode
from backend_store.errors import InvalidRequest, MessageTooLarge, PushgateError, QueueNotFound, Unavailable
from backend_store.lmdb_store.engine import LmdbBackend
from backend_store.options import StoreOptions
from backend_store.types import Epoch, MessageId, NewMessage, QueueName, QueueStats, SendResult, TenantId

T = TenantId("tenant-one")
Q = QueueName("orders")


def over_the_wire(value: Any) -> Any:
    """What the peer gets: the value inside a real frame, encoded and parsed."""
    (reply,) = FrameReader().feed(encode(Reply(1, value)))
    assert isinstance(reply, Reply)
    return reply.result


def request_args(op: str, **kwargs: Any) -> dict[str, Any]:
    (request,) = FrameReader().feed(encode(Request(1, op, 0, Epoch(1), ops.encode_args(op, **kwargs))))
    assert isinstance(request, Request)
    return request.args


@pytest.fixture
async def store(tmp_path: Path) -> Any:
    s = LmdbBackend(tmp_path / "p", StoreOptions(sweep_interval_s=0))
    await s.start()
    yield s
    await s.close()


async def remote(store: LmdbBackend, op: str, **kwargs: Any) -> Any:
    """A call as a node serves it and a client decodes it."""
    encoded = await ops.call(store, op, request_args(op, **kwargs))
    return ops.decode_result(op, over_the_wire(encoded))


async def test_every_operation_round_trips_like_a_local_call(store: LmdbBackend) -> None:
    info, created = await remote(
        store, "create_queue", tenant=T, name=Q, attributes={"visibility_timeout_s": 7}
    )
    assert created and info.name == Q and info.attributes.visibility_timeout_s == 7
    again, created = await remote(
        store, "create_queue", tenant=T, name=Q, attributes={"visibility_timeout_s": 7}
    )
    assert not created and again.created_at == info.created_at

    messages = [
        NewMessage(b"\x00\xffbinary", is_text=False, attributes={"k": "v"}),
        NewMessage(b"hello", dedupe_id="d-1", delay_s=0.0),
        NewMessage(b"x" * 300_000),  # too large: a per-entry error, in order
        NewMessage(b"hello again", dedupe_id="d-1"),
    ]
    results = await remote(store, "send", tenant=T, queue=Q, messages=messages)
    assert [type(r) for r in results] == [SendResult, SendResult, MessageTooLarge, SendResult]
    assert results[3].duplicate and results[3].id == results[1].id

    peeked = await remote(store, "peek", tenant=T, queue=Q, max_messages=10)
    assert [p.body for p in peeked] == [b"\x00\xffbinary", b"hello"]
    assert peeked[0].attributes == {"k": "v"} and not peeked[0].is_text

    got = await remote(store, "receive", tenant=T, queue=Q, max_messages=10, visibility_timeout_s=30)
    assert [m.body for m in got] == [b"\x00\xffbinary", b"hello"]
    assert got[0].receive_count == 1 and got[0].queue == Q
    # In flight for 30 s: they are the earliest to become visible again.
    assert await remote(store, "next_visible_at", tenant=T, queue=Q) == got[0].visible_at

    await remote(store, "change_visibility", tenant=T, queue=Q, receipt=got[0].receipt, timeout_s=60)
    acked = await remote(store, "ack", tenant=T, receipts=[got[0].receipt, "bogus"], queue=Q)
    assert acked.acked == 1 and [f.receipt for f in acked.failed] == ["bogus"]
    nacked = await remote(store, "nack", tenant=T, receipts=[got[1].receipt], delay_s=0, queue=None)
    assert nacked.acked == 1

    updated = await remote(store, "update_queue", tenant=T, name=Q, changes={"visibility_timeout_s": 5})
    assert updated.attributes.visibility_timeout_s == 5
    fetched = await remote(store, "get_queue", tenant=T, name=Q)
    assert fetched.stats.visible == 1 and fetched.stats.sent_total == 2

    await remote(store, "create_queue", tenant=T, name=QueueName("other"), attributes={})
    assert await remote(store, "redrive", tenant=T, queue=Q, to=QueueName("other"), max_messages=10) == 1
    assert await remote(store, "purge_queue", tenant=T, name=QueueName("other")) == 1
    assert await remote(store, "delete_queue", tenant=T, name=Q) is None
    with pytest.raises(QueueNotFound):
        await remote(store, "get_queue", tenant=T, name=Q)


@pytest.mark.parametrize(
    ("op", "args"),
    [
        ("no_such_op", {}),
        ("send", {"tenant": "t", "queue": "q"}),  # no messages
        ("send", {"tenant": "t", "queue": "q", "messages": [[b"body"]]}),
        ("send", {"tenant": "t", "queue": "q", "messages": [["str body", True, {}, None, None, None]]}),
        ("send", {"tenant": "t", "queue": "q", "messages": [[b"b", True, {"k": 1}, None, None, None]]}),
        ("send", {"tenant": 7, "queue": "q", "messages": []}),
        ("receive", {"tenant": "t", "queue": "q", "max_messages": "10"}),
        ("receive", {"tenant": "t", "queue": "q", "max_messages": True}),
        ("ack", {"tenant": "t", "receipts": "r"}),
        ("ack", {"tenant": "t", "receipts": [1]}),
        ("change_visibility", {"tenant": "t", "queue": "q", "receipt": "r"}),
        ("create_queue", {"tenant": "t", "name": "q", "attributes": [1]}),
        ("send_queues", {"tenant": "t"}),  # no sends
        ("send_queues", {"tenant": "t", "sends": [["q"]]}),
        ("send_queues", {"tenant": "t", "sends": [[7, []]]}),
        ("send_queues", {"tenant": "t", "sends": [["q", "not a list"]]}),
        ("send_queues", {"tenant": "t", "sends": [["q", [[b"body"]]]]}),
    ],
)
def test_malformed_arguments_are_invalid_requests(op: str, args: dict[str, Any]) -> None:
    with pytest.raises(InvalidRequest):
        ops.decode_args(op, args)


def test_a_malformed_result_is_unavailable_not_a_half_built_record() -> None:
    with pytest.raises(Unavailable):
        ops.decode_result("receive", [["too", "short"]])


def test_error_replies_become_errors_with_the_leader_hint() -> None:
    (reply,) = FrameReader().feed(encode(ErrorReply(1, "not_leader", "ask b", Epoch(9), "127.0.0.1:7002")))
    assert isinstance(reply, ErrorReply)
    error = ops.error_from_reply(reply.code, reply.detail, reply.epoch, reply.leader)
    assert isinstance(error, ops.NotLeader) and isinstance(error, Unavailable)
    assert (error.epoch, error.leader, error.code) == (9, "127.0.0.1:7002", "not_leader")
    stale = ops.error_from_reply("stale_epoch", "old", Epoch(10), "b:1")
    assert isinstance(stale, ops.StaleLeader) and stale.code == "stale_epoch" and stale.epoch == 10
    assert isinstance(ops.error_from_reply("queue_not_found", "no", Epoch(0), None), QueueNotFound)


def test_write_operations_are_marked_for_replication() -> None:
    reads = {name for name, op in ops.OPS.items() if not op.writes}
    assert reads == {"get_queue", "next_visible_at", "peek", "queue_stats"}


async def test_queue_stats_answers_a_page_of_queues_in_one_request(store: LmdbBackend) -> None:
    for name in ("a", "b", "c"):
        await store.create_queue(T, QueueName(name), {})
    await store.create_queue(TenantId("someone-else"), QueueName("a"), {})
    await store.send(T, QueueName("b"), [NewMessage(b"1"), NewMessage(b"2")])
    await store.receive(T, QueueName("b"), 1)
    stats = await remote(store, "queue_stats", tenant=T, names=["a", "b", "missing"])
    # Each queue the store holds, as get_queue counts it; one it does not hold is left out.
    assert set(stats) == {"a", "b"}
    one = (await store.get_queue(T, QueueName("b"))).stats
    assert replace(stats["b"], oldest_age_s=None) == replace(one, oldest_age_s=None)  # the clock moved
    assert (stats["b"].visible, stats["b"].in_flight, stats["b"].sent_total, stats["a"].visible) == (
        1,
        1,
        2,
        0,
    )
    assert stats["b"].oldest_age_s is not None and stats["a"].oldest_age_s is None
    with pytest.raises(InvalidRequest):
        await ops.call(store, "queue_stats", {"tenant": T, "names": ["a", 3]})


def test_queue_stats_cross_the_wire_with_every_count() -> None:
    # ``QueueStats.to_dict`` names its fields one by one: a count it left out would arrive as 0.
    counts = {f.name: i + 1 for i, f in enumerate(fields(QueueStats))}
    sent = {QueueName("q"): QueueStats(**counts)}

    assert ops.decode_result("queue_stats", ops.encode_result("queue_stats", sent)) == sent


async def test_send_queues_sends_to_each_queue_and_refuses_a_missing_one_alone(store: LmdbBackend) -> None:
    for name in ("a", "b"):
        await store.create_queue(T, QueueName(name), {})
    results = await remote(
        store,
        "send_queues",
        tenant=T,
        sends=[
            (QueueName("a"), [NewMessage(b"a1"), NewMessage(b"x" * 2_000_000)]),
            (QueueName("gone"), [NewMessage(b"g1")]),
            (QueueName("b"), [NewMessage(b"b1", dedupe_id="d")]),
            (QueueName("b"), [NewMessage(b"b1 again", dedupe_id="d")]),
        ],
    )
    a, gone, b, again = results
    assert isinstance(a[0], SendResult) and isinstance(a[1], MessageTooLarge)  # per message, as send
    assert isinstance(gone, QueueNotFound)
    assert isinstance(b[0], SendResult) and not b[0].duplicate
    assert isinstance(again[0], SendResult) and again[0].duplicate and again[0].id == b[0].id
    assert [m.body for m in await store.peek(T, QueueName("a"), 10)] == [b"a1"]
    assert [m.body for m in await store.peek(T, QueueName("b"), 10)] == [b"b1"]


def test_entries_refused_before_the_store_are_put_back_in_their_places() -> None:
    served = ops.encode_result(
        "send_queues", [[SendResult(MessageId("a"), 1)], [SendResult(MessageId("c"), 2)]]
    )
    merged = ops.decode_result(
        "send_queues", over_the_wire(ops.with_refused(served, {1: "b not applied yet"}))
    )
    a, b, c = merged
    assert isinstance(b, PushgateError) and b.code == "not_leader" and b.detail == "b not applied yet"
    assert [r.id for r in a + c] == ["a", "c"]
    assert ops.with_refused([], {0: "x", 1: "y"}) == [
        {"code": "not_leader", "detail": "x"},
        {"code": "not_leader", "detail": "y"},
    ]
