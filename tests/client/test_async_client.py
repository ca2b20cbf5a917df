"""The asyncio client against a real gateway."""

from __future__ import annotations

import asyncio
import importlib.abc
import sys

import pytest

from push.close_codes import CloseCode
from pushgate_client import AsyncClient, ConnectionEnded, Message, PushgateError, SendResult
from tests.conftest import scaled

from .conftest import RunningGateway, engine_of, text


def kick_everyone(gateway: RunningGateway, code: CloseCode) -> None:
    """Close every push connection from the server side (a restart, a slow-consumer cut)."""
    engine = engine_of(gateway)

    def close_all() -> None:
        for conn in list(engine._connections):
            conn.transport.close(code, "test")

    gateway.loop.call_soon_threadsafe(close_all)


async def test_http_calls(gateway: RunningGateway, qname: str) -> None:
    async with AsyncClient(gateway.url, gateway.admin_key) as client:
        await client.create_queue(qname, visibility_timeout_s=60)
        sent = await client.send(qname, "hello", attributes={"k": "v"}, dedupe_id="d")
        assert isinstance(sent, SendResult) and not sent.duplicate
        assert (await client.send(qname, "hello", dedupe_id="d")).duplicate
        results = await client.send_batch(
            qname, ["a", b"\x00\xff", {"body": "c", "group_id": "g"}, {"bad": 1}]
        )
        assert [type(r) for r in results] == [SendResult, SendResult, SendResult, PushgateError]
        messages = await client.receive(qname, max_messages=10)
        assert [m.body for m in messages] == ["hello", "a", None, "c"]
        assert messages[2].data == b"\x00\xff"
        assert (await client.nack(qname, [messages[0].receipt]))["nacked"] == 1
        assert (await client.ack(qname, [m.receipt for m in messages[1:]]))["acked"] == 3
        with pytest.raises(PushgateError) as info:
            await client.send("no-such-queue", "x")
        assert (info.value.code, info.value.status) == ("queue_not_found", 404)


async def test_ws_subscribe_acks_and_reconnects(gateway: RunningGateway, qname: str) -> None:
    async with AsyncClient(gateway.url, gateway.admin_key) as client:
        await client.create_queue(qname, visibility_timeout_s=600)
        await client.send_batch(qname, [f"m{i}" for i in range(6)])
        got: list[Message] = []
        acked: set[str] = set()
        async with client.subscribe(qname, prefetch=3) as sub:
            async with asyncio.timeout(scaled(10)):
                async for message in sub:
                    got.append(message)
                    if len(got) == 2:
                        # Held, not acked: released by the server when it cuts us off.
                        kick_everyone(gateway, CloseCode.GOING_AWAY)
                        continue
                    await sub.ack(message)
                    acked.add(message.id)
                    if len(acked) == 6:
                        break
            assert sub.connects >= 2
        assert sorted({text(m) for m in got}) == [f"m{i}" for i in range(6)]
        redelivered = [m for m in got if m.receive_count > 1]
        assert got[1].id in {m.id for m in redelivered}


async def test_ws_subscribe_gives_up_on_auth_and_scope(gateway: RunningGateway, qname: str) -> None:
    async with AsyncClient(gateway.url, gateway.admin_key) as admin:
        await admin.create_queue(qname)
    async with AsyncClient(gateway.url, gateway.make_key(f"send:{qname}")) as client:
        with pytest.raises(ConnectionEnded) as info:
            async with asyncio.timeout(scaled(10)):
                async for _ in client.subscribe(qname):
                    pass
        assert (info.value.close_code, info.value.code, info.value.reconnect) == (4003, "forbidden", False)
    async with AsyncClient(gateway.url, "pg_bad.bad") as client:
        with pytest.raises(ConnectionEnded) as info:
            async for _ in client.subscribe(qname):
                pass
        assert info.value.close_code == 4001


async def test_ws_subscribe_unknown_queue_raises(gateway: RunningGateway) -> None:
    async with AsyncClient(gateway.url, gateway.admin_key) as client:
        with pytest.raises(PushgateError) as info:
            async for _ in client.subscribe("no-such-queue"):
                pass
        assert info.value.code == "queue_not_found"


async def test_sse_subscribe_resumes_with_last_event_id(gateway: RunningGateway, qname: str) -> None:
    async with AsyncClient(gateway.url, gateway.admin_key) as client:
        await client.create_queue(qname, visibility_timeout_s=600)
        await client.send_batch(qname, [f"m{i}" for i in range(5)])
        got: list[Message] = []
        async with client.subscribe(qname, transport="sse", prefetch=2) as sub:
            async with asyncio.timeout(scaled(10)):
                async for message in sub:
                    got.append(message)
                    await sub.ack(message)
                    if len(got) == 2:
                        kick_everyone(gateway, CloseCode.POLICY)
                    if len({m.id for m in got}) == 5:
                        break
            assert sub.connects >= 2
        assert sorted({text(m) for m in got}) == [f"m{i}" for i in range(5)]
        assert got[0].event_id is not None and got[0].event_id.endswith(".1")


async def test_sse_subscribe_errors(gateway: RunningGateway) -> None:
    async with AsyncClient(gateway.url, gateway.admin_key) as client:
        with pytest.raises(PushgateError) as info:
            async for _ in client.subscribe("no-such-queue", transport="sse"):
                pass
        assert (info.value.code, info.value.status) == ("queue_not_found", 404)


async def test_ws_producer_pipelines(gateway: RunningGateway, qname: str) -> None:
    async with AsyncClient(gateway.url, gateway.admin_key) as client:
        await client.create_queue(qname)
        async with client.producer() as producer:
            first = await producer.send(qname, "one")
            futures = [await producer.submit(qname, f"p{i}") for i in range(100)]
            frames = await asyncio.gather(*futures)
            with pytest.raises(PushgateError):
                await producer.send("no-such-queue", "x")
        assert first.seq < frames[0]["result"]["seq"]
        assert len({f["result"]["id"] for f in frames}) == 100
        messages = await client.receive(qname, max_messages=100)
        assert len(messages) == 100


async def test_a_request_makes_no_import_search(gateway: RunningGateway, qname: str) -> None:
    """httpcore looks for ``sniffio`` on every pooled request (``import sniffio`` inside a
    function) and falls back when it is missing; without it installed each request searched
    ``sys.path`` four times, most of a client's CPU at 64 requests in flight (session 57's
    bench/many_queues.py). ``sniffio`` is a dependency, so the import is a dictionary lookup."""
    searched: list[str] = []

    class Recorder(importlib.abc.MetaPathFinder):
        def find_spec(self, name: str, path: object = None, target: object = None) -> None:
            searched.append(name)

    async with AsyncClient(gateway.url, gateway.admin_key) as client:
        await client.create_queue(qname)
        await client.send(qname, "warm")  # what the first request imports for good
        recorder = Recorder()
        sys.meta_path.insert(0, recorder)
        try:
            for n in range(20):
                await client.send(qname, f"m{n}")
        finally:
            sys.meta_path.remove(recorder)
    assert searched == []
