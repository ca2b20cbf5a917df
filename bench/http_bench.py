"""HTTP throughput and latency of the gateway, against a bare Starlette endpoint and the store itself.

Run: ``python bench/http_bench.py [--duration 5] [--connections 64] [--size 1024]``

Everything runs in one go on this machine, so the ratios compare like with like:

- ``bare``: a Starlette app on uvicorn (one worker, uvloop + httptools) whose POST endpoint reads
  the 1 KiB body and answers a constant: the ceiling of any Python HTTP endpoint here.
- ``send``: ``POST /v1/queues/q/messages`` with a 1 KiB body through the gateway (one uvicorn
  worker); each 201 means fsynced.
- ``receive+ack``: ``POST .../receive {"max": 1}`` then ``POST .../ack`` with its receipt, in a
  loop per connection (two requests per message), draining what ``send`` stored.
- ``receive10+ack``: the same with ``max`` 10 and one ack of 10 receipts.
- ``store send``: ``Backend.send`` of one message per call, 64 concurrent callers, no HTTP: the
  store's own durable rate on this disk.

The load generator is another process: a minimal HTTP/1.1 keep-alive client on asyncio streams
(much lighter than httpx, so the client is less of a ceiling on 2 shared cores), one
connection per concurrent worker.
"""

from __future__ import annotations

import argparse
import asyncio
import json
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

from bench.push_common import machine, start_gateway

REPO = Path(__file__).resolve().parents[1]


# The bare baseline --------------------------------------------------------------


def bare_server(port_file: str) -> None:
    import socket

    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    async def endpoint(request: Request) -> Response:
        await request.body()
        return Response(b'{"ok":true}', media_type="application/json")

    app = Starlette(routes=[Route("/bare", endpoint, methods=["POST"])])
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    Path(port_file).write_text(str(sock.getsockname()[1]))
    config = uvicorn.Config(app, log_level="warning", access_log=False, workers=1)
    uvicorn.Server(config).run(sockets=[sock])


# The load generator -------------------------------------------------------------

_HEAD_END = b"\r\n\r\n"
_LENGTH = re.compile(rb"content-length:\s*(\d+)", re.I)


class LoadConnection(asyncio.Protocol):
    """One keep-alive connection driving requests back to back.

    A plain asyncio Protocol rather than streams or httpx: the client shares 2 cores with
    the server, and every microsecond it spends is one the server does not get.
    """

    def __init__(self, load: Load) -> None:
        self.load = load
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None
        self.receipts: list[str] | None = None  # receive+ack: the receipts awaiting their ack
        self.started = 0.0
        self.closed = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses
        self.next()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)

    def next(self) -> None:
        assert self.transport is not None
        if self.receipts is None:
            if time.perf_counter() >= self.load.stop_at or self.load.drained:
                self.transport.close()
                return
            self.started = time.perf_counter()
            self.transport.write(self.load.request)
        else:
            body = json.dumps({"receipts": self.receipts}).encode()
            self.transport.write(self.load.head(self.load.ack_path, body))

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(_HEAD_END)
            if end < 0:
                return
            match = _LENGTH.search(self.buffer, 0, end)
            length = int(match.group(1)) if match else 0
            if len(self.buffer) < end + 4 + length:
                return
            status = int(self.buffer[9:12])
            body = bytes(self.buffer[end + 4 : end + 4 + length])
            del self.buffer[: end + 4 + length]
            self.on_response(status, body)

    def on_response(self, status: int, body: bytes) -> None:
        load = self.load
        load.requests += 1
        if load.mode.startswith("receive") and self.receipts is None:
            receipts = [m["receipt"] for m in json.loads(body)["messages"]] if status == 200 else []
            if not receipts:
                load.drained = True
            else:
                self.receipts = receipts
            self.next()
            return
        load.latencies.append(time.perf_counter() - self.started)
        if status in (200, 201):
            load.messages += len(self.receipts) if self.receipts is not None else 1
        else:
            load.errors += 1
        self.receipts = None
        self.next()


class Load:
    def __init__(self, host: str, token: str, mode: str, duration: float, size: int) -> None:
        self.prefix = f"Host: {host}\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\n"
        self.mode = mode
        self.ack_path = "/v1/queues/bench/ack"
        if mode == "bare":
            self.request = self.head("/bare", json.dumps({"body": "x" * size}).encode())
        elif mode == "send":
            self.request = self.head("/v1/queues/bench/messages", json.dumps({"body": "x" * size}).encode())
        else:
            batch = 10 if mode == "receive10+ack" else 1
            self.request = self.head("/v1/queues/bench/receive", b'{"max": %d, "wait_s": 0}' % batch)
        self.stop_at = time.perf_counter() + duration
        self.drained = False
        self.latencies: list[float] = []
        self.messages = self.requests = self.errors = 0

    def head(self, path: str, body: bytes) -> bytes:
        return f"POST {path} HTTP/1.1\r\n{self.prefix}Content-Length: {len(body)}\r\n\r\n".encode() + body


async def _run_load(
    url: str, token: str, mode: str, duration: float, connections: int, size: int
) -> dict[str, Any]:
    host, port = url.split("//", 1)[1].split(":")
    load = Load(f"{host}:{port}", token, mode, duration, size)
    loop = asyncio.get_running_loop()
    start = time.perf_counter()
    conns = [
        (await loop.create_connection(lambda: LoadConnection(load), host, int(port)))[1]
        for _ in range(connections)
    ]
    await asyncio.gather(*(c.closed for c in conns))
    elapsed = time.perf_counter() - start
    done = {"messages": load.messages, "requests": load.requests, "errors": load.errors}
    return _summary(done, load.latencies, elapsed)


def _summary(done: dict[str, int], latencies: list[float], elapsed: float) -> dict[str, Any]:
    latencies.sort()

    def pct(q: float) -> float:
        return latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000

    return {
        **done,
        "seconds": elapsed,
        "msg_per_s": done["messages"] / elapsed,
        "req_per_s": done["requests"] / elapsed,
        "p50_ms": pct(0.5) if latencies else float("nan"),
        "p99_ms": pct(0.99) if latencies else float("nan"),
    }


async def _store_load(data_dir: str, duration: float, connections: int, size: int) -> dict[str, Any]:
    sys.path.insert(0, str(REPO))
    from backend_store import StoreOptions, open_backend
    from backend_store.types import NewMessage, QueueName, TenantId

    backend = open_backend(f"lmdb://{data_dir}", StoreOptions())
    await backend.start()
    tenant, queue = TenantId("bench"), QueueName("bench")
    await backend.create_queue(tenant, queue, {})
    message = NewMessage(body=b"x" * size)
    latencies: list[float] = []
    done = {"messages": 0, "requests": 0, "errors": 0}
    stop_at = time.perf_counter() + duration

    async def worker() -> None:
        while time.perf_counter() < stop_at:
            t0 = time.perf_counter()
            await backend.send(tenant, queue, [message])
            latencies.append(time.perf_counter() - t0)
            done["messages"] += 1
            done["requests"] += 1

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(connections)))
    elapsed = time.perf_counter() - start
    await backend.close()
    return _summary(done, latencies, elapsed)


def load_main(argv: list[str]) -> None:
    kind = argv[0]
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    if kind == "store":
        data_dir, duration, connections, size = argv[1], float(argv[2]), int(argv[3]), int(argv[4])
        result = asyncio.run(_store_load(data_dir, duration, connections, size))
    else:
        url, token, mode = argv[:3]
        result = asyncio.run(_run_load(url, token, mode, float(argv[3]), int(argv[4]), int(argv[5])))
    print(json.dumps(result))


# The driver -----------------------------------------------------------------------


def _load(*args: object) -> dict[str, Any]:
    """Run the load generator in its own process and return its summary."""
    out = subprocess.run(
        [sys.executable, __file__, "_load", *map(str, args)],
        check=True,
        stdout=subprocess.PIPE,
        text=True,
        timeout=float(str(args[3] if args[0] != "store" else args[2])) + 60,
    ).stdout
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def _start_bare(tmp: Path) -> tuple[subprocess.Popen[str], str]:
    port_file = tmp / "bare.port"
    proc = subprocess.Popen([sys.executable, __file__, "_bare", str(port_file)], cwd=REPO, text=True)
    deadline = time.monotonic() + 30
    while not (port_file.exists() and port_file.read_text()):
        if time.monotonic() > deadline:
            proc.kill()
            raise SystemExit("the bare server did not start")
        time.sleep(0.05)
    url = f"http://127.0.0.1:{port_file.read_text()}"
    while True:  # the port is bound before uvicorn accepts; wait until it answers
        try:
            httpx.post(f"{url}/bare", content=b"{}")
            return proc, url
        except httpx.TransportError:
            time.sleep(0.05)


def _row(name: str, r: dict[str, Any]) -> str:
    return (
        f"{name:<16} {r['msg_per_s']:>10,.0f} msg/s {r['req_per_s']:>10,.0f} req/s "
        f"p50 {r['p50_ms']:7.2f} ms  p99 {r['p99_ms']:7.2f} ms  errors {r['errors']}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per phase")
    parser.add_argument("--rounds", type=int, default=3, help="bare/gateway phases alternate this many times")
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--size", type=int, default=1024, help="message body bytes")
    args = parser.parse_args()
    d, c, s = args.duration, args.connections, args.size
    phases = ("bare", "send", "receive+ack", "receive10+ack", "store send")
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in phases}

    with tempfile.TemporaryDirectory(prefix="pushgate-bench-") as tmp_name:
        tmp = Path(tmp_name)
        # Both servers run for the whole benchmark (idle while the other is loaded) and the
        # phases alternate, so a neighbour's burst of CPU hits both sides of a ratio alike.
        bare, bare_url = _start_bare(tmp)
        gateway, url, key = start_gateway(tmp / "gateway")
        try:
            headers = {"Authorization": f"Bearer {key}"}
            httpx.put(
                f"{url}/v1/queues/bench", headers=headers, json={"visibility_timeout_s": 300}
            ).raise_for_status()
            for _ in range(args.rounds):
                runs["bare"].append(_load(bare_url, "-", "bare", d, c, s))
                runs["send"].append(_load(url, key, "send", d, c, s))
                runs["receive+ack"].append(_load(url, key, "receive+ack", d / 2, c, s))
                runs["receive10+ack"].append(_load(url, key, "receive10+ack", d / 2, c, s))
        finally:
            for proc in (bare, gateway):
                proc.terminate()
                proc.wait()
        runs["store send"].append(_load("store", tmp / "store", d, c, s))

    def median(name: str, field: str) -> float:
        return float(statistics.median(r[field] for r in runs[name]))

    print(f"\n{machine()}")
    print(f"{c} connections, {s} B bodies, one uvicorn worker per server, load from another process,")
    print(f"{args.rounds} alternating rounds of {d:g} s; medians\n")
    for name in phases:
        print(
            f"{name:<14} {median(name, 'msg_per_s'):>9,.0f} msg/s {median(name, 'req_per_s'):>9,.0f} req/s  "
            f"p50 {median(name, 'p50_ms'):7.2f} ms  p99 {median(name, 'p99_ms'):7.2f} ms  "
            f"errors {sum(r['errors'] for r in runs[name])}"
        )

    def ratios(name: str) -> str:
        per_round = [g["req_per_s"] / b["req_per_s"] for g, b in zip(runs[name], runs["bare"], strict=True)]
        return f"{statistics.median(per_round):6.1%}  (rounds: {', '.join(f'{r:.0%}' for r in per_round)})"

    print()
    print(f"gateway send / bare endpoint, requests/s:          {ratios('send')}")
    print(f"gateway receive+ack / bare endpoint, requests/s:   {ratios('receive+ack')}")
    print(f"gateway receive10+ack / bare endpoint, requests/s: {ratios('receive10+ack')}")
    store = median("store send", "msg_per_s")
    print(f"gateway send / store send alone, msg/s:            {median('send', 'msg_per_s') / store:6.1%}")
    print(
        f"gateway receive10+ack / store send alone, msg/s:   {median('receive10+ack', 'msg_per_s') / store:6.1%}"
    )


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_bare":
        bare_server(sys.argv[2])
    elif len(sys.argv) > 1 and sys.argv[1] == "_load":
        load_main(sys.argv[2:])
    else:
        main()
