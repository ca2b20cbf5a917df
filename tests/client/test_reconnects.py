"""The client's reconnects against failures from outside the server: a network cut (a TCP
proxy aborts the connection, so the server sees its client hang up) and a real gateway
restart (same data directory, same port). Tests elsewhere end streams from inside the
server, which releases at once and so cannot tell whether the client resumed."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from pushgate_client import AsyncClient, Backoff, Message
from tests.conftest import scaled
from tests.fixtures.tcp_proxy import TcpProxy
from tests.push.conftest import TEST_SETTINGS, start_push_gateway

from .conftest import RunningGateway, text

GRACE_S = TEST_SETTINGS.sse_resume_grace_s


async def test_sse_resume_after_a_cut_keeps_the_held_messages(gateway: RunningGateway, qname: str) -> None:
    proxy = await TcpProxy(gateway.port).start()
    try:
        async with AsyncClient(proxy.url, gateway.admin_key) as client:
            await client.create_queue(qname, visibility_timeout_s=600)
            await client.send_batch(qname, [f"m{i}" for i in range(4)])
            sub = client.subscribe(qname, transport="sse", prefetch=10, backoff=Backoff(0.05, 0.2))
            async with sub:
                async with asyncio.timeout(scaled(10)):
                    held: list[Message] = [await sub.__anext__() for _ in range(4)]
                proxy.cut()
                cut_at = time.monotonic()
                # The client notices, reconnects with Last-Event-ID and waits for more.
                waiting = asyncio.ensure_future(sub.__anext__())
                deadline = cut_at + scaled(GRACE_S)
                while sub.connects < 2:
                    assert time.monotonic() < deadline, "the client did not reconnect within the grace"
                    assert not waiting.done(), waiting
                    await asyncio.sleep(0.02)
                # Past the grace, a stream that was not resumed has given its messages back
                # (and they would come again, with new receipts); a resumed one still holds them.
                await asyncio.sleep(max(0.0, cut_at + GRACE_S + 1.0 - time.monotonic()))
                assert not waiting.done(), f"redelivered after a resume: {waiting.result()}"
                acked = await client.ack(qname, [m.receipt for m in held])
                assert acked["acked"] == 4, acked
                waiting.cancel()
    finally:
        await proxy.close()


async def test_subscriptions_come_back_after_a_gateway_restart(tmp_path: Path) -> None:
    first = start_push_gateway(tmp_path)
    port, key = first.port, first.admin_key
    running: list[RunningGateway] = [first]
    try:
        async with AsyncClient(first.url, key) as client:
            await client.create_queue("restart", visibility_timeout_s=600)
            await client.send_batch("restart", ["before-ws", "before-sse"])
            backoff = Backoff(0.05, 0.5)
            async with (
                client.subscribe("restart", prefetch=1, backoff=backoff) as ws_sub,
                client.subscribe("restart", transport="sse", prefetch=1, backoff=backoff) as sse_sub,
            ):
                async with asyncio.timeout(scaled(10)):
                    got = [await ws_sub.__anext__(), await sse_sub.__anext__()]
                    await ws_sub.ack(got[0])
                    await sse_sub.ack(got[1])
                assert sorted(text(m) for m in got) == ["before-sse", "before-ws"]

                running.pop().stop()  # drains: WebSocket 1001, SSE close event, store closed
                running.append(start_push_gateway(tmp_path, port=port))
                await client.send_batch("restart", ["after-1", "after-2"])
                async with asyncio.timeout(scaled(20)):
                    after = [await ws_sub.__anext__(), await sse_sub.__anext__()]
                assert sorted(text(m) for m in after) == ["after-1", "after-2"]
                assert ws_sub.connects >= 2 and sse_sub.connects >= 2
                # The new gateway's receipts work: both are acked on the restarted store.
                assert (await client.ack("restart", [m.receipt for m in after]))["acked"] == 2
    finally:
        for gateway in running:
            gateway.stop()
