"""Slow consumers must not starve healthy ones (issue: delivery hardening, defect 2).

1,000 WebSocket consumers subscribe (prefetch 10, visibility 5 s) and then stop reading;
one healthy consumer acks everything it gets; producers send 1 KiB messages at ~400/s
for 20 s over HTTP. Prints the healthy consumer's share of what was sent 1 s and 10 s
after the producers stop, the stalled consumers' close codes and the gateway's RSS.

    python bench/slow_consumers.py [--stalled 1000] [--rate 400] [--seconds 20]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import socket
import sys
import tempfile
import time
from pathlib import Path

import httpx
import orjson
from websockets.asyncio.client import connect
from websockets.client import ClientProtocol
from websockets.typing import Subprotocol
from websockets.uri import parse_uri

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from a checkout

from bench.push_common import create_queue, machine, rss_kib, start_gateway, stop

QUEUE = "slow-bench"
BODY = "x" * 1024


class Stalled:
    """A consumer that subscribes, then never reads again (websockets' sans-I/O protocol on a
    raw socket with a small receive buffer, so nothing reads on its behalf)."""

    def __init__(self, sock: socket.socket, protocol: ClientProtocol) -> None:
        self.sock, self.protocol = sock, protocol

    @classmethod
    async def open(cls, ws_url: str, port: int, key: str) -> Stalled:
        loop = asyncio.get_running_loop()
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
        sock.setblocking(False)
        await loop.sock_connect(sock, ("127.0.0.1", port))
        protocol = ClientProtocol(parse_uri(ws_url), subprotocols=[Subprotocol("pushgate.v1")], max_size=None)
        request = protocol.connect()
        request.headers["Authorization"] = f"Bearer {key}"
        protocol.send_request(request)
        for data in protocol.data_to_send():
            await loop.sock_sendall(sock, data)
        while not protocol.events_received():
            protocol.receive_data(await loop.sock_recv(sock, 65536))
        protocol.send_text(orjson.dumps({"op": "subscribe", "queue": QUEUE, "prefetch": 10}))
        for data in protocol.data_to_send():
            await loop.sock_sendall(sock, data)
        return cls(sock, protocol)

    async def close_code(self) -> int | None:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(5):
                while self.protocol.close_rcvd is None:
                    data = await loop.sock_recv(self.sock, 1 << 20)
                    if not data:
                        break
                    self.protocol.receive_data(data)
                    self.protocol.events_received()
        except TimeoutError:
            pass
        self.sock.close()
        return None if self.protocol.close_rcvd is None else self.protocol.close_rcvd.code


async def healthy(ws_url: str, key: str, got: list[float], ready: asyncio.Event) -> None:
    async with connect(
        ws_url,
        subprotocols=[Subprotocol("pushgate.v1")],
        additional_headers={"Authorization": f"Bearer {key}"},
    ) as ws:
        await ws.send(orjson.dumps({"op": "subscribe", "queue": QUEUE, "prefetch": 10, "id": 1}).decode())
        ready.set()
        async for raw in ws:
            frame = orjson.loads(raw)
            if frame["op"] == "message":
                got.append(time.monotonic())
                await ws.send(orjson.dumps({"op": "ack", "receipts": [frame["message"]["receipt"]]}).decode())


async def produce(url: str, key: str, rate: int, seconds: float) -> int:
    sent = 0
    batch = max(1, rate // 20)
    async with httpx.AsyncClient(
        base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=30
    ) as client:
        start = time.monotonic()
        while time.monotonic() - start < seconds:
            tick = time.monotonic()
            r = await client.post(f"/v1/queues/{QUEUE}/messages", json={"messages": [{"body": BODY}] * batch})
            r.raise_for_status()
            sent += batch
            await asyncio.sleep(max(0.0, batch / rate - (time.monotonic() - tick)))
    return sent


async def run(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="pushgate-slow-") as data:
        proc, url, key = start_gateway(Path(data))
        try:
            create_queue(url, key, QUEUE, visibility_timeout_s=5)
            port = int(url.rsplit(":", 1)[1])
            ws_url = url.replace("http", "ws", 1) + "/v1/ws"
            rss_idle = rss_kib(proc.pid)
            stalled = [await Stalled.open(ws_url, port, key) for _ in range(args.stalled)]
            rss_connected = rss_kib(proc.pid)
            got: list[float] = []
            ready = asyncio.Event()
            consumer = asyncio.create_task(healthy(ws_url, key, got, ready))
            await ready.wait()
            sent = await produce(url, key, args.rate, args.seconds)
            stopped = time.monotonic()
            rss_peak = rss_kib(proc.pid)
            await asyncio.sleep(1)
            at_1s = sum(1 for t in got if t <= stopped + 1)
            await asyncio.sleep(9)
            at_10s = sum(1 for t in got if t <= stopped + 10)
            consumer.cancel()
            codes = collections.Counter([await s.close_code() for s in stalled])
        finally:
            stop(proc)
    print(machine())
    print(
        f"{args.stalled} stalled consumers, 1 healthy; {sent} x 1 KiB sent at ~{args.rate}/s for {args.seconds:g} s"
    )
    print(f"healthy consumer's share 1 s after the producers stopped:  {at_1s}/{sent} ({at_1s / sent:.1%})")
    print(f"healthy consumer's share 10 s after the producers stopped: {at_10s}/{sent} ({at_10s / sent:.1%})")
    print(f"stalled consumers' close codes: {dict(codes)}")
    print(
        f"gateway RSS: {rss_idle} KiB idle, {rss_connected} KiB with the consumers, {rss_peak} KiB at the end of the run"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stalled", type=int, default=1000)
    parser.add_argument("--rate", type=int, default=400)
    parser.add_argument("--seconds", type=float, default=20)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
