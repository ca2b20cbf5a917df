"""A reconnect storm: how fast WebSocket clients that all arrive at once get connected,
authenticated and subscribed, against a bare Starlette WebSocket route on the same uvicorn.

Run: ``python bench/connect_storm.py [--connections 5000] [--in-flight 200] [--clients 4]
[--rounds 3]``

Each round starts two fresh server processes: (a) ``pushgate serve`` on the embedded store
(uvicorn, uvloop, httptools, the gateway's WebSocket protocol) and (b) a bare Starlette
``WebSocketRoute`` on uvicorn with the gateway's WebSocket settings (no permessage-deflate,
the same ping interval) that accepts, reads one frame and answers it. Against each, in turn
(the order alternates between rounds, so a shared machine's load falls on both alike),
``--clients`` processes of real ``websockets`` clients open ``--connections`` between them,
``--in-flight`` at a time in all, every one started at the same instant. A gateway client
sends its API key in the ``Authorization`` header, then ``subscribe``s to a queue and waits
for the ``ok``; a bare client sends the same frame and waits for the answer. The figure is
handshakes a second: connections / (the last answer - the first connect), over all clients.

The clients run on the same two cores as the server; both servers face the same clients, so
the ratio holds the client's share alike; the clients' CPU per connection is printed so it
can be accounted for. On a machine others load, the rate follows their load more than the
server's cost: the server's CPU per connection (and its ratio to the bare route's) is the
steadier figure. ``--baseline-tree DIR`` adds a third server, the gateway run from another
source tree (``git archive COMMIT | tar -x -C DIR``), to the same rounds: a before and after. RSS per connection: the server's RSS growth over the storm (after
``--warmup`` connections that are not counted) / connections, with every connection open.
Target (issue 45): >= 0.8x the bare route's handshakes a second, <= 30 KiB per subscribed
connection.
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
from collections.abc import Callable
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.push_common import (
    REPO,
    cpu_seconds,
    create_queue,
    free_port,
    machine,
    start_gateway,
    stop,
    wait_for_port,
)
from bench.push_idle import settle_rss

QUEUE = "storm"


def bare_server(port: int) -> None:
    """The baseline: accept, read one frame, answer it, wait for the close."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.routing import WebSocketRoute
    from starlette.websockets import WebSocket

    from gateway.settings import Settings

    settings = Settings(Path("."))  # only its WebSocket defaults are read

    async def endpoint(websocket: WebSocket) -> None:
        await websocket.accept(subprotocol="pushgate.v1")
        frame = await websocket.receive_text()
        request = orjson.loads(frame)
        await websocket.send_text(orjson.dumps({"op": "ok", "id": request["id"]}).decode())
        while (await websocket.receive())["type"] != "websocket.disconnect":
            pass

    app = Starlette(routes=[WebSocketRoute("/v1/ws", endpoint)])
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=port,
        log_level="warning",
        access_log=False,
        server_header=False,
        ws="websockets-sansio",
        ws_per_message_deflate=False,
        ws_ping_interval=settings.ws_ping_interval_s,
        ws_ping_timeout=settings.ws_ping_timeout_s,
    )


def client(url: str, key: str, count: int, in_flight: int) -> None:
    """One client process: say ``ready``, wait for ``go`` (a start time), open ``count``
    connections ``in_flight`` at a time, print ``done <first connect> <last answer> <cpu s>
    <failures>``, hold them until ``close``."""
    from websockets.asyncio.client import connect
    from websockets.typing import Subprotocol

    headers = {"Authorization": f"Bearer {key}"} if key else {}
    subscribe = orjson.dumps({"op": "subscribe", "id": 1, "queue": QUEUE}).decode()

    async def run() -> None:
        loop = asyncio.get_running_loop()
        gate = asyncio.Semaphore(in_flight)
        failures = 0

        async def one() -> object:
            nonlocal failures
            async with gate:
                try:
                    ws = await connect(
                        url,
                        subprotocols=[Subprotocol("pushgate.v1")],
                        additional_headers=headers,
                        ping_interval=None,
                        compression=None,
                        open_timeout=60,
                    )
                    await ws.send(subscribe)
                    reply = orjson.loads(await ws.recv())
                    if reply.get("op") != "ok":
                        failures += 1
                    return ws
                except Exception:
                    failures += 1
                    return None

        print("ready", flush=True)
        start_at = float((await loop.run_in_executor(None, sys.stdin.readline)).split()[1])
        await asyncio.sleep(max(0.0, start_at - time.time()))
        cpu0 = time.process_time()
        first = time.time()
        conns = await asyncio.gather(*(one() for _ in range(count)))
        last = time.time()
        cpu = time.process_time() - cpu0
        print(f"done {first} {last} {cpu} {failures}", flush=True)
        await loop.run_in_executor(None, sys.stdin.readline)  # close
        for ws in conns:
            if ws is not None:
                await ws.close()  # type: ignore[attr-defined]

    asyncio.run(run())


def storm(pid: int, url: str, key: str, count: int, in_flight: int, clients: int) -> dict[str, float]:
    """One storm of ``count`` connections from ``clients`` processes; the server's figures."""
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "_client", url, key, str(count // clients), str(in_flight // clients)],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(clients)
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        rss0 = settle_rss(pid)
        cpu0 = cpu_seconds(pid)
        start_at = time.time() + 0.5
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write(f"go {start_at}\n")
            proc.stdin.flush()
        done = []
        for proc in procs:
            assert proc.stdout is not None
            done.append([float(x) for x in proc.stdout.readline().split()[1:]])
        server_cpu = cpu_seconds(pid) - cpu0
        rss1 = settle_rss(pid)
        opened = (count // clients) * clients
        failures = sum(d[3] for d in done)
        seconds = max(d[1] for d in done) - min(d[0] for d in done)
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("close\n")
            proc.stdin.flush()
        for proc in procs:
            proc.wait(120)
        return {
            "rate": opened / seconds,
            "kib": (rss1 - rss0) / opened,
            "server_cpu_us": server_cpu / opened * 1e6,
            "client_cpu_us": sum(d[2] for d in done) / opened * 1e6,
            "failures": failures,
        }
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def gateway_round(
    count: int, in_flight: int, clients: int, warmup: int, tree: Path = REPO
) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="pushgate-storm-") as tmp:
        proc, url, key = start_gateway(Path(tmp), tree=tree)
        try:
            create_queue(url, key, QUEUE)
            ws_url = url.replace("http", "ws", 1) + "/v1/ws"
            storm(proc.pid, ws_url, key, warmup, in_flight, clients)
            return storm(proc.pid, ws_url, key, count, in_flight, clients)
        finally:
            stop(proc)


def bare_round(count: int, in_flight: int, clients: int, warmup: int) -> dict[str, float]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, __file__, "_bare", str(port)], cwd=REPO, text=True)
    try:
        wait_for_port(port)
        url = f"ws://127.0.0.1:{port}/v1/ws"
        storm(proc.pid, url, "", warmup, in_flight, clients)
        return storm(proc.pid, url, "", count, in_flight, clients)
    finally:
        stop(proc)


def span(values: list[float], fmt: str = ".0f") -> str:
    return f"{min(values):{fmt}}-{max(values):{fmt}}" if len(values) > 1 else f"{values[0]:{fmt}}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--connections", type=int, default=5000)
    parser.add_argument("--in-flight", type=int, default=200)
    parser.add_argument("--clients", type=int, default=4, help="client processes")
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--baseline-tree",
        type=Path,
        help="also storm a gateway run from this source tree (another commit's, `git worktree add`), "
        "in the same rounds: a before and after on one loaded machine",
    )
    args = parser.parse_args()
    print(machine())
    sizes = (args.connections, args.in_flight, args.clients, args.warmup)
    servers: dict[str, Callable[[], dict[str, float]]] = {
        "bare": lambda: bare_round(*sizes),
        "gateway": lambda: gateway_round(*sizes),
    }
    if args.baseline_tree is not None:
        servers["baseline"] = lambda: gateway_round(*sizes, tree=args.baseline_tree.resolve())
    results: dict[str, list[dict[str, float]]] = {name: [] for name in servers}
    rate_ratios: dict[str, list[float]] = {name: [] for name in servers if name != "bare"}
    cpu_ratios: dict[str, list[float]] = {name: [] for name in servers if name != "bare"}
    for round_no in range(args.rounds):
        load = os.getloadavg()
        order = list(servers) if round_no % 2 == 0 else list(reversed(servers))
        now = {name: servers[name]() for name in order}
        print(f"round {round_no + 1} (load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f})")
        for name in servers:
            r = now[name]
            results[name].append(r)
            line = (
                f"  {name:8} {r['rate']:7.0f} handshakes/s  {r['kib']:5.1f} KiB/conn  "
                f"server CPU {r['server_cpu_us']:5.0f} us/conn  clients' CPU {r['client_cpu_us']:5.0f} "
                f"us/conn  failures {r['failures']:.0f}"
            )
            if name != "bare":
                rate_ratios[name].append(r["rate"] / now["bare"]["rate"])
                cpu_ratios[name].append(r["server_cpu_us"] / now["bare"]["server_cpu_us"])
                line += f"  (vs bare: rate {rate_ratios[name][-1]:.2f}x, CPU {cpu_ratios[name][-1]:.2f}x)"
            print(line, flush=True)
    print(
        f"\n{args.connections} connections, {args.in_flight} in flight, {args.clients} client processes, "
        f"{args.rounds} rounds (load average now {' '.join(f'{x:.2f}' for x in os.getloadavg())})"
    )
    for name, rs in results.items():
        line = (
            f"  {name:8} {span([r['rate'] for r in rs])} handshakes/s, "
            f"{span([r['kib'] for r in rs], '.1f')} KiB/conn, "
            f"server CPU {span([r['server_cpu_us'] for r in rs])} us/conn"
        )
        if name != "bare":
            line += (
                f"; vs bare: rate {span(rate_ratios[name], '.2f')}x "
                f"(median {statistics.median(rate_ratios[name]):.2f}x, target >= 0.8x), "
                f"server CPU {span(cpu_ratios[name], '.2f')}x"
            )
        print(line)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_bare":
        bare_server(int(sys.argv[2]))
    elif len(sys.argv) > 1 and sys.argv[1] == "_client":
        client(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
    else:
        main()
