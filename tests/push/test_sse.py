"""SSE push: framing, headers, pings, credits with HTTP acks, auto-ack, Last-Event-ID."""

from __future__ import annotations

import orjson
import pytest

from backend_store.types import QueueName, TenantId
from tests.gateway.conftest import RunningGateway

from .conftest import TEST_SETTINGS, Http, engine_of, poll, sse_stream


async def test_stream_framing_and_headers(gateway: RunningGateway, http: Http, qname: str) -> None:
    await http.queue(qname)
    await http.send_many(qname, ["a", "b", "c"])
    async with sse_stream(gateway, qname, gateway.admin_key) as sse:
        response = sse.response
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["x-accel-buffering"] == "no"
        assert response.headers["cache-control"] == "no-cache"
        got = await sse.messages(3)
        stream = got[0]["sse_id"].rsplit(".", 1)[0]
        assert [m["sse_id"] for m in got] == [f"{stream}.1", f"{stream}.2", f"{stream}.3"]
        assert [m["body"] for m in got] == ["a", "b", "c"]
        assert set(got[0]) >= {"id", "seq", "receipt", "body", "attributes", "sent_at", "receive_count"}
        # Idle: pings arrive (every 0.3 s in these tests; at most 15 s by default).
        await sse.nothing_more(0.8)
        assert "ping" in sse.comments
        assert len(sse.retry) == 1


async def test_manual_ack_credit_over_http(gateway: RunningGateway, http: Http, qname: str) -> None:
    await http.queue(qname)
    await http.send_many(qname, [f"m{i}" for i in range(5)])
    async with sse_stream(gateway, qname, gateway.admin_key, prefetch=2) as sse:
        first = await sse.messages(2)
        await sse.nothing_more()
        assert (await http.ack(qname, [first[0]["receipt"]]))["acked"] == 1
        (third,) = await sse.messages(1)
        await sse.nothing_more()
        assert third["body"] == "m2"


async def test_auto_ack_deletes_on_write(gateway: RunningGateway, http: Http, qname: str) -> None:
    await http.queue(qname)
    await http.send_many(qname, [f"m{i}" for i in range(20)])
    async with sse_stream(gateway, qname, gateway.admin_key, prefetch=3, ack="auto") as sse:
        got = await sse.messages(20)
    assert [m["body"] for m in got] == [f"m{i}" for i in range(20)]

    async def empty() -> bool:
        stats = await http.stats(qname)
        return bool(stats["visible"] == 0 and stats["in_flight"] == 0)

    await poll(empty, what="auto-acked messages to be deleted")


async def test_last_event_id_releases_what_came_after(
    gateway: RunningGateway, http: Http, qname: str
) -> None:
    await http.queue(qname, visibility_timeout_s=600)
    await http.send_many(qname, [f"m{i}" for i in range(5)])
    async with sse_stream(gateway, qname, gateway.admin_key, prefetch=5) as sse:
        first = await sse.messages(5)
    # The client processed two; it says so with Last-Event-ID when it comes back.
    last = first[1]["sse_id"]
    async with sse_stream(gateway, qname, gateway.admin_key, {"Last-Event-ID": last}, prefetch=5) as sse:
        again = await sse.messages(3)
        assert [m["body"] for m in again] == ["m2", "m3", "m4"]
        assert all(m["receive_count"] == 2 for m in again)
        assert not again[0]["sse_id"].startswith(last.rsplit(".", 1)[0])
        # The two it kept are still its own: their receipts still ack.
        assert (await http.ack(qname, [m["receipt"] for m in first[:2]]))["acked"] == 2
        # ... and the prefetch counted them: with them acked, nothing else is pending.
        await sse.nothing_more()


async def test_disconnect_without_resume_releases_after_grace(
    gateway: RunningGateway, http: Http, qname: str
) -> None:
    await http.queue(qname, visibility_timeout_s=600)
    await http.send(qname, "x")
    async with sse_stream(gateway, qname, gateway.admin_key) as sse:
        (first,) = await sse.messages(1)
    async with sse_stream(gateway, qname, gateway.admin_key) as sse:
        (again,) = await sse.messages(1, timeout=TEST_SETTINGS.sse_resume_grace_s + 5)
    assert (again["id"], again["receive_count"]) == (first["id"], 2)


async def test_errors_are_problem_documents(gateway: RunningGateway, http: Http, qname: str) -> None:
    await http.queue(qname)
    cases = [
        (None, qname, {}, 401, "unauthorized"),
        ("pg_bad.bad", qname, {}, 401, "unauthorized"),
        (gateway.make_key(f"send:{qname}"), qname, {}, 403, "forbidden"),
        (gateway.admin_key, "no-such-queue", {}, 404, "queue_not_found"),
        (gateway.admin_key, qname, {"prefetch": "0"}, 400, "invalid_request"),
        (gateway.admin_key, qname, {"ack": "never"}, 400, "invalid_request"),
    ]
    for token, queue, params, status, code in cases:
        async with sse_stream(gateway, queue, token, None, **params) as sse:
            assert sse.response.status_code == status
            await sse.response.aread()
            doc = orjson.loads(sse.response.content)
            assert doc["code"] == code and doc["status"] == status
            if status == 401:
                assert sse.response.headers["www-authenticate"] == "Bearer"


async def test_access_token_query_and_consumer_count(gateway: RunningGateway, http: Http, qname: str) -> None:
    await http.queue(qname)
    async with sse_stream(gateway, qname, None, access_token=gateway.admin_key) as sse:
        assert sse.response.status_code == 200
        assert (await http.stats(qname))["consumers"] == 1
        await http.send(qname, "x")
        (message,) = await sse.messages(1)
        assert message["body"] == "x"

    # The stream is gone once the gateway notices its client hung up.
    async def no_consumers() -> bool:
        return engine_of(gateway).consumers(TenantId("default"), QueueName(qname)) == 0

    await poll(no_consumers, what="the closed stream to be forgotten")


async def test_token_expiry_ends_the_stream_and_releases(
    gateway: RunningGateway, http: Http, qname: str
) -> None:
    await http.queue(qname, visibility_timeout_s=600)
    await http.send(qname, "x")
    token = await http.token(ttl_s=4)  # JWT exp has whole seconds: it lives 3-4 s
    async with sse_stream(gateway, qname, token) as sse:
        (first,) = await sse.messages(1)
        closing = await sse.next(timeout=10)
        assert closing["event"] == "close"
        assert orjson.loads(closing["data"]) == {"code": 4001, "reason": "token expired", "reconnect": False}
    async with sse_stream(gateway, qname, gateway.admin_key) as sse:
        (again,) = await sse.messages(1)
    assert (again["id"], again["receive_count"]) == (first["id"], 2)


async def test_queue_deleted_under_a_stream(gateway: RunningGateway, http: Http, qname: str) -> None:
    await http.queue(qname)
    async with sse_stream(gateway, qname, gateway.admin_key) as sse:
        assert (await http.client.delete(f"/v1/queues/{qname}")).status_code == 204
        await http.client.post("/v1/queues/" + qname + "/messages", json={"body": "x"})
        # The dispatcher notices at its next look (a wake-up or the safety poll).
        closing = await sse.next(timeout=5)
        assert closing["event"] == "close"
        assert "queue_not_found" in orjson.loads(closing["data"])["reason"]


async def test_resume_while_the_old_stream_is_still_open(
    gateway: RunningGateway, http: Http, qname: str
) -> None:
    await http.queue(qname, visibility_timeout_s=600)
    await http.send_many(qname, ["a", "b", "c"])
    async with sse_stream(gateway, qname, gateway.admin_key, prefetch=3) as old:
        first = await old.messages(3)
        # A half-open old connection: the client reconnects before the server saw it go.
        headers = {"Last-Event-ID": first[0]["sse_id"]}
        async with sse_stream(gateway, qname, gateway.admin_key, headers, prefetch=3) as new:
            again = await new.messages(2)  # a release and a receive: two fsyncs, slow on a busy disk
            assert [m["body"] for m in again] == ["b", "c"]
            closing = await old.next()
            assert (closing["event"], orjson.loads(closing["data"])["reason"]) == (
                "close",
                "resumed elsewhere",
            )


async def test_head_answers_headers_without_a_stream(gateway: RunningGateway, http: Http, qname: str) -> None:
    await http.queue(qname)
    headers = {"Authorization": f"Bearer {gateway.admin_key}"}
    response = await http.client.head(f"/v1/queues/{qname}/events", headers=headers)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.headers["x-accel-buffering"] == "no"
    assert (await http.stats(qname))["consumers"] == 0
    assert (await http.client.head("/v1/queues/no-such-queue/events")).status_code == 404


async def test_a_stream_that_stops_acking_reads_a_4008_close_event(
    gateway: RunningGateway, http: Http, qname: str
) -> None:
    # docs/push.md, "Slow consumers": a subscription whose oldest message timed out
    # stall_grace_s ago with no ack or nack since it was sent is closed with 4008; an SSE
    # stream learns it from a last `close` event (reconnect: yes), which it reads.
    await http.queue(qname, visibility_timeout_s=1)
    await http.send(qname, "unacked")
    # prefetch 1: the stalled stream gets no credit back for the timed-out message, so the
    # next event is the close (with more credit, the redelivery would come first).
    async with sse_stream(gateway, qname, gateway.admin_key, prefetch=1) as sse:
        (message,) = await sse.messages(1)
        closing = await sse.next(timeout=1 + 1 + 10)  # visibility, stall grace, room
        assert closing["event"] == "close"
        data = orjson.loads(closing["data"])
        assert (data["code"], data["reconnect"]) == (4008, True)
        assert isinstance(data["reason"], str) and data["reason"]
        with pytest.raises(EOFError):
            await sse.next()
    # Its message is free for the next consumer.
    (again,) = (await http.client.post(f"/v1/queues/{qname}/receive", json={"wait_s": 5})).json()["messages"]
    assert (again["id"], again["receive_count"]) == (message["id"], 2)
