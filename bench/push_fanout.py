"""Fan-out: how fast one gateway process pushes stored messages to 1 and to 100 consumers,
against a bare ``websockets``-library server pushing the same frames, in the same run.

Run: ``python bench/push_fanout.py [--messages 20000] [--consumers 1,100] [--size 1024]``

For each consumer count N, the gateway gets N queues holding ``messages / N`` 1 KiB messages
each; N WebSocket consumers (another process, the ``websockets`` client, counting frames)
subscribe one queue each with prefetch 100 (``--prefetch``) and ``ack=auto``, so every message is received
(marked in flight, fsynced), pushed and deleted (fsynced) by the store. The baseline is a
``websockets`` server (its own process, same event loop policy) that sends each of N
connections the same number of frames, built like the gateway's ``message`` frames,
straight from memory: the ceiling of pushing frames from Python. The ratio is the point
(target >= 50%).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

import orjson
from websockets.asyncio.client import connect
from websockets.typing import Subprotocol

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.push_common import (
    cpu_seconds,
    create_queue,
    fill_queue,
    free_port,
    machine,
    start_gateway,
    start_script,
    stop,
    wait_for_port,
)


def frame_of(size: int, seq: int) -> str:
    """A message frame as the gateway builds it (the receive JSON of a ``size``-byte body)."""
    message = {
        "id": f"{seq:032x}",
        "seq": seq,
        "receipt": "A" * 38,
        "body": "x" * size,
        "attributes": {},
        "group_id": None,
        "sent_at": time.time(),
        "receive_count": 1,
    }
    return '{"op":"message","queue":"fanout","message":' + orjson.dumps(message).decode() + "}"


# The baseline server ------------------------------------------------------------------


def bare_server(port: int, per_connection: int, size: int) -> None:
    import uvloop
    from websockets.asyncio.server import ServerConnection, serve

    frames = [frame_of(size, i) for i in range(256)]

    async def handler(ws: ServerConnection) -> None:
        await ws.recv()  # the client's "subscribe"
        for i in range(per_connection):
            await ws.send(frames[i & 255])
        await ws.wait_closed()

    async def main() -> None:
        async with serve(handler, "127.0.0.1", port, max_size=None, compression=None):
            await asyncio.Future()

    uvloop.run(main())


# The consumers (this process) -------------------------------------------------------


async def consume(url: str, key: str | None, queues: list[str], per_queue: int, prefetch: int = 100) -> float:
    """Connect and subscribe every consumer, then time until all messages arrived."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    connections = [
        await connect(
            url,
            subprotocols=[Subprotocol("pushgate.v1")],
            additional_headers=headers,
            max_size=None,
            compression=None,
        )
        for _ in queues
    ]

    async def drain(ws: object, queue: str) -> None:
        count = 0
        frame = {"op": "subscribe", "id": 1, "queue": queue, "prefetch": prefetch, "ack": "auto"}
        await ws.send(orjson.dumps(frame).decode())  # type: ignore[attr-defined]
        while count < per_queue:
            raw = await ws.recv()  # type: ignore[attr-defined]
            if raw.startswith('{"op":"message"'):
                count += 1

    start = time.perf_counter()
    await asyncio.gather(*(drain(ws, q) for ws, q in zip(connections, queues, strict=True)))
    elapsed = time.perf_counter() - start
    await asyncio.gather(*(ws.close() for ws in connections))
    return elapsed


def run_gateway(
    url: str, key: str, pid: int, consumers: int, total: int, size: int, prefetch: int
) -> tuple[float, float]:
    per_queue = total // consumers
    queues = [f"fanout-{consumers}-{i}" for i in range(consumers)]
    body = "x" * size
    for queue in queues:
        create_queue(url, key, queue)
        fill_queue(url, key, queue, per_queue, body)
    cpu = cpu_seconds(pid)
    elapsed = asyncio.run(consume(url.replace("http", "ws", 1) + "/v1/ws", key, queues, per_queue, prefetch))
    return per_queue * consumers / elapsed, (cpu_seconds(pid) - cpu) / (per_queue * consumers) * 1e6


def run_bare(consumers: int, total: int, size: int) -> float:
    per_queue = total // consumers
    port = free_port()
    proc = start_script(__file__, "_bare", str(port), str(per_queue), str(size))
    try:
        wait_for_port(port)
        elapsed = asyncio.run(consume(f"ws://127.0.0.1:{port}/", None, ["fanout"] * consumers, per_queue))
    finally:
        stop(proc)
    return per_queue * consumers / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=20_000, help="messages per consumer count")
    parser.add_argument("--consumers", default="1,100")
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--prefetch", type=int, default=100)
    args = parser.parse_args()
    print(machine())
    rows = []
    with tempfile.TemporaryDirectory(prefix="pushgate-fanout-") as tmp:
        proc, url, key = start_gateway(Path(tmp))
        try:
            for consumers in (int(c) for c in args.consumers.split(",")):
                bare = run_bare(consumers, args.messages, args.size)
                rate, cpu_us = run_gateway(
                    url, key, proc.pid, consumers, args.messages, args.size, args.prefetch
                )
                rows.append((consumers, rate, bare, cpu_us))
        finally:
            stop(proc)
    print(
        f"\n{args.messages} messages of {args.size} B per row; gateway: stored, received (fsynced), pushed, "
        "auto-acked (fsynced); bare: the same frames from memory\n"
    )
    print(f"{'consumers':>9} {'gateway msg/s':>14} {'bare msg/s':>11} {'ratio':>7} {'gw CPU/msg':>11}")
    for consumers, rate, bare, cpu_us in rows:
        print(f"{consumers:>9} {rate:>14.0f} {bare:>11.0f} {rate / bare:>7.1%} {cpu_us:>9.0f}us")
    print(json.dumps([{"consumers": c, "gateway": round(r), "bare": round(b)} for c, r, b, _ in rows]))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_bare":
        bare_server(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
    else:
        main()
