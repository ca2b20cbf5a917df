"""WebSocket delivery: credits, batches, acks, nacks, redelivery and FIFO, on a real gateway."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from backend_store.tested_versions import ReleaseCheck
from tests.conftest import scaled, wait_for
from tests.fixtures.dev_cluster import StoreTarget
from tests.gateway.conftest import RunningGateway

from .conftest import (
    Http,
    deliveries,
    engine_of,
    nothing_more,
    poll,
    recv_frame,
    request,
    send_frame,
    start_push_gateway,
    ws_connect,
)

# Each test on the WebSocket fast path and on the public doors (tests/push/conftest.py).
pytestmark = pytest.mark.websocket_doors


async def subscribe(ws: Any, queue: str, **options: Any) -> None:
    reply = await request(ws, op="subscribe", queue=queue, id="sub", **options)
    assert reply == {"op": "ok", "id": "sub", "queue": queue}


async def test_message_frame_shape_and_ack(gateway: RunningGateway, http: Http, qname: str) -> None:
    await http.queue(qname)
    async with ws_connect(gateway, gateway.admin_key) as ws:
        await subscribe(ws, qname)
        sent = await http.send(qname, "hello", attributes={"k": "v"})
        frame = await recv_frame(ws)
        assert (frame["op"], frame["queue"]) == ("message", qname)
        message = frame["message"]
        assert set(message) == {
            "id",
            "seq",
            "receipt",
            "body",
            "attributes",
            "group_id",
            "sent_at",
            "receive_count",
        }
        assert (message["id"], message["body"], message["attributes"]) == (sent["id"], "hello", {"k": "v"})
        assert message["receive_count"] == 1
        reply = await request(ws, op="ack", receipts=[message["receipt"], "bogus"], id=1)
        assert reply["acked"] == 1 and [f["receipt"] for f in reply["failed"]] == ["bogus"]
    stats = await http.stats(qname)
    assert (stats["visible"], stats["in_flight"]) == (0, 0)


async def test_consumers_count_in_queue_stats(gateway: RunningGateway, http: Http, qname: str) -> None:
    await http.queue(qname)
    async with ws_connect(gateway, gateway.admin_key) as a, ws_connect(gateway, gateway.admin_key) as b:
        await subscribe(a, qname)
        await subscribe(b, qname)
        assert (await http.stats(qname))["consumers"] == 2
        assert (await request(a, op="unsubscribe", queue=qname, id=2))["op"] == "ok"
        assert (await http.stats(qname))["consumers"] == 1

    async def none_left() -> bool:
        return bool((await http.stats(qname))["consumers"] == 0)

    await poll(none_left, what="consumers to drop to 0")


async def test_credits_are_never_exceeded(gateway: RunningGateway, http: Http, qname: str) -> None:
    await http.queue(qname)
    await http.send_many(qname, [f"m{i}" for i in range(10)])
    async with ws_connect(gateway, gateway.admin_key) as ws:
        await subscribe(ws, qname, prefetch=3)
        got = await deliveries(ws, 3)
        await nothing_more(ws)
        await send_frame(ws, op="ack", receipts=[got[0]["receipt"]])
        got += await deliveries(ws, 1)
        await nothing_more(ws)
        await send_frame(ws, op="ack", receipts=[m["receipt"] for m in got[1:]])
        got += await deliveries(ws, 3)
        await nothing_more(ws)
        assert [m["body"] for m in got] == [f"m{i}" for i in range(7)]


async def test_batch_frames(gateway: RunningGateway, http: Http, qname: str) -> None:
    await http.queue(qname)
    await http.send_many(qname, [f"m{i}" for i in range(12)])
    async with ws_connect(gateway, gateway.admin_key) as ws:
        await subscribe(ws, qname, prefetch=12, batch=5)
        frames = []
        count = 0
        while count < 12:
            frame = await recv_frame(ws)
            frames.append(frame)
            count += len(frame["messages"]) if frame["op"] == "messages" else 1
        assert any(f["op"] == "messages" and len(f["messages"]) > 1 for f in frames)
        assert all(len(f.get("messages", [None])) <= 5 for f in frames)
        bodies = [
            m["body"] for f in frames for m in (f["messages"] if f["op"] == "messages" else [f["message"]])
        ]
        assert bodies == [f"m{i}" for i in range(12)]


async def test_redelivery_after_disconnect_is_immediate(
    gateway: RunningGateway, http: Http, qname: str
) -> None:
    await http.queue(qname, visibility_timeout_s=600)
    await http.send_many(qname, ["a", "b"])
    async with ws_connect(gateway, gateway.admin_key) as first:
        await subscribe(first, qname, prefetch=5)
        held = await deliveries(first, 2)
    async with ws_connect(gateway, gateway.admin_key) as second:
        await subscribe(second, qname, prefetch=5)
        again = await deliveries(second, 2)
    assert sorted(m["id"] for m in again) == sorted(m["id"] for m in held)
    assert all(m["receive_count"] == 2 for m in again)


async def test_redelivery_after_unsubscribe_and_nack(gateway: RunningGateway, http: Http, qname: str) -> None:
    await http.queue(qname, visibility_timeout_s=600)
    await http.send(qname, "x")
    async with ws_connect(gateway, gateway.admin_key) as ws:
        await subscribe(ws, qname)
        (first,) = await deliveries(ws, 1)
        reply = await request(ws, op="nack", receipts=[first["receipt"]], id="n")
        assert reply["acked"] == 1
        (second,) = await deliveries(ws, 1)
        assert (second["id"], second["receive_count"]) == (first["id"], 2)
        await request(ws, op="unsubscribe", queue=qname, id="u")
        await subscribe(ws, qname)
        (third,) = await deliveries(ws, 1)
        assert (third["id"], third["receive_count"]) == (first["id"], 3)


async def test_nack_with_delay(gateway: RunningGateway, http: Http, qname: str) -> None:
    await http.queue(qname)
    await http.send(qname, "x")
    async with ws_connect(gateway, gateway.admin_key) as ws:
        await subscribe(ws, qname)
        (first,) = await deliveries(ws, 1)
        loop = asyncio.get_running_loop()
        start = loop.time()
        await send_frame(ws, op="nack", receipts=[first["receipt"]], delay_s=0.3)
        (second,) = await deliveries(ws, 1)
        assert second["id"] == first["id"]
        assert loop.time() - start >= 0.25


async def test_redelivery_after_visibility_timeout(gateway: RunningGateway, http: Http, qname: str) -> None:
    await http.queue(qname)
    await http.send(qname, "x")
    async with ws_connect(gateway, gateway.admin_key) as ws:
        # 8 s: the ping below must be heard before visibility + stall_grace_s (1 s) ends
        # (or the silent consumer is rightly closed 4008 instead), and the ack must land
        # within the second delivery's visibility, which starts before the receive's own
        # commit: on a busy disk that commit and the ack's took over 4 s together.
        await subscribe(ws, qname, prefetch=1, visibility_timeout_s=8)
        (first,) = await deliveries(ws, 1)
        # Not acked, but the client is heard from (any frame): the credit comes back when the
        # visibility ends, and so does the message. (A silent one is a slow consumer: 4008.)
        assert await request(ws, op="ping", id="alive") == {"op": "pong", "id": "alive"}
        (second,) = await deliveries(ws, 1, timeout=15)
        assert (second["id"], second["receive_count"]) == (first["id"], 2)
        # One ack for both: the old receipt died with its visibility, the new one works.
        reply = await request(ws, op="ack", receipts=[first["receipt"], second["receipt"]], id=1)
        assert reply["acked"] == 1
        assert [f["receipt"] for f in reply["failed"]] == [first["receipt"]]


async def test_delayed_message_is_pushed_when_due(gateway: RunningGateway, http: Http, qname: str) -> None:
    await http.queue(qname)
    async with ws_connect(gateway, gateway.admin_key) as ws:
        await subscribe(ws, qname)
        # Not pushed before it is due (timed from before the send: load only adds to it).
        start = time.monotonic()
        await http.send(qname, "later", delay_s=1)
        (message,) = await deliveries(ws, 1, timeout=10)
        assert time.monotonic() - start >= 0.9
        assert message["body"] == "later"


async def test_send_over_ws(gateway: RunningGateway, http: Http, qname: str) -> None:
    await http.queue(qname)
    async with ws_connect(gateway, gateway.admin_key) as ws:
        reply = await request(ws, op="send", queue=qname, body="one", dedupe_id="d1", id=1)
        assert reply["op"] == "ok" and set(reply["result"]) == {"id", "seq", "duplicate"}
        again = await request(ws, op="send", queue=qname, body="one", dedupe_id="d1", id=2)
        assert again["result"] == {**reply["result"], "duplicate": True}
        reply = await request(
            ws, op="send", queue=qname, messages=[{"body": "a"}, {"nope": 1}, {"body": "b"}], id=3
        )
        results = reply["results"]
        assert "id" in results[0] and results[1]["error"]["code"] == "invalid_request" and "id" in results[2]
        reply = await request(ws, op="send", queue="no-such-queue", body="x", id=4)
        assert (reply["op"], reply["code"]) == ("error", "queue_not_found")
        # Pipelined without waiting: every reply comes back, matched by id.
        for i in range(50):
            await send_frame(ws, op="send", queue=qname, body=f"p{i}", id=f"p{i}")
        ids: set[str] = set()
        while len(ids) < 50:
            frame = await recv_frame(ws)
            assert frame["op"] == "ok"
            ids.add(frame["id"])
    assert (await http.stats(qname))["visible"] == 53


async def test_auto_ack(gateway: RunningGateway, http: Http, qname: str) -> None:
    await http.queue(qname)
    await http.send_many(qname, [f"m{i}" for i in range(30)])
    async with ws_connect(gateway, gateway.admin_key) as ws:
        await subscribe(ws, qname, prefetch=5, ack="auto")
        got = await deliveries(ws, 30)
    assert [m["body"] for m in got] == [f"m{i}" for i in range(30)]

    async def empty() -> bool:
        stats = await http.stats(qname)
        return bool(stats["visible"] == 0 and stats["in_flight"] == 0)

    await poll(empty, what="auto-acked messages to be deleted")


async def test_fifo_across_subscribers(gateway: RunningGateway, http: Http, qname: str) -> None:
    await http.queue(qname, ordering="fifo")
    groups = ["g1", "g2", "g3"]
    for i in range(10):
        for group in groups:
            await http.send(qname, f"{group}-{i}", group_id=group)
    order: dict[str, list[int]] = {g: [] for g in groups}
    holding: dict[str, str] = {}
    done = asyncio.Event()

    async def consume(ws: Any) -> None:
        await subscribe(ws, qname, prefetch=2)
        while not done.is_set():
            try:
                (message,) = await deliveries(ws, 1, timeout=0.5)
            except TimeoutError:
                continue
            group = message["group_id"]
            # At most one message per group in flight across every subscriber.
            assert group not in holding, f"two messages of {group} in flight"
            holding[group] = message["id"]
            order[group].append(int(message["body"].split("-")[1]))
            await asyncio.sleep(0)  # let others run while this one holds the group
            del holding[group]
            await send_frame(ws, op="ack", receipts=[message["receipt"]])
            if sum(len(v) for v in order.values()) == 30:
                done.set()

    async with (
        ws_connect(gateway, gateway.admin_key) as a,
        ws_connect(gateway, gateway.admin_key) as b,
        ws_connect(gateway, gateway.admin_key) as c,
    ):
        await asyncio.wait_for(asyncio.gather(consume(a), consume(b), consume(c)), 30)
    assert all(order[g] == list(range(10)) for g in groups), order


async def test_no_loss_no_double_delivery_under_churn(
    gateway: RunningGateway, http: Http, qname: str
) -> None:
    await http.queue(qname, visibility_timeout_s=600)
    total = 400
    await http.send_many(qname, [f"m{i}" for i in range(total)])
    acked: set[str] = set()
    in_flight: dict[str, int] = {}

    async def consumer(index: int, quit_after: int | None) -> None:
        async with ws_connect(gateway, gateway.admin_key) as ws:
            await subscribe(ws, qname, prefetch=20, batch=4)
            seen = 0
            while len(acked) < total:
                try:
                    got = await deliveries(ws, 1, timeout=0.5)
                except TimeoutError:
                    continue
                for message in got:
                    owner = in_flight.get(message["id"])
                    assert owner is None, f"{message['id']} pushed to {index} while held by {owner}"
                    assert message["id"] not in acked, "an acked message came back"
                    in_flight[message["id"]] = index
                seen += len(got)
                if quit_after is not None and seen >= quit_after:
                    # Leave holding these: they must come back to someone else, once.
                    for message in got:
                        del in_flight[message["id"]]
                    return
                for message in got:
                    del in_flight[message["id"]]
                    acked.add(message["id"])
                await send_frame(ws, op="ack", receipts=[m["receipt"] for m in got])

    await asyncio.wait_for(
        asyncio.gather(consumer(0, None), consumer(1, 30), consumer(2, None), consumer(3, 60)), 60
    )
    assert len(acked) == total

    async def drained() -> bool:
        stats = await http.stats(qname)
        return bool(stats["visible"] == 0 and stats["in_flight"] == 0)

    await poll(drained, what="the queue to be empty")
    assert engine_of(gateway).stats()["in_flight"] == 0


async def test_queue_deleted_under_a_subscription(gateway: RunningGateway, http: Http, qname: str) -> None:
    await http.queue(qname)
    async with ws_connect(gateway, gateway.admin_key) as ws:
        await subscribe(ws, qname)
        assert (await http.client.delete(f"/v1/queues/{qname}")).status_code == 204
        frame = await recv_frame(ws)
        assert (frame["op"], frame["code"], frame["queue"]) == ("error", "queue_not_found", qname)
        assert await request(ws, op="ping", id=1) == {"op": "pong", "id": 1}
        assert (await http.client.put(f"/v1/queues/{qname}", json={})).status_code == 201
        await subscribe(ws, qname)  # the old subscription is gone, so this is allowed


async def test_pipelining_past_the_pending_bound(
    tmp_path: Path, store_target: StoreTarget, websocket_doors: ReleaseCheck, qname: str
) -> None:
    gateway = start_push_gateway(tmp_path, 0, store_target, websocket_doors, max_pending_requests=4)
    try:
        headers = {"Authorization": f"Bearer {gateway.admin_key}"}
        async with httpx.AsyncClient(base_url=gateway.url, headers=headers, timeout=scaled(30)) as client:
            http = Http(client)
            # A fresh name: on cluster:// each door's run shares the store.
            await http.queue(qname)
            async with ws_connect(gateway, gateway.admin_key) as ws:
                # The server stops reading at 4 unanswered sends and goes on as answers come.
                for i in range(200):
                    await send_frame(ws, op="send", queue=qname, body=f"p{i}", id=i)
                await send_frame(ws, op="send", queue=qname, body="no id")
                answered: set[int] = set()
                while len(answered) < 200:
                    frame = await recv_frame(ws)
                    answered.add(frame["id"])
                assert await request(ws, op="ping", id="last") == {"op": "pong", "id": "last"}

            # The unanswered send commits on its own time: a later ping's pong does not wait for it.
            async def all_stored() -> bool:
                return bool((await http.stats(qname))["visible"] == 201)

            await wait_for(all_stored, what="the fire-and-forget send to be stored")
    finally:
        gateway.stop()
