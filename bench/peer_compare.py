"""Pushgate against its peer, Redis streams with ``appendfsync always``, in one run.

Run: ``python bench/peer_compare.py [--messages 20000] [--rate 2000] [--size 1024]``

Both sides do the same work with Python clients in separate processes: one producer
(pipelined, at most 100 messages unanswered), one consumer (prefetch 100, manual acks),
1 KiB bodies, every message fsynced before the producer hears it is stored:

- Redis 7 streams: a private ``redis-server --appendonly yes --appendfsync always`` on a
  free port; ``XADD`` in pipelines of up to 100, ``XREADGROUP COUNT 100`` + ``XACK``.
- Pushgate, batch frames: ``send`` frames of up to 100 messages; the consumer subscribes
  with ``batch: 100``.
- Pushgate, one frame per message: a ``send`` frame per message (100 outstanding); the
  consumer gets a ``message`` frame each.

Every consumer runs twice (``--acks``): acking after every frame it gets (an XREADGROUP
reply, a ``messages`` frame, a ``message`` frame: one ``ack`` frame per message), and acking
50 receipts at a time (half its window, as a worker that acks as it goes).

Paced, Redis and Pushgate's batch frames send what is due every millisecond in one pipeline
or frame; one frame per message sends each message when it is due.

Phases: ``max`` (``--messages`` as fast as they go) and ``paced`` (``--rate`` msg/s for
``--paced-seconds``, for send -> push latency). Prints msg/s, p50/p99, the server's CPU per
message (and the two client processes' together), and each Pushgate figure as a ratio to
Redis measured in the same run. The server's CPU is also split into its main thread ("loop":
Pushgate's event loop) and its other threads ("threads": Pushgate's store writer).

``--rounds N`` repeats every case N times against the same servers and ends with the median
of each ratio (and the rounds' own), the figure to quote on a machine whose load moves.

``--targets`` also runs ``push_latency.py`` and ``throttle_bench.py`` (parts 0 and 1) for as
many rounds and ends with every target of issue 25 in one table: each round's figure, the
median, met or not (``bench/targets.py``).

``--pin`` runs each server on CPU 0 and this script with its clients on CPU 1: the server's
CPU per message and its split then measure the server alone, without the preemptions and GIL
hand-offs that two shared cores add (use it to compare changes; the issue's targets are
without it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import redis.asyncio as aioredis
from websockets.asyncio.client import connect
from websockets.typing import Subprotocol

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import nats_peer, targets
from bench.push_common import (
    cpu_seconds,
    create_queue,
    fdatasync_cost,
    free_port,
    machine,
    percentiles,
    pin,
    start_dev_cluster,
    start_gateway,
    stop,
    stop_group,
    thread_cpu_seconds,
    wait_for_port,
)
from bench.targets import ACKS, cluster_ratios, ratios

WINDOW = 100
HALF_WINDOW = WINDOW // 2
# How the consumer acks (--acks): after every frame it gets (a ``messages`` frame, a
# ``message`` frame, an XREADGROUP reply), or 50 receipts at a time (half its window), as a
# worker that acks as it goes.
# The Pushgate cases (--frames): a name in the report, and the subscription's batch size.
MODES = {"batch": ("batch frames", 100), "single": ("frame per message", 1)}
STREAM, GROUP = "bench", "consumers"


def body_of(size: int) -> str:
    stamp = f"{time.time():.6f}"
    return stamp + " " + "x" * max(0, size - len(stamp) - 1)


def summary(latencies: list[float], first: float, last: float) -> dict[str, float]:
    p50, p99 = percentiles(latencies)
    return {
        "count": len(latencies),
        "msg_per_s": len(latencies) / max(last - first, 1e-9),
        "p50_ms": p50 * 1e3,
        "p99_ms": p99 * 1e3,
    }


async def pace(start: float, sent: int, rate: float | None) -> None:
    if rate is not None:
        due = start + sent / rate
        now = time.perf_counter()
        if due > now:
            await asyncio.sleep(due - now)


# Redis -----------------------------------------------------------------------------


async def redis_consume(port: int, total: int, acks: str) -> None:
    r = aioredis.Redis(port=port)
    latencies: list[float] = []
    first = last = 0.0
    ids: list[bytes] = []
    print("ready", flush=True)
    while len(latencies) < total:
        # (redis-py types replies loosely: a list of [stream, [(id, fields), ...]])
        got: Any = await r.xreadgroup(GROUP, "c1", {STREAM: ">"}, count=100, block=5000)
        if not got:
            break
        now = time.time()
        for message_id, fields in got[0][1]:
            ids.append(message_id)
            latencies.append(now - float(fields[b"b"][:17]))
        first = first or now
        last = now
        if acks == "frame" or len(ids) >= HALF_WINDOW or len(latencies) >= total:
            await r.xack(STREAM, GROUP, *ids)
            ids = []
    await r.aclose()
    print(json.dumps(summary(latencies, first, last)), flush=True)


async def redis_produce(port: int, total: int, size: int, rate: float | None) -> None:
    """Pipelines of what is due (up to 100), several under way at once, at most 100 messages
    unanswered: the same window as the Pushgate producer."""
    r = aioredis.Redis(port=port, max_connections=WINDOW)
    start = time.perf_counter()
    sent = 0
    unanswered = 0
    room = asyncio.Condition()

    async def xadd(n: int) -> None:
        nonlocal unanswered
        pipe = r.pipeline(transaction=False)
        for _ in range(n):
            pipe.xadd(STREAM, {"b": body_of(size)})
        await pipe.execute()
        async with room:
            unanswered -= n
            room.notify_all()

    def has_room() -> bool:
        return unanswered < WINDOW

    tasks = []
    while sent < total:
        if rate is None:
            n = min(WINDOW - unanswered, total - sent)
        else:
            await asyncio.sleep(0.001)
            n = min(int((time.perf_counter() - start) * rate) - sent, WINDOW - unanswered, total - sent)
        if n <= 0:
            async with room:
                await room.wait_for(has_room)
            continue
        unanswered += n
        sent += n
        tasks.append(asyncio.create_task(xadd(n)))
    await asyncio.gather(*tasks)
    await r.aclose()


# Pushgate ---------------------------------------------------------------------------


def open_ws(url: str, key: str) -> connect:
    """A client connection to the gateway's ``/v1/ws`` (no compression, no size limit)."""
    return connect(
        url.replace("http", "ws", 1) + "/v1/ws",
        subprotocols=[Subprotocol("pushgate.v1")],
        additional_headers={"Authorization": f"Bearer {key}"},
        max_size=None,
        compression=None,
    )


async def pushgate_consume(url: str, key: str, queue: str, total: int, batch: int, acks: str) -> None:
    async with open_ws(url, key) as ws:
        await ws.send(
            orjson.dumps({"op": "subscribe", "queue": queue, "prefetch": 100, "batch": batch}).decode()
        )
        print("ready", flush=True)
        latencies: list[float] = []
        receipts: list[str] = []
        first = last = 0.0
        while len(latencies) < total:
            try:
                async with asyncio.timeout(10):
                    frame = orjson.loads(await ws.recv())
            except TimeoutError:
                break
            now = time.time()
            if frame["op"] == "message":
                messages = [frame["message"]]
            elif frame["op"] == "messages":
                messages = frame["messages"]
            else:
                continue
            for m in messages:
                receipts.append(m["receipt"])
                latencies.append(now - float(m["body"][:17]))
            first = first or now
            last = now
            if acks == "frame" or len(receipts) >= HALF_WINDOW or len(latencies) >= total:
                await ws.send(orjson.dumps({"op": "ack", "receipts": receipts}).decode())
                receipts = []
    print(json.dumps(summary(latencies, first, last)), flush=True)


async def pushgate_produce(
    url: str, key: str, queue: str, total: int, size: int, rate: float | None, batch: int
) -> None:
    async with open_ws(url, key) as ws:
        outstanding = 0
        sent = 0
        request_id = 0
        start = time.perf_counter()

        async def read_reply() -> None:
            nonlocal outstanding
            reply = orjson.loads(await ws.recv())
            if reply["op"] != "ok":
                raise SystemExit(f"send failed: {reply}")
            outstanding -= int(reply["id"].split(":")[1])  # the id says how many messages it had

        async def read_replies(until: int) -> None:
            while outstanding > until:
                await read_reply()

        async def read_all() -> None:
            while sent < total or outstanding > 0:
                await read_reply()

        if rate is not None and batch > 1:
            # Paced batch frames: a frame of what is due each millisecond, as the Redis
            # producer pipelines it, with the replies read alongside.
            reader = asyncio.create_task(read_all())
        while sent < total:
            if rate is None:
                n = min(batch, total - sent)
            elif batch == 1:
                n = 1
                await pace(start, sent, rate)
            else:
                await asyncio.sleep(0.001)
                due = int((time.perf_counter() - start) * rate) - sent
                n = min(due, batch, WINDOW - outstanding, total - sent)
                if n <= 0:
                    continue
            request_id += 1
            frame: dict[str, Any]
            if n == 1:
                frame = {"op": "send", "queue": queue, "body": body_of(size), "id": f"{request_id}:1"}
            else:
                frame = {
                    "op": "send",
                    "queue": queue,
                    "messages": [{"body": body_of(size)} for _ in range(n)],
                    "id": f"{request_id}:{n}",
                }
            await ws.send(orjson.dumps(frame).decode())
            outstanding += n
            sent += n
            if rate is None or batch == 1:
                await read_replies(WINDOW - n)
        if rate is not None and batch > 1:
            await reader
        else:
            await read_replies(0)


# Phases -------------------------------------------------------------------------------


def run(cmd: list[str]) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, __file__, *cmd], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if line != "ready":
        raise SystemExit(f"consumer did not start: {line!r}")
    return proc


def children_cpu_seconds() -> float:
    """User + system CPU time of this process's children that have been waited for."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def phase(
    consumer_cmd: list[str], producer_cmd: list[str], server_pids: list[int], total: int
) -> dict[str, Any]:
    """One case; the server's CPU is that of ``server_pids`` together (a cluster's processes),
    split into loop and threads for the first (the gateway)."""
    server_pid = server_pids[0]
    clients = children_cpu_seconds()
    consumer = run(consumer_cmd)
    cpu = sum(cpu_seconds(pid) for pid in server_pids)
    threads = thread_cpu_seconds(server_pid)
    producer = subprocess.run([sys.executable, __file__, *producer_cmd], check=True)
    assert producer.returncode == 0 and consumer.stdout is not None
    result: dict[str, Any] = json.loads(consumer.stdout.readline())
    consumer.wait(30)
    result["cpu_us_per_msg"] = (sum(cpu_seconds(pid) for pid in server_pids) - cpu) / max(total, 1) * 1e6
    spent = {tid: t - threads.get(tid, 0.0) for tid, t in thread_cpu_seconds(server_pid).items()}
    loop = spent.pop(server_pid, 0.0)
    result["loop_us_per_msg"] = loop / max(total, 1) * 1e6
    result["threads_us_per_msg"] = sum(spent.values()) / max(total, 1) * 1e6
    # The producer and the consumer together (both waited for by now): on 2 cores the
    # clients' CPU bounds the rate as much as the server's does.
    result["client_cpu_us_per_msg"] = (children_cpu_seconds() - clients) / max(total, 1) * 1e6
    return result


def _names(allowed: set[str]) -> Callable[[str], list[str]]:
    """An argparse type: a comma-separated subset of ``allowed``, in the order given."""

    def parse(text: str) -> list[str]:
        names = text.split(",")
        if not names or not set(names) <= allowed:
            raise argparse.ArgumentTypeError(f"choose from {', '.join(sorted(allowed))}")
        return names

    return parse


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=20000, help="max phase: messages per side")
    parser.add_argument("--rate", type=float, default=2000.0, help="paced phase, msg/s")
    parser.add_argument("--paced-seconds", type=float, default=5.0)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--phases", default="max,paced", type=_names({"max", "paced"}))
    parser.add_argument("--frames", default="batch,single", type=_names(set(MODES)))
    parser.add_argument("--acks", default="frame,half", type=_names(set(ACKS)))
    parser.add_argument("--pin", action="store_true", help="servers on CPU 0, clients on CPU 1")
    parser.add_argument("--rounds", type=int, default=1, help="repeat every case; medians of the ratios")
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="max phase also on a dev cluster (3 nodes, RF 3 sync) and on NATS JetStream R3 (sync always)",
    )
    parser.add_argument(
        "--targets",
        action="store_true",
        help="also run push_latency.py and throttle_bench.py for as many rounds and end with "
        "every target of issue 25, met or not (bench/targets.py)",
    )
    args = parser.parse_args()
    if args.pin:
        pin(os.getpid(), {1})  # the clients started from here inherit it
    modes = [MODES[name] for name in args.frames]
    phases = args.phases
    paced_total = int(args.rate * args.paced_seconds)
    rounds: list[dict[str, dict[str, Any]]] = []
    print(machine())
    with tempfile.TemporaryDirectory(prefix="pushgate-peers-") as tmp:
        print(fdatasync_cost(Path(tmp)))
        port = free_port()
        redis_proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--dir",
                tmp,
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--save",
                "",
                "--protected-mode",
                "no",
            ],
            stdout=subprocess.DEVNULL,
        )
        gateway, url, key = start_gateway(Path(tmp) / "gateway")
        cluster_proc = jetstream = cluster = None
        if args.cluster:
            cluster_proc, cluster_url, cluster_key, cluster_pids = start_dev_cluster(Path(tmp) / "cluster")
            cluster = (cluster_url, cluster_key, cluster_pids)
            jetstream = nats_peer.start_jetstream_cluster(Path(tmp) / "nats")
        try:
            if args.pin:
                for server in (redis_proc, gateway):
                    pin(server.pid, {0})
            wait_for_port(port)
            for round_no, acks in ((r, a) for r in range(args.rounds) for a in args.acks):
                results: dict[str, dict[str, Any]] = {"": {"acks": acks}}
                rounds.append(results)
                for name in phases:
                    total, rate = (args.messages, None) if name == "max" else (paced_total, args.rate)
                    asyncio.run(_redis_reset(port))
                    results[f"redis {name}"] = phase(
                        ["_redis_consume", str(port), str(total), acks],
                        ["_redis_produce", str(port), str(total), str(args.size), str(rate or 0)],
                        [redis_proc.pid],
                        total,
                    )
                    for mode, batch in modes:
                        queue = f"peer-{name}-{batch}-{round_no}-{acks}"
                        create_queue(url, key, queue)
                        results[f"pushgate {mode} {name}"] = phase(
                            ["_pg_consume", url, key, queue, str(total), str(batch), acks],
                            [
                                "_pg_produce",
                                url,
                                key,
                                queue,
                                str(total),
                                str(args.size),
                                str(rate or 0),
                                str(batch),
                            ],
                            [gateway.pid],
                            total,
                        )
                        if cluster is not None and name == "max":
                            cluster_url, cluster_key, cluster_pids = cluster
                            # The dev cluster's gateway creates queues with one replica unless
                            # told otherwise: the comparison with NATS R3 needs three, sync.
                            create_queue(
                                cluster_url, cluster_key, queue, replication_factor=3, replication_mode="sync"
                            )
                            results[f"cluster {mode} {name}"] = phase(
                                [
                                    "_pg_consume",
                                    cluster_url,
                                    cluster_key,
                                    queue,
                                    str(total),
                                    str(batch),
                                    acks,
                                ],
                                [
                                    "_pg_produce",
                                    cluster_url,
                                    cluster_key,
                                    queue,
                                    str(total),
                                    str(args.size),
                                    "0",
                                    str(batch),
                                ],
                                cluster_pids,
                                total,
                            )
                    if jetstream is not None and name == "max":
                        results[f"nats {name}"] = nats_peer.run_case(jetstream, total, args.size, acks)
        finally:
            stop(gateway)
            stop(redis_proc)  # type: ignore[arg-type]
            if cluster_proc is not None:
                stop_group(cluster_proc)
            if jetstream is not None:
                jetstream.stop()
    print(
        f"\n{args.size} B bodies, 1 producer + 1 consumer process, window/prefetch 100, manual acks, fsync before every ack"
    )
    for round_no, results in enumerate(rounds):
        print(
            f"\nround {round_no // len(args.acks) + 1} of {args.rounds}, consumer {ACKS[results['']['acks']]}"
        )
        print_round(results, phases, [mode for mode, _ in modes])
    for acks in args.acks if args.rounds > 1 else ():
        kind = [r for r in rounds if r[""]["acks"] == acks]
        print(f"\nmedians of {len(kind)} rounds, consumer {ACKS[acks]}")
        for name in phases:
            for mode, _ in modes:
                each = [ratios(r, name, mode) for r in kind]
                print(
                    f"  {name:<5} {mode:<18} throughput {statistics.median(t for t, _ in each):.2f}x"
                    f" ({', '.join(f'{t:.2f}' for t, _ in each)}), server CPU/msg"
                    f" {statistics.median(r[f'pushgate {mode} {name}']['cpu_us_per_msg'] for r in kind):.0f} us"
                    f" ({statistics.median(c for _, c in each):.1f}x Redis's), p50/p99"
                    f" {statistics.median(r[f'pushgate {mode} {name}']['p50_ms'] for r in kind):.1f}/"
                    f"{statistics.median(r[f'pushgate {mode} {name}']['p99_ms'] for r in kind):.1f} ms"
                    f" (Redis {statistics.median(r[f'redis {name}']['p50_ms'] for r in kind):.1f}/"
                    f"{statistics.median(r[f'redis {name}']['p99_ms'] for r in kind):.1f} ms)"
                )
    if args.targets:
        found = targets.peer_targets(rounds, phases, [mode for mode, _ in modes])
        found += targets.latency_and_limit_targets(args.rounds)
        targets.print_targets(found)


def print_round(results: dict[str, dict[str, Any]], phases: list[str], modes: list[str]) -> None:
    print(
        f"\n{'case':<36} {'msg/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'CPU/msg':>9} {'loop':>7} {'threads':>8}"
        f" {'clients':>9}"
    )
    for name, r in results.items():
        if not name:
            continue  # the round's settings
        print(
            f"{name:<36} {r['msg_per_s']:>8.0f} {r['p50_ms']:>8.2f} {r['p99_ms']:>8.2f} "
            f"{r['cpu_us_per_msg']:>7.0f}us {r.get('loop_us_per_msg', 0):>5.0f}us"
            f" {r.get('threads_us_per_msg', 0):>6.0f}us {r.get('client_cpu_us_per_msg', 0):>7.0f}us"
        )
    print("\nratios to Redis in this run (msg/s: higher is better; CPU/msg: lower is better)")
    for name in phases:
        base = results[f"redis {name}"]
        for mode in modes:
            r = results[f"pushgate {mode} {name}"]
            throughput, cpu = ratios(results, name, mode)
            print(
                f"  {name:<5} {mode:<18} throughput {throughput:.2f}x, server CPU/msg {cpu:.1f}x, "
                f"p99 {r['p99_ms']:.1f} ms vs {base['p99_ms']:.1f} ms"
            )
    for mode in modes:
        if (pair := cluster_ratios(results, mode)) is not None:
            print(
                f"  cluster (RF 3 sync) {mode:<18} {pair[0]:.2f}x the embedded store, "
                f"{pair[1]:.2f}x NATS JetStream R3"
            )


async def _redis_reset(port: int) -> None:
    r = aioredis.Redis(port=port)
    await r.delete(STREAM)
    await r.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
    await r.aclose()


if __name__ == "__main__":
    command = sys.argv[1] if len(sys.argv) > 1 else ""
    rest = sys.argv[2:]
    if command == "_redis_consume":
        asyncio.run(redis_consume(int(rest[0]), int(rest[1]), rest[2]))
    elif command == "_redis_produce":
        asyncio.run(redis_produce(int(rest[0]), int(rest[1]), int(rest[2]), float(rest[3]) or None))
    elif command == "_pg_consume":
        asyncio.run(pushgate_consume(rest[0], rest[1], rest[2], int(rest[3]), int(rest[4]), rest[5]))
    elif command == "_pg_produce":
        asyncio.run(
            pushgate_produce(
                rest[0], rest[1], rest[2], int(rest[3]), int(rest[4]), float(rest[5]) or None, int(rest[6])
            )
        )
    else:
        main()
