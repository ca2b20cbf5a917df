"""What rate limiting costs per request, and how fast a wake-up crosses between gateways.

Run: ``python bench/throttle_bench.py [--duration 3] [--rounds 3] [--connections 16] [--messages 300]``
(needs ``redis-server`` on PATH; it starts a private one on a free port).

Every figure comes from ``--rounds`` rounds and is printed as a range (lowest-highest) with
its median; CPU time (read from ``/proc``) is the figure to quote on a shared machine,
wall-clock throughput moves with whatever else runs there.

Part 0, the limiter alone: CPU microseconds per ``Limiter.check`` in this process (no HTTP),
one call at a time, with 1 and 3 rules, memory and Redis: the default sliding window
counter (this package's own code; on Redis through local shares), the moving window
(``limits``' public API) and, for reference, ``limits``' own sliding window counter through
its public strategy API (what the default would cost without our code). Redis rows also
give the ``redis-server`` process's CPU per check (it shares the machine's cores).

Part 1, overhead per request. Seven ``pushgate serve`` processes run side by side for the
whole run, and the phases alternate between them, so a neighbour's burst of CPU hits all
alike; figures are ratios to the unthrottled gateway of the same round and shared state:

- ``none``: no limits set (the limiter is not called: a cached "no limits" lookup);
- ``control none``: a second gateway with no limits, compared with the first as the others
  are: the noise floor of every ratio (two identical processes differ by this much);
- ``memory swc`` / ``memory mw``: ``memory://``, sliding window counter / moving window;
- ``redis none``: ``--redis`` to the private Redis, no limits: the baseline of the Redis rows
  (a Redis gateway publishes its wake-ups there and keeps the dedupe front there, limits or not);
- ``redis swc`` / ``redis mw``: ``--redis``, with limits, the same two strategies;
- ``none +limits`` / ``redis none +limits``: the two unthrottled gateways themselves, with
  the limits set for this phase and removed after it (``PUT /v1/limits``), so the ratio
  compares one process with itself: the figure to read for the sliding window counter's
  cost, since two identical processes differ by up to 10% (``control none``).

Throttled gateways get limits no request reaches (10^6/second) on three counters per
request (tenant, per key, per queue), so every request pays three hits and three window
reads but none is refused. Two request kinds: ``poll`` (``receive`` of an empty queue with
``wait_s: 0``: no fsync, so the limiter's share shows) and ``send`` (1 KiB, fsynced).
Two ratios: ``cpu``, the unthrottled gateway's CPU per request over this one's (what its
rate would be if the gateway's core were the limit), and ``req/s``, throughput against
throughput (wall clock: noisy on a shared machine).

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
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, cast

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from a checkout

from bench.push_common import REPO, cpu_seconds, free_port, machine, serve

HIGH = "1000000/second"
GATEWAYS = (
    "none",
    "control none",
    "none +limits",
    "memory swc",
    "memory mw",
    "redis none",
    "redis none +limits",
    "redis swc",
    "redis mw",
)
# Phases run on another gateway's process with the limits set for their length.
TOGGLED = {"none +limits": "none", "redis none +limits": "redis none"}
LIMITS: dict[str, Any] = {"send": HIGH, "receive": HIGH, "per_key": {"send": HIGH, "receive": HIGH}}
LIMITS["per_queue"] = {"send": HIGH, "receive": HIGH}
NO_LIMITS: dict[str, Any] = {"send": None, "receive": None, "per_key": {"send": None, "receive": None}}
NO_LIMITS["per_queue"] = {"send": None, "receive": None}


def baseline(name: str) -> str:
    """The unthrottled gateway a gateway is compared with: the same shared state, no limits
    (a Redis gateway also publishes wake-ups and keeps a dedupe front there, limits or not)."""
    return "redis none" if name.startswith("redis") else "none"


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
        "requests": len(lat),
        "req_per_s": len(lat) / elapsed,
        "p50_ms": lat[len(lat) // 2] * 1000 if lat else float("nan"),
        "p99_ms": lat[min(len(lat) - 1, int(0.99 * len(lat)))] * 1000 if lat else float("nan"),
        "errors": load.errors,
    }


def load(
    url: str, token: str, mode: str, duration: float, connections: int, pids: tuple[int, ...]
) -> dict[str, Any]:
    """One phase from a load process; adds the CPU per request of each of ``pids`` (the
    gateway, and Redis when it has one) as ``cpu_us`` (a list, in that order)."""
    before = [cpu_seconds(pid) for pid in pids]
    out = subprocess.run(
        [sys.executable, __file__, "_load", url, token, mode, str(duration), str(connections)],
        check=True,
        stdout=subprocess.PIPE,
        text=True,
        timeout=duration + 60,
    ).stdout
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    requests = max(1, result["requests"])
    result["cpu_us"] = [(cpu_seconds(pid) - b) / requests * 1e6 for pid, b in zip(pids, before, strict=True)]
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


LIMITER_KINDS = ("ours", "ours, windows read", "moving window", "limits swc")


async def limiter_cost(
    url: str, kind: str, rules: int, calls: int, redis_pid: int | None
) -> tuple[float, float]:
    """CPU microseconds per check, one call at a time: this process's, and Redis's (0 in memory).

    ``ours``: the default strategy, a check as a WebSocket frame makes it (its windows are
    built only when read); ``ours, windows read``: the same and the decision's windows read,
    as an HTTP request does for its header fields; ``moving window``: the other strategy;
    ``limits swc``: ``limits``' sliding window counter through its public strategy API, for
    reference. The rules are one tuple, as the gateway's enforcer keeps them per kind of
    request (the limiter remembers a tuple's counters).
    """
    sys.path.insert(0, str(REPO))
    from throttling import Rule, SharedState, parse_rate

    rate = parse_rate(HIGH)
    unique = os.urandom(4).hex()
    batch = tuple(Rule(f"r{n}", rate, (unique, str(n))) for n in range(rules))
    if kind == "limits swc":
        check, close = limits_swc(url, batch)
    else:
        state = SharedState(
            url, strategy="moving-window" if kind == "moving window" else "sliding-window-counter"
        )
        await state.start()

        if kind == "ours, windows read":

            async def check() -> None:
                assert (await state.limiter.check(batch)).windows

        else:

            async def check() -> None:
                await state.limiter.check(batch)

        close = state.close
    try:
        for _ in range(min(calls, 2000)):
            await check()
        redis_before = cpu_seconds(redis_pid) if redis_pid else 0.0
        start = time.process_time()
        for _ in range(calls):
            await check()
        ours = (time.process_time() - start) / calls * 1e6
        theirs = (cpu_seconds(redis_pid) - redis_before) / calls * 1e6 if redis_pid else 0.0
        return ours, theirs
    finally:
        await close()


def limits_swc(
    url: str, batch: Sequence[Any]
) -> tuple[Callable[[], Awaitable[None]], Callable[[], Awaitable[None]]]:
    """A check as ``limits``' public API offers it: a hit and a window read per rule."""
    import redis.asyncio as aioredis
    from limits.aio.storage import MemoryStorage, RedisStorage, Storage
    from limits.aio.strategies import SlidingWindowCounterRateLimiter

    pool = None
    storage: Storage
    if url.startswith("memory"):
        storage = MemoryStorage()
    else:
        pool = aioredis.ConnectionPool.from_url(url)
        storage = RedisStorage("async+" + url, implementation="redispy", connection_pool=pool)  # type: ignore[arg-type]  # limits types options as scalars
    limiter = SlidingWindowCounterRateLimiter(storage)

    async def check() -> None:
        for rule in batch:
            for item in rule.rate.items:
                await limiter.hit(item, *rule.identifiers)
                await limiter.get_window_stats(item, *rule.identifiers)

    async def close() -> None:
        if pool is not None:
            await pool.aclose()

    return check, close


def spread(values: list[float], unit: str = "", digits: int = 1) -> str:
    """``low-high (median)`` of a round's figures."""
    low, high, mid = min(values), max(values), statistics.median(values)
    return f"{low:.{digits}f}-{high:.{digits}f}{unit} (median {mid:.{digits}f})"


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
    parser.add_argument("--parts", default="0,1,2", help="which parts to run (comma-separated)")
    parser.add_argument(
        "--json", help="also write the figures behind the targets to this file (peer_compare.py --targets)"
    )
    args = parser.parse_args()
    parts = {int(p) for p in args.parts.split(",")}
    procs: list[subprocess.Popen[Any]] = []
    micro: dict[tuple[str, str, int], list[tuple[float, float]]] = {}
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    same: list[float] = []
    cross: list[float] = []
    with tempfile.TemporaryDirectory(prefix="pushgate-throttle-bench-") as tmp_name:
        tmp = Path(tmp_name)
        try:
            redis, redis_url = start_redis(tmp)
            procs.append(redis)
            if 0 in parts:
                for _ in range(args.rounds):
                    for storage, url in (("memory", "memory://"), ("redis", redis_url)):
                        for kind in LIMITER_KINDS:
                            for rules in (1, 3):
                                calls = (
                                    20_000
                                    if kind.startswith("ours")
                                    else 1_000
                                    if storage == "redis"
                                    else 3_000
                                )
                                pid = redis.pid if storage == "redis" else None
                                cost = asyncio.run(limiter_cost(url, kind, rules, calls, pid))
                                micro.setdefault((storage, kind, rules), []).append(cost)
            if 1 in parts:
                runs = gateway_overhead(tmp, redis.pid, redis_url, args, procs)
            if 2 in parts:
                # Two gateways on one data directory, sharing the Redis.
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
    if micro:
        print(
            f"\nPart 0: the limiter alone, CPU microseconds per check, {args.rounds} rounds: low-high (median)"
        )
        for (storage, kind, rules), costs in micro.items():
            label = {
                "ours": "sliding window counter (default)",
                "ours, windows read": "sliding window counter, windows read (HTTP)",
                "moving window": "moving window (limits)",
            }.get(kind, "limits' sliding window counter, public API (reference)")
            line = f"{storage:<6} {label:<56} {rules} rule{'s' if rules > 1 else ' '}  {spread([c[0] for c in costs], ' us')}"
            if storage == "redis":
                line += f"   redis-server {spread([c[1] for c in costs], ' us')}"
            print(line)
    if runs:
        print(
            f"\nPart 1: {args.connections} connections, {args.rounds} rounds of {args.duration:g} s per gateway and kind;"
            " ratios to the unthrottled gateway of the same round, low-high (median)."
        )
        print("cpu: its CPU per request over the unthrottled one's; req/s: throughput (wall clock, noisy)\n")
        for mode in ("poll", "send"):
            for name in GATEWAYS:
                rs, base = runs[(mode, name)], runs[(mode, baseline(name))]
                cpu_ratios = [b["cpu_us"][0] / r["cpu_us"][0] for r, b in zip(rs, base, strict=True)]
                rate_ratios = [r["req_per_s"] / b["req_per_s"] for r, b in zip(rs, base, strict=True)]
                line = (
                    f"{mode:<5} {name:<18} gateway CPU {statistics.median(r['cpu_us'][0] for r in rs):6.0f} us/req"
                    f"  {statistics.median(r['req_per_s'] for r in rs):>7,.0f} req/s"
                    f"  p50 {statistics.median(r['p50_ms'] for r in rs):5.1f} ms"
                    f"  cpu ratio {spread([100 * x for x in cpu_ratios], '%', 0)}"
                    f"  req/s ratio {spread([100 * x for x in rate_ratios], '%', 0)}"
                )
                if name.startswith("redis"):
                    line += f"  redis-server {statistics.median(r['cpu_us'][1] for r in rs):.1f} us/req"
                errors = sum(r["errors"] for r in rs)
                print(line + (f"  errors {errors}" if errors else ""))
    if args.json:
        # Each round's: a three-rule check's CPU (the default strategy, as a WebSocket frame
        # makes it), and each request kind's CPU ratio of a gateway to itself without limits.
        figures = {
            "check_3_rules_us": {
                storage: [c[0] for c in micro.get((storage, "ours", 3), [])]
                for storage in ("memory", "redis")
            },
            "cpu_ratio": {
                f"{mode} {name}": [
                    b["cpu_us"][0] / r["cpu_us"][0]
                    for r, b in zip(runs[(mode, name)], runs[(mode, baseline(name))], strict=True)
                ]
                for mode in ("poll", "send")
                for name in TOGGLED
                if (mode, name) in runs
            },
        }
        Path(args.json).write_text(json.dumps(figures))
    if same:
        print(f"\nPart 2: send through A (HTTP) to push (WebSocket), {args.messages} messages one at a time")
        for name, values in (("same gateway (A -> A)", same), ("cross gateway (A -> B)", cross)):
            print(f"{name:<24} p50 {pct(values, 0.5):6.2f} ms  p99 {pct(values, 0.99):6.2f} ms")
        print(f"cross / same, p50: {pct(cross, 0.5) / pct(same, 0.5):.2f}x")


def gateway_overhead(
    tmp: Path, redis_pid: int, redis_url: str, args: argparse.Namespace, procs: list[subprocess.Popen[Any]]
) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """Part 1: the gateways, phases alternating between them, ``args.rounds`` rounds."""
    urls: dict[str, str] = {}
    pids: dict[str, tuple[int, ...]] = {}
    processes = [name for name in GATEWAYS if name not in TOGGLED]
    for name in processes:
        extra = ["--redis", redis_url] if name.startswith("redis") else []
        strategy = "moving-window" if name.endswith("mw") else "sliding-window-counter"
        proc, url = serve(
            tmp / name.replace(" ", "-"), *extra, env={"PUSHGATE_RATE_LIMIT_STRATEGY": strategy}
        )
        procs.append(proc)
        urls[name] = url
        pids[name] = (proc.pid, redis_pid) if extra else (proc.pid,)
    keys = {
        name: (tmp / name.replace(" ", "-") / "bootstrap-admin-key").read_text().strip() for name in processes
    }
    for toggled, host in TOGGLED.items():
        urls[toggled], pids[toggled], keys[toggled] = urls[host], pids[host], keys[host]

    def put_limits(name: str, limits: dict[str, Any]) -> None:
        headers = {"Authorization": f"Bearer {keys[name]}"}
        httpx.put(f"{urls[name]}/v1/limits", headers=headers, json=limits).raise_for_status()
        now = httpx.get(f"{urls[name]}/v1/limits", headers=headers).raise_for_status().json()
        assert (now.get("receive") is None) == (limits is NO_LIMITS), now

    for name in processes:
        headers = {"Authorization": f"Bearer {keys[name]}"}
        for queue in ("bench", "empty"):
            httpx.put(f"{urls[name]}/v1/queues/{queue}", headers=headers, json={}).raise_for_status()
        if not name.endswith("none"):
            put_limits(name, LIMITS)
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for _ in range(args.rounds):
        for mode in ("poll", "send"):
            for name in GATEWAYS:
                if name in TOGGLED:
                    put_limits(name, LIMITS)
                result = load(urls[name], keys[name], mode, args.duration, args.connections, pids[name])
                if name in TOGGLED:
                    put_limits(name, NO_LIMITS)
                runs.setdefault((mode, name), []).append(result)
    return runs


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
