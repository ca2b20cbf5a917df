"""One message at a time: how long a message takes from an HTTP send to its WebSocket push.

Run: ``python bench/push_latency.py [--messages 300] [--rounds 3] [--producer http|ws]``
(needs ``redis-server`` on PATH for the second gateway; ``--one`` measures one gateway only).

The latency floor, with nothing else going on: two ``pushgate serve`` processes on one data
directory share a private Redis (no persistence: it only carries wake-ups); a consumer
subscribes over WebSocket to gateway A (*one gateway*: the commit's own wake-up, a standing
receive served in the send's commit) or to gateway B (*two gateways*: A publishes the
wake-up to Redis, B receives from the store and pushes); a producer in this process sends
through A one message at a time, the next once the previous was pushed and acked, and takes
the time from just before the request is written to the push frame read. The producer is a
raw HTTP/1.1 client on a keep-alive connection (``--producer ws``: ``send`` frames on a
WebSocket to A), so little of the figure is the client's own time.

Rounds alternate one gateway and two gateways; the first ``--warmup`` messages of each series
are left out. Prints p50/p99/max per round and the ranges over the rounds, the gateways' CPU
per message (both processes: the send, the push, the ack), and the load average, since the
figures move with whatever else the machine runs.

Targets (issue 25): one gateway p50 <= 1.5 ms; two gateways at most 0.5 ms more.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
from websockets.asyncio.client import ClientConnection, connect
from websockets.typing import Subprotocol

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.push_common import cpu_seconds, create_queue, free_port, machine, percentiles, serve, stop


def start_redis(directory: Path) -> tuple[subprocess.Popen[bytes], str]:
    """A private ``redis-server`` without persistence (it carries wake-ups only)."""
    port = free_port()
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(directory), "--save", "",
         "--appendonly", "no", "--loglevel", "warning", "--protected-mode", "no"],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        ok = subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True, text=True)
        if ok.stdout.strip() == "PONG":
            return proc, f"redis://127.0.0.1:{port}"
        time.sleep(0.05)
    proc.kill()
    raise SystemExit("redis-server did not start")


def open_ws(url: str, key: str) -> connect:
    return connect(
        url.replace("http", "ws", 1) + "/v1/ws",
        subprotocols=[Subprotocol("pushgate.v1")],
        additional_headers={"Authorization": f"Bearer {key}"},
        compression=None,
    )


class HttpSender:
    """``POST /v1/queues/{q}/messages`` on one keep-alive connection, raw HTTP/1.1."""

    def __init__(self, url: str, key: str, queue: str) -> None:
        self._host, port = url.split("//", 1)[1].rsplit(":", 1)
        self._port = int(port)
        self._head = (
            f"POST /v1/queues/{queue}/messages HTTP/1.1\r\nHost: {self._host}\r\n"
            f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
        ).encode()
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def open(self) -> None:
        self._reader, self._writer = await asyncio.open_connection(self._host, self._port)

    def send(self, body: str) -> None:
        assert self._writer is not None
        payload = orjson.dumps({"body": body})
        self._writer.write(self._head + b"Content-Length: %d\r\n\r\n%s" % (len(payload), payload))

    async def reply(self) -> None:
        assert self._reader is not None
        head = await self._reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 201"):
            raise SystemExit(head.decode(errors="replace"))
        length = int(head.lower().split(b"content-length:", 1)[1].split(b"\r\n", 1)[0])
        await self._reader.readexactly(length)

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


class WsSender:
    """``send`` frames on a WebSocket."""

    def __init__(self, url: str, key: str, queue: str) -> None:
        self._url, self._key, self._queue = url, key, queue
        self._ws: ClientConnection | None = None
        self._cm: Any = None
        self._id = 0

    async def open(self) -> None:
        self._cm = open_ws(self._url, self._key)
        self._ws = await self._cm.__aenter__()

    def send(self, body: str) -> None:
        assert self._ws is not None
        self._id += 1
        frame = orjson.dumps({"op": "send", "queue": self._queue, "body": body, "id": self._id}).decode()
        # websockets' send is a coroutine only for flow control; the frame is written at once.
        self._pending = asyncio.ensure_future(self._ws.send(frame))

    async def reply(self) -> None:
        assert self._ws is not None
        await self._pending
        reply = orjson.loads(await self._ws.recv())
        if reply.get("op") != "ok":
            raise SystemExit(f"send failed: {reply}")

    async def close(self) -> None:
        if self._cm is not None:
            await self._cm.__aexit__(None, None, None)


async def series(
    producer_url: str,
    consumer_url: str,
    key: str,
    queue: str,
    count: int,
    warmup: int,
    producer: str,
    gap_s: float,
) -> list[float]:
    """Send ``warmup + count`` messages one at a time; the send -> push times of the last
    ``count``, in milliseconds."""
    sender: HttpSender | WsSender = (HttpSender if producer == "http" else WsSender)(producer_url, key, queue)
    await sender.open()
    latencies: list[float] = []
    try:
        async with open_ws(consumer_url, key) as ws:
            await ws.send(orjson.dumps({"op": "subscribe", "id": 1, "queue": queue, "prefetch": 10}).decode())
            assert orjson.loads(await ws.recv())["op"] == "ok"
            for i in range(warmup + count):
                start = time.perf_counter()
                sender.send(str(i))
                while True:
                    frame = orjson.loads(await ws.recv())
                    if frame["op"] == "message":
                        break
                pushed = time.perf_counter()
                await sender.reply()
                if i >= warmup:
                    latencies.append((pushed - start) * 1e3)
                await ws.send(orjson.dumps({"op": "ack", "receipts": [frame["message"]["receipt"]]}).decode())
                if gap_s:
                    # Let the ack's commit end before the next send, so each message meets an
                    # idle gateway (the next send would otherwise share or wait for that commit).
                    await asyncio.sleep(gap_s)
    finally:
        await sender.close()
    return latencies


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=300, help="messages per series")
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--producer", choices=["http", "ws"], default="http")
    parser.add_argument(
        "--gap-ms", type=float, default=2.0, help="pause after each ack (0: the next send at once)"
    )
    parser.add_argument(
        "--dir",
        default=None,
        help="where the store goes (default: the system temp dir); on a tmpfs fsync costs "
        "nothing, which leaves the code path alone in the figures",
    )
    parser.add_argument("--one", action="store_true", help="one gateway only (no Redis)")
    parser.add_argument(
        "--json", help="also write each round's p50s to this file (peer_compare.py --targets)"
    )
    args = parser.parse_args()
    print(machine())
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    cases = ["one gateway"] if args.one else ["one gateway", "two gateways"]
    results: dict[str, list[tuple[float, float, float]]] = {case: [] for case in cases}
    cpu: dict[str, list[float]] = {case: [] for case in cases}
    procs: list[subprocess.Popen[Any]] = []
    with tempfile.TemporaryDirectory(prefix="pushgate-latency-", dir=args.dir) as tmp_name:
        tmp = Path(tmp_name)
        data = tmp / "data"
        try:
            extra: list[str] = []
            if not args.one:
                redis, redis_url = start_redis(tmp)
                procs.append(redis)
                extra = ["--redis", redis_url]
            a_proc, a_url = serve(data, *extra)
            procs.append(a_proc)
            urls = {"one gateway": a_url}
            pids = [a_proc.pid]
            if not args.one:
                b_proc, b_url = serve(data, *extra)
                procs.append(b_proc)
                urls["two gateways"] = b_url
                pids.append(b_proc.pid)
            key = (data / "bootstrap-admin-key").read_text().strip()
            for round_no in range(args.rounds):
                for case in cases:
                    queue = f"latency-{case.split()[0]}-{round_no}"
                    create_queue(a_url, key, queue)
                    before = sum(cpu_seconds(pid) for pid in pids)
                    values = asyncio.run(
                        series(
                            a_url,
                            urls[case],
                            key,
                            queue,
                            args.messages,
                            args.warmup,
                            args.producer,
                            args.gap_ms / 1e3,
                        )
                    )
                    spent = sum(cpu_seconds(pid) for pid in pids) - before
                    cpu[case].append(spent / (args.messages + args.warmup) * 1e6)
                    p50, p99 = percentiles(values)
                    results[case].append((p50, p99, max(values)))
        finally:
            for proc in reversed(procs):
                stop(proc)
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(
        f"\nsend ({args.producer}, through A) -> WebSocket push, one message at a time, "
        f"{args.messages} per series after {args.warmup} warm-up, {args.rounds} rounds\n"
    )
    print(f"{'case':<14} {'round':>5} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'gw CPU/msg':>11}")
    for case in cases:
        for round_no, (p50, p99, top) in enumerate(results[case], 1):
            print(
                f"{case:<14} {round_no:>5} {p50:>8.2f} {p99:>8.2f} {top:>8.2f} {cpu[case][round_no - 1]:>9.0f}us"
            )
    print()
    for case in cases:
        p50s = [r[0] for r in results[case]]
        p99s = [r[1] for r in results[case]]
        print(
            f"{case:<14} p50 {min(p50s):.2f}-{max(p50s):.2f} ms (median {statistics.median(p50s):.2f}), "
            f"p99 {min(p99s):.2f}-{max(p99s):.2f} ms"
        )
    if not args.one:
        extra_ms = [b[0] - a[0] for a, b in zip(results["one gateway"], results["two gateways"], strict=True)]
        print(
            f"two gateways - one gateway, p50: {min(extra_ms):+.2f} to {max(extra_ms):+.2f} ms "
            f"(median {statistics.median(extra_ms):+.2f}); target: at most +0.50 ms"
        )
    one = statistics.median(r[0] for r in results["one gateway"])
    print(f"one gateway p50 median {one:.2f} ms; target: at most 1.50 ms")
    if args.json:
        figures = {"one_p50_ms": [r[0] for r in results["one gateway"]]}
        if not args.one:
            figures["extra_p50_ms"] = extra_ms
        Path(args.json).write_bytes(orjson.dumps(figures))


if __name__ == "__main__":
    main()
