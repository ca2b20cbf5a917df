"""Memory per idle consumer: RSS of one gateway process per idle subscribed WebSocket and per
idle SSE stream, against a bare uvicorn + Starlette WebSocket endpoint, in the same run.

Run: ``python bench/push_idle.py [--connections 5000]`` (``--connections 10000`` for the
10,000-consumer check; the file-descriptor limit must allow it).

Each figure is a fresh server process: open ``--warmup`` connections first (so one-off
allocations do not count), read RSS, open ``--connections`` more, wait for every
``subscribe`` to be answered (WS) or every stream's first bytes (SSE), read RSS again.
Per-connection cost = RSS growth / connections. The clients live in this process.
Target: <= 1.5x the bare figure.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
from websockets.asyncio.client import connect
from websockets.typing import Subprotocol

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.push_common import (
    create_queue,
    free_port,
    machine,
    rss_kib,
    start_gateway,
    start_script,
    stop,
    wait_for_port,
)

CONCURRENT_OPENS = 200


def bare_server(port: int) -> None:
    """The baseline: a Starlette WebSocket endpoint on uvicorn that accepts and waits."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.routing import WebSocketRoute
    from starlette.websockets import WebSocket

    async def endpoint(websocket: WebSocket) -> None:
        await websocket.accept()
        while (await websocket.receive())["type"] != "websocket.disconnect":
            pass

    app = Starlette(routes=[WebSocketRoute("/ws", endpoint)])
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


async def open_ws(url: str, key: str | None, queue: str | None, count: int) -> list[Any]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    gate = asyncio.Semaphore(CONCURRENT_OPENS)

    async def one() -> Any:
        async with gate:
            ws = await connect(
                url,
                subprotocols=[Subprotocol("pushgate.v1")],
                additional_headers=headers,
                ping_interval=None,
                # No permessage-deflate: its zlib state per connection would swamp the figure.
                compression=None,
            )
            if queue is not None:
                await ws.send(orjson.dumps({"op": "subscribe", "id": 1, "queue": queue}).decode())
                reply = orjson.loads(await ws.recv())
                assert reply["op"] == "ok", reply
            return ws

    return list(await asyncio.gather(*(one() for _ in range(count))))


async def open_sse(host: str, port: int, key: str, queue: str, count: int) -> list[Any]:
    gate = asyncio.Semaphore(CONCURRENT_OPENS)
    request = (
        f"GET /v1/queues/{queue}/events HTTP/1.1\r\nHost: {host}\r\nAccept: text/event-stream\r\n"
        f"Authorization: Bearer {key}\r\n\r\n"
    ).encode()

    async def one() -> Any:
        async with gate:
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200"), head
            await reader.readuntil(b"\n\n")  # retry: ..., the stream is live
            return writer

    return list(await asyncio.gather(*(one() for _ in range(count))))


async def close_all(conns: list[Any]) -> None:
    for conn in conns:
        if hasattr(conn, "close") and asyncio.iscoroutinefunction(conn.close):
            await conn.close()
        else:
            conn.close()


def settle_rss(pid: int) -> int:
    """RSS once it stops moving (the server may still be finishing handshakes)."""
    last = rss_kib(pid)
    for _ in range(20):
        time.sleep(0.25)
        now = rss_kib(pid)
        if abs(now - last) < 64:
            return now
        last = now
    return last


def measure(pid: int, opener: Any, warmup: int, count: int) -> float:
    async def run() -> float:
        warm = await opener(warmup)
        before = settle_rss(pid)
        conns = await opener(count)
        after = settle_rss(pid)
        await close_all(conns + warm)
        return (after - before) / count

    gc.collect()
    return asyncio.run(run())


def gateway_figure(kind: str, warmup: int, count: int) -> float:
    with tempfile.TemporaryDirectory(prefix=f"pushgate-idle-{kind}-") as tmp:
        proc, url, key = start_gateway(Path(tmp))
        try:
            create_queue(url, key, "idle")
            if kind == "ws":
                ws_url = url.replace("http", "ws", 1) + "/v1/ws"
                return measure(proc.pid, lambda n: open_ws(ws_url, key, "idle", n), warmup, count)
            host, port = url.split("//", 1)[1].rsplit(":", 1)
            return measure(proc.pid, lambda n: open_sse(host, int(port), key, "idle", n), warmup, count)
        finally:
            stop(proc)


def bare_figure(warmup: int, count: int) -> float:
    port = free_port()
    proc = start_script(__file__, "_bare", str(port))
    try:
        wait_for_port(port)
        return measure(proc.pid, lambda n: open_ws(f"ws://127.0.0.1:{port}/ws", None, None, n), warmup, count)
    finally:
        stop(proc)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--connections", type=int, default=5000)
    parser.add_argument("--warmup", type=int, default=200)
    args = parser.parse_args()
    print(machine())
    bare = bare_figure(args.warmup, args.connections)
    ws = gateway_figure("ws", args.warmup, args.connections)
    sse = gateway_figure("sse", args.warmup, args.connections)
    print(f"\n{args.connections} idle connections per server process (after {args.warmup} warm-up ones)\n")
    print(f"{'server':<44} {'KiB/conn':>9} {'vs bare':>8}")
    print(f"{'bare uvicorn + Starlette WebSocket':<44} {bare:>9.1f} {1:>8.2f}")
    print(f"{'gateway WebSocket, authenticated + subscribed':<44} {ws:>9.1f} {ws / bare:>8.2f}")
    print(f"{'gateway SSE stream, authenticated':<44} {sse:>9.1f} {sse / bare:>8.2f}")
    verdict = "meet" if max(ws, sse) <= 1.5 * bare else "miss"
    print(f"\nthe push transports {verdict} the <= 1.5x target")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_bare":
        bare_server(int(sys.argv[2]))
    else:
        main()
