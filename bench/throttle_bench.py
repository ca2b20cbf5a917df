"""What rate limiting costs per request, and how fast a wake-up crosses between gateways.

Run: ``python bench/throttle_bench.py [--duration 3] [--rounds 3] [--connections 16] [--messages 300]``
(needs ``redis-server`` on PATH; it starts a private one on a free port).

Part 1, overhead per request. Five ``pushgate serve`` processes run side by side for the
whole run, and the phases alternate between them, so a neighbour's burst of CPU hits all
alike; figures are ratios to the unthrottled gateway of the same round:

- ``none``: no limits set (the limiter is not called: a cached "no limits" lookup);
- ``memory swc`` / ``memory mw``: ``memory://``, sliding window counter / moving window;
- ``redis swc`` / ``redis mw``: ``--redis`` to the private Redis, the same two strategies.

Throttled gateways get limits no request reaches (10^6/second) on three counters per
request (tenant, per key, per queue), so every request pays three hits and three window
reads but none is refused. Two request kinds: ``poll`` (``receive`` of an empty queue with
``wait_s: 0``: no fsync, so the limiter's share shows) and ``send`` (1 KiB, fsynced).

Part 0, the limiter alone: microseconds per ``Limiter.check`` in this process (no HTTP),
one call at a time, with 1 and 3 rules, for each storage and strategy. With Redis this is
mostly the round trip (and, on a loaded machine, waiting for the Redis process to run).

Part 2, send-to-push latency: two gateways on one data directory sharing the Redis; a
WebSocket consumer on A or on B, a producer sending through A over HTTP one message at a
time (the next after the previous is pushed). Same-gateway: the commit's own wake-up
(a standing receive); cross-gateway: Redis pub/sub to B, then B's receive.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, cast

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from a checkout

from bench.push_common import REPO, free_port, machine, serve

GATEWAYS = ("none", "memory swc", "memory mw", "redis swc", "redis mw")
HIGH = "1000000/second"
_HEAD_END = b"\r\n\r\n"
_LENGTH = re.compile(rb"content-length:\s*(\d+)", re.I)


# Processes ---------------------------------------------------------------------------


def start_redis(directory: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(directory), "--save", "",
         "--appendonly", "no", "--loglevel", "warning"],
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


# The load generator (its own process) -------------------------------------------------


class Load:
    def __init__(self, host: str, token: str, mode: str, duration: float) -> None:
        path, body = (
            ("/v1/queues/bench/messages", json.dumps({"body": "x" * 1024}).encode())
            if mode == "send"
            else ("/v1/queues/empty/receive", b'{"max": 1, "wait_s": 0}')
        )
        self.request = (
            f"POST {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode() + body
        self.stop_at = time.perf_counter() + duration
        self.latencies: list[float] = []
        self.errors = 0


class LoadConnection(asyncio.Protocol):
    """One keep-alive connection sending requests back to back (lighter than httpx)."""

    def __init__(self, load: Load) -> None:
        self.load = load
        self.buffer = bytearray()
        self.started = 0.0
        self.transport: asyncio.Transport | None = None
        self.closed = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.next()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)

    def next(self) -> None:
        assert self.transport is not None
        if time.perf_counter() >= self.load.stop_at:
            self.transport.close()
            return
        self.started = time.perf_counter()
        self.transport.write(self.load.request)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while (end := self.buffer.find(_HEAD_END)) >= 0:
            match = _LENGTH.search(self.buffer, 0, end)
            length = int(match.group(1)) if match else 0
            if len(self.buffer) < end + 4 + length:
                return
            status = int(self.buffer[9:12])
            del self.buffer[: end + 4 + length]
            self.load.latencies.append(time.perf_counter() - self.started)
            if status not in (200, 201):
                self.load.errors += 1
            self.next()


async def run_load(url: str, token: str, mode: str, duration: float, connections: int) -> dict[str, Any]:
    host, port = url.split("//", 1)[1].split(":")
    load = Load(f"{host}:{port}", token, mode, duration)
    loop = asyncio.get_running_loop()
    start = time.perf_counter()
    conns = [
        (await loop.create_connection(lambda: LoadConnection(load), host, int(port)))[1]
        for _ in range(connections)
    ]
    await asyncio.gather(*(c.closed for c in conns))
    elapsed = time.perf_counter() - start
    lat = sorted(load.latencies)
    return {
        "req_per_s": len(lat) / elapsed,
        "p50_ms": lat[len(lat) // 2] * 1000 if lat else float("nan"),
        "p99_ms": lat[min(len(lat) - 1, int(0.99 * len(lat)))] * 1000 if lat else float("nan"),
        "errors": load.errors,
    }


def load(url: str, token: str, mode: str, duration: float, connections: int) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, "_load", url, token, mode, str(duration), str(connections)],
        check=True,
        stdout=subprocess.PIPE,
        text=True,
        timeout=duration + 60,
    ).stdout
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


# Part 2: send-to-push latency -------------------------------------------------------


async def push_latency(producer_url: str, consumer_url: str, key: str, queue: str, count: int) -> list[float]:
    from websockets.asyncio.client import connect
    from websockets.typing import Subprotocol

    headers = {"Authorization": f"Bearer {key}"}
    latencies: list[float] = []
    async with (
        httpx.AsyncClient(base_url=producer_url, headers=headers) as http,
        connect(
            consumer_url.replace("http", "ws", 1) + "/v1/ws",
            subprotocols=[Subprotocol("pushgate.v1")],
            additional_headers=headers,
            compression=None,
        ) as ws,
    ):
        (await http.put(f"/v1/queues/{queue}", json={})).raise_for_status()
        await ws.send(json.dumps({"op": "subscribe", "id": 1, "queue": queue, "prefetch": 10}))
        assert json.loads(await ws.recv())["op"] == "ok"
        for i in range(count + 20):
            start = time.perf_counter()
            (await http.post(f"/v1/queues/{queue}/messages", json={"body": str(i)})).raise_for_status()
            while True:
                frame = json.loads(await ws.recv())
                if frame["op"] == "message":
                    break
            if i >= 20:  # warm-up
                latencies.append((time.perf_counter() - start) * 1000)
            await ws.send(json.dumps({"op": "ack", "receipts": [frame["message"]["receipt"]]}))
    return latencies


async def limiter_cost(url: str, strategy: str, rules: int, calls: int) -> float:
    """Microseconds per check, one call at a time."""
    sys.path.insert(0, str(REPO))
    from throttling import Rule, SharedState, parse_rate

    state = SharedState(url, strategy=strategy)  # type: ignore[arg-type]
    await state.start()
    try:
        rate = parse_rate(HIGH)
        unique = os.urandom(4).hex()
        batch = [Rule(f"r{n}", rate, (unique, str(n))) for n in range(rules)]
        for _ in range(50):
            await state.limiter.check(batch)
        start = time.perf_counter()
        for _ in range(calls):
            await state.limiter.check(batch)
        return (time.perf_counter() - start) / calls * 1e6
    finally:
        await state.close()


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# The driver ---------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per phase")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--messages", type=int, default=300, help="messages per latency series")
    args = parser.parse_args()
    procs: list[subprocess.Popen[Any]] = []
    with tempfile.TemporaryDirectory(prefix="pushgate-throttle-bench-") as tmp_name:
        tmp = Path(tmp_name)
        try:
            redis, redis_url = start_redis(tmp)
            procs.append(redis)
            urls: dict[str, str] = {}
            for name in GATEWAYS:
                extra = ["--redis", redis_url] if name.startswith("redis") else []
                strategy = "moving-window" if name.endswith("mw") else "sliding-window-counter"
                proc, url = serve(
                    tmp / name.replace(" ", "-"), *extra, env={"PUSHGATE_RATE_LIMIT_STRATEGY": strategy}
                )
                procs.append(proc)
                urls[name] = url
            keys = {
                name: (tmp / name.replace(" ", "-") / "bootstrap-admin-key").read_text().strip()
                for name in GATEWAYS
            }
            for name, url in urls.items():
                headers = {"Authorization": f"Bearer {keys[name]}"}
                for queue in ("bench", "empty"):
                    httpx.put(f"{url}/v1/queues/{queue}", headers=headers, json={}).raise_for_status()
                if name != "none":
                    limits = {"send": HIGH, "receive": HIGH, "per_key": {"send": HIGH, "receive": HIGH}}
                    limits["per_queue"] = {"send": HIGH, "receive": HIGH}
                    httpx.put(f"{url}/v1/limits", headers=headers, json=limits).raise_for_status()
            micro: dict[tuple[str, str, int], float] = {}
            for storage, url in (("memory", "memory://"), ("redis", redis_url)):
                for strategy in ("sliding-window-counter", "moving-window"):
                    for rules in (1, 3):
                        calls = 3000 if storage == "memory" else 1000
                        micro[(storage, strategy, rules)] = asyncio.run(
                            limiter_cost(url, strategy, rules, calls)
                        )
            runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
            for _ in range(args.rounds):
                for mode in ("poll", "send"):
                    for name in GATEWAYS:
                        result = load(urls[name], keys[name], mode, args.duration, args.connections)
                        runs.setdefault((mode, name), []).append(result)

            # Part 2: two gateways on one data directory, sharing the Redis.
            shared = tmp / "shared"
            a_proc, a_url = serve(shared, "--redis", redis_url)
            procs.append(a_proc)
            b_proc, b_url = serve(shared, "--redis", redis_url)
            procs.append(b_proc)
            key = (shared / "bootstrap-admin-key").read_text().strip()
            same = asyncio.run(push_latency(a_url, a_url, key, "same", args.messages))
            cross = asyncio.run(push_latency(a_url, b_url, key, "cross", args.messages))
        finally:
            for proc in reversed(procs):
                proc.terminate()
                proc.wait()

    print(f"\n{machine()}")
    print("Part 0: the limiter alone, microseconds per check (one at a time, in process)")
    for (storage, strategy, rules), us in micro.items():
        print(f"{storage:<6} {strategy:<22} {rules} rule{'s' if rules > 1 else ' '}  {us:8.1f} us")
    print(
        f"\nPart 1: {args.connections} connections, {args.rounds} rounds of {args.duration:g} s per gateway and kind;"
    )
    print("medians; ratio = requests/s against the unthrottled gateway in the same round\n")
    for mode in ("poll", "send"):
        for name in GATEWAYS:
            rs = runs[(mode, name)]
            ratios = [r["req_per_s"] / b["req_per_s"] for r, b in zip(rs, runs[(mode, "none")], strict=True)]
            print(
                f"{mode:<5} {name:<11} {statistics.median(r['req_per_s'] for r in rs):>8,.0f} req/s  "
                f"p50 {statistics.median(r['p50_ms'] for r in rs):6.2f} ms  "
                f"p99 {statistics.median(r['p99_ms'] for r in rs):6.2f} ms  "
                f"ratio {statistics.median(ratios):6.1%}  errors {sum(r['errors'] for r in rs)}"
            )
    print(f"\nPart 2: send through A (HTTP) to push (WebSocket), {args.messages} messages one at a time")
    for name, values in (("same gateway (A -> A)", same), ("cross gateway (A -> B)", cross)):
        print(f"{name:<24} p50 {pct(values, 0.5):6.2f} ms  p99 {pct(values, 0.99):6.2f} ms")
    print(f"cross / same, p50: {pct(cross, 0.5) / pct(same, 0.5):.2f}x")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_load":
        try:
            import uvloop

            uvloop.install()
        except ImportError:
            pass
        url, token, mode, duration, connections = sys.argv[2:7]
        print(json.dumps(asyncio.run(run_load(url, token, mode, float(duration), int(connections)))))
    else:
        main()
