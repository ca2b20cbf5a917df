"""End to end over WebSocket: a producer sends, a consumer gets pushed messages and acks.

Run: ``python bench/push_e2e.py [--seconds 5] [--rate 2000] [--size 1024] [--producer ws|http]``

Three processes share the machine: the gateway (``pushgate serve``: uvicorn, uvloop,
embedded LMDB, every send fsynced before its ``ok``), a consumer (a ``websockets`` client
subscribed with prefetch 100 that acks every 20 messages in one frame) and the producer
(this process: pipelined ``send`` frames over one WebSocket, at most ``--window``
outstanding, or HTTP ``POST`` on 32 keep-alive connections). Each body starts with its
send time, so the consumer measures send->push latency on the same clock.

Phases: ``max`` (as fast as the producer can go) and ``paced`` (``--rate`` msg/s, the
latency target: p99 <= 10 ms at 2,000 msg/s).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
from websockets.asyncio.client import connect
from websockets.typing import Subprotocol

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.push_common import cpu_seconds, create_queue, machine, percentiles, start_gateway, stop
from pushgate_client import AsyncClient

ACK_EVERY = 20


# The consumer process ---------------------------------------------------------------


async def consume(url: str, key: str, queue: str, prefetch: int) -> None:
    ws_url = url.replace("http", "ws", 1) + "/v1/ws"
    headers = {"Authorization": f"Bearer {key}"}
    async with connect(
        ws_url,
        subprotocols=[Subprotocol("pushgate.v1")],
        additional_headers=headers,
        max_size=None,
        compression=None,
    ) as ws:
        await ws.send(
            orjson.dumps({"op": "subscribe", "id": 1, "queue": queue, "prefetch": prefetch}).decode()
        )
        print("ready", flush=True)
        latencies: list[float] = []
        receipts: list[str] = []
        first = last = 0.0
        while True:
            frame = orjson.loads(await ws.recv())
            now = time.time()
            op = frame["op"]
            if op == "message":
                messages = [frame["message"]]
            elif op == "messages":
                messages = frame["messages"]
            else:
                continue
            end = False
            for message in messages:
                body = message["body"]
                receipts.append(message["receipt"])
                if body.startswith("END"):
                    end = True
                    continue
                latencies.append(now - float(body[:17]))
                first = first or now
                last = now
            if end or len(receipts) >= ACK_EVERY:
                await ws.send(orjson.dumps({"op": "ack", "receipts": receipts}).decode())
                receipts = []
            if end:
                break
    p50, p99 = percentiles(latencies)
    elapsed = max(last - first, 1e-9)
    print(
        json.dumps(
            {
                "count": len(latencies),
                "msg_per_s": len(latencies) / elapsed,
                "p50_ms": p50 * 1e3,
                "p99_ms": p99 * 1e3,
                "max_ms": max(latencies, default=0) * 1e3,
            }
        ),
        flush=True,
    )


# The producer (this process) -------------------------------------------------------------


def body_of(size: int) -> str:
    stamp = f"{time.time():.6f}"
    return stamp + " " + "x" * max(0, size - len(stamp) - 1)


async def produce_ws(
    url: str, key: str, queue: str, seconds: float, rate: float | None, size: int, window: int
) -> int:
    sent = 0
    async with AsyncClient(url, key) as client, client.producer() as producer:
        outstanding: list[asyncio.Future[Any]] = []
        start = time.perf_counter()
        while (now := time.perf_counter()) - start < seconds:
            if rate is not None:
                due = start + sent / rate
                if due > now:
                    await asyncio.sleep(due - now)
            outstanding.append(await producer.submit(queue, body_of(size)))
            sent += 1
            if len(outstanding) >= window:
                await outstanding.pop(0)
                if rate is None:
                    # Let replies in: without a yield the reader would starve.
                    outstanding = [f for f in outstanding if not f.done()]
        await asyncio.gather(*outstanding)
        await producer.send(queue, "END")
    return sent


async def produce_http(url: str, key: str, queue: str, seconds: float, rate: float | None, size: int) -> int:
    """32 keep-alive connections posting one message each per request. A raw HTTP/1.1
    client on asyncio streams: httpx's async pool is itself the ceiling at this rate."""
    host, port = url.split("//", 1)[1].rsplit(":", 1)
    sent = 0
    start = time.perf_counter()

    async def post(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, body: bytes) -> None:
        writer.write(
            b"POST /v1/queues/%s/messages HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
            % (queue.encode(), host.encode(), key.encode(), len(body), body)
        )
        head = await reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 201"):
            raise RuntimeError(head.decode(errors="replace"))
        length = int(head.lower().split(b"content-length:", 1)[1].split(b"\r\n", 1)[0])
        await reader.readexactly(length)

    async def worker() -> None:
        nonlocal sent
        reader, writer = await asyncio.open_connection(host, int(port))
        while (now := time.perf_counter()) - start < seconds:
            index = sent
            sent += 1
            if rate is not None and start + index / rate > now:
                await asyncio.sleep(start + index / rate - now)
            await post(reader, writer, orjson.dumps({"body": body_of(size)}))
        writer.close()

    await asyncio.gather(*(worker() for _ in range(32)))
    reader, writer = await asyncio.open_connection(host, int(port))
    await post(reader, writer, b'{"body": "END"}')
    writer.close()
    return sent


def run_phase(
    url: str, key: str, args: argparse.Namespace, name: str, rate: float | None, gateway_pid: int
) -> dict[str, Any]:
    queue = f"e2e-{name}"
    create_queue(url, key, queue)
    consumer = subprocess.Popen(
        [sys.executable, __file__, "_consume", url, key, queue, str(args.prefetch)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert consumer.stdout is not None
    assert consumer.stdout.readline().strip() == "ready"
    started = time.perf_counter()
    cpu_before = cpu_seconds(gateway_pid)
    if args.producer == "ws":
        sent = asyncio.run(produce_ws(url, key, queue, args.seconds, rate, args.size, args.window))
    else:
        sent = asyncio.run(produce_http(url, key, queue, args.seconds, rate, args.size))
    send_rate = sent / (time.perf_counter() - started)
    result: dict[str, Any] = json.loads(consumer.stdout.readline())
    consumer.wait(30)
    result["gateway_cpu_us_per_msg"] = (cpu_seconds(gateway_pid) - cpu_before) / max(sent, 1) * 1e6
    result["sent_per_s"] = send_rate
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=4.0, help="length of each phase")
    parser.add_argument("--rate", type=float, default=2000.0, help="paced phase, msg/s")
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--prefetch", type=int, default=100)
    parser.add_argument("--window", type=int, default=256, help="WS producer: most sends awaiting their ok")
    parser.add_argument("--producer", choices=["ws", "http"], default="ws")
    args = parser.parse_args()
    print(machine())
    with tempfile.TemporaryDirectory(prefix="pushgate-e2e-") as tmp:
        proc, url, key = start_gateway(Path(tmp))
        try:
            results = {
                "max": run_phase(url, key, args, "max", None, proc.pid),
                f"paced {args.rate:g}/s": run_phase(url, key, args, "paced", args.rate, proc.pid),
            }
        finally:
            stop(proc)
    print(
        f"\nproducer over {args.producer}, {args.size} B bodies, consumer prefetch {args.prefetch}, "
        f"acks every {ACK_EVERY}; every send fsynced before its ok\n"
    )
    print(
        f"{'phase':<16} {'sent/s':>9} {'pushed/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'gw CPU/msg':>11}"
    )
    for name, r in results.items():
        print(
            f"{name:<16} {r['sent_per_s']:>9.0f} {r['msg_per_s']:>9.0f} {r['p50_ms']:>8.2f} {r['p99_ms']:>8.2f} "
            f"{r['max_ms']:>8.2f} {r['gateway_cpu_us_per_msg']:>9.0f}us"
        )
    paced = results[f"paced {args.rate:g}/s"]
    verdict = "meets" if paced["p99_ms"] <= 10 else "misses"
    print(f"\npaced p99 {paced['p99_ms']:.2f} ms {verdict} the 10 ms target")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_consume":
        asyncio.run(consume(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])))
    else:
        main()
