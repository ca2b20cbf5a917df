"""SSE push rate: the gateway's event streams against bare Starlette streams pushing the same
events from memory, in the same run: a plain ``StreamingResponse`` (one event per chunk) and
sse-starlette's ``EventSourceResponse`` (one event per chunk, its default use), and the gateway's own SSE transport fed from memory
(no store), to show where the gateway's figure is bounded.

Run: ``python bench/push_sse.py [--messages 20000] [--consumers 1,100] [--size 1024]``

The gateway side is like ``push_fanout.py``: N queues with ``messages / N`` stored 1 KiB
messages each, N streams with ``prefetch=100&ack=auto`` (receive and delete fsynced). The
consumers are raw asyncio connections counting ``event: message`` lines (another process
from the servers). The point: the push transport must not be capped by the SSE library.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.push_common import (
    create_queue,
    fill_queue,
    free_port,
    machine,
    start_gateway,
    start_script,
    stop,
    wait_for_port,
)

if TYPE_CHECKING:
    from push.sse_handler import PushEventStream


def event_of(size: int, n: int) -> bytes:
    message = {
        "id": f"{n:032x}",
        "seq": n,
        "receipt": "A" * 38,
        "body": "x" * size,
        "attributes": {},
        "group_id": None,
        "sent_at": time.time(),
        "receive_count": 1,
    }
    return b"id: stream.%d\nevent: message\ndata: %s\n\n" % (n, orjson.dumps(message))


def push_stream(per_stream: int, size: int) -> PushEventStream:
    """The gateway's SSE transport and response, fed from memory 100 events at a time
    (the dispatcher's largest deal), refilled when the transport drained: no store."""
    from push.close_codes import CloseCode
    from push.sse_handler import STREAM_HEADERS, PushEventStream
    from push.sse_protocol import SseEncoder
    from push.transport import SseTransport

    payloads = [orjson.dumps({"id": f"{n:032x}", "body": "x" * size, "seq": n}) for n in range(256)]
    encoder = SseEncoder("bench-stream-0001")
    transport = SseTransport(4 << 20, 15.0)
    drained = asyncio.Event()
    transport.bind(lambda code, reason: None, drained.set)

    async def feed() -> None:
        sent = 0
        while sent < per_stream:
            count = min(100, per_stream - sent)
            transport.write(encoder.frames([payloads[(sent + i) & 255] for i in range(count)], sent + 1))
            sent += count
            drained.clear()
            await drained.wait()
        transport.close(CloseCode.NORMAL)

    feeder = asyncio.get_running_loop().create_task(feed())

    async def body() -> AsyncIterator[bytes]:
        async for chunk in transport.body(encoder.opening(2000)):
            yield chunk
        await feeder

    return PushEventStream(body(), headers=STREAM_HEADERS, ping=0)


def bare_server(port: int, kind: str, per_stream: int, size: int) -> None:
    import uvicorn
    from sse_starlette.sse import EventSourceResponse
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response, StreamingResponse
    from starlette.routing import Route

    events = [event_of(size, n) for n in range(256)]

    async def body() -> AsyncIterator[bytes]:
        for n in range(per_stream):
            yield events[n & 255]

    async def endpoint(request: Request) -> Response:
        if kind == "streaming":
            return StreamingResponse(body(), media_type="text/event-stream")
        if kind == "push":
            return push_stream(per_stream, size)  # a Response
        return EventSourceResponse(body())

    app = Starlette(routes=[Route("/events", endpoint)])
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


async def consume(port: int, paths: list[str], per_stream: int, key: str | None) -> float:
    auth = f"Authorization: Bearer {key}\r\n" if key else ""

    async def one(path: str) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n{auth}\r\n".encode())
        count = 0
        tail = b""
        while count < per_stream:
            data = await reader.read(1 << 16)
            if not data:
                break
            data = tail + data
            count += data.count(b"event: message")
            tail = data[-16:]
            count -= tail.count(b"event: message")
        writer.close()

    start = time.perf_counter()
    await asyncio.gather(*(one(p) for p in paths))
    return time.perf_counter() - start


def bare_rate(kind: str, consumers: int, total: int, size: int) -> float:
    per_stream = total // consumers
    port = free_port()
    proc = start_script(__file__, "_bare", str(port), kind, str(per_stream), str(size))
    try:
        wait_for_port(port)
        elapsed = asyncio.run(consume(port, ["/events"] * consumers, per_stream, None))
    finally:
        stop(proc)
    return per_stream * consumers / elapsed


def gateway_rate(url: str, key: str, consumers: int, total: int, size: int) -> float:
    per_stream = total // consumers
    queues = [f"sse-{consumers}-{i}" for i in range(consumers)]
    for queue in queues:
        create_queue(url, key, queue)
        fill_queue(url, key, queue, per_stream, "x" * size)
    port = int(url.rsplit(":", 1)[1])
    paths = [f"/v1/queues/{q}/events?prefetch=100&ack=auto" for q in queues]
    elapsed = asyncio.run(consume(port, paths, per_stream, key))
    return per_stream * consumers / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--consumers", default="1,100")
    parser.add_argument("--size", type=int, default=1024)
    args = parser.parse_args()
    print(machine())
    rows = []
    with tempfile.TemporaryDirectory(prefix="pushgate-sse-") as tmp:
        proc, url, key = start_gateway(Path(tmp))
        try:
            for consumers in (int(c) for c in args.consumers.split(",")):
                streaming = bare_rate("streaming", consumers, args.messages, args.size)
                sse_lib = bare_rate("sse-starlette", consumers, args.messages, args.size)
                transport = bare_rate("push", consumers, args.messages, args.size)
                gateway = gateway_rate(url, key, consumers, args.messages, args.size)
                rows.append((consumers, gateway, transport, streaming, sse_lib))
        finally:
            stop(proc)
    print(f"\n{args.messages} events of {args.size} B bodies per row (events/s)")
    print("gateway: stored messages, received + deleted (fsynced), pushed; push transport: the gateway's")
    print("SseTransport + PushEventStream fed from memory; bare: one event per chunk from memory\n")
    print(
        f"{'streams':>7} {'gateway':>9} {'push transport':>15} {'bare Streaming':>15} {'bare EventSource':>17} "
        f"{'transport/EventSource':>22} {'transport/Streaming':>20}"
    )
    for consumers, gateway, transport, streaming, sse_lib in rows:
        print(
            f"{consumers:>7} {gateway:>9.0f} {transport:>15.0f} {streaming:>15.0f} {sse_lib:>17.0f} "
            f"{transport / sse_lib:>22.1%} {transport / streaming:>20.1%}"
        )


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_bare":
        bare_server(int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
    else:
        main()
