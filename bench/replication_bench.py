"""Durable sends with replication to two followers, as a ratio to the embedded store.

The leader store runs in this process; each follower is a separate process (this script
re-run with ``--follower``) with its own LMDB store, listening on loopback TCP. Producers
are asyncio tasks each calling ``send`` with one message and then, as a node will before
answering, ``ReplicationLeader.replicate`` (sync: a majority fsynced it; async: no wait).

Printed: sends/s and p50/p99 per send for the embedded store (no log, as a standalone
gateway runs), the embedded store keeping a replication log (what a node's store writes),
sync and async replication at 3 replicas; each as a ratio to the embedded store of the same
run. Not the full cluster benchmark (no node process, no gateway, no failover): see
docs/cluster.md for what is built.

    .venv/bin/python bench/replication_bench.py --seconds 5 --producers 64
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backend_store.cluster.replication.log_shipping import (
    ReplicationFollower,
    ReplicationLeader,
    ReplicationMode,
)
from backend_store.lmdb_store.engine import LmdbBackend
from backend_store.options import StoreOptions
from backend_store.types import Epoch, NewMessage, QueueName, TenantId

TENANT = TenantId("bench")
QUEUE = QueueName("q")


async def open_store(path: Path, keep: int) -> LmdbBackend:
    store = LmdbBackend(path, StoreOptions(replication_log_keep=keep, sweep_interval_s=0))
    await store.start()
    return store


async def run_follower(path: Path) -> None:
    """Follower mode: serve one partition replica; print the port; run until killed."""
    store = await open_store(path, 100_000)
    follower = ReplicationFollower(store, partition=0, node_id=path.name)
    server = await asyncio.start_server(follower.serve, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    await server.serve_forever()


async def measure(
    send: Callable[[], Awaitable[None]], producers: int, seconds: float
) -> tuple[float, list[float]]:
    latencies: list[float] = []
    stop = time.monotonic() + seconds

    async def producer() -> None:
        while time.monotonic() < stop:
            t0 = time.perf_counter()
            await send()
            latencies.append(time.perf_counter() - t0)

    started = time.monotonic()
    await asyncio.gather(*(producer() for _ in range(producers)))
    return len(latencies) / (time.monotonic() - started), latencies


def describe(rate: float, latencies: list[float], base: float | None) -> str:
    q = statistics.quantiles(latencies, n=100)
    ratio = f"  {rate / base:.2f}x embedded" if base else ""
    return f"{rate:9,.0f} sends/s  p50 {q[49] * 1000:6.2f} ms  p99 {q[98] * 1000:6.2f} ms{ratio}"


async def bench(args: argparse.Namespace) -> None:
    body = b"x" * args.size
    root = Path(tempfile.mkdtemp(prefix="pushgate-repl-bench-", dir=args.dir))
    print(
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    )
    print(
        f"{args.producers} producers, {args.size}-byte messages, {args.seconds:g}s per run, files in {root}"
    )

    async def embedded(keep: int, name: str) -> tuple[float, list[float]]:
        store = await open_store(root / name, keep)
        await store.create_queue(TENANT, QUEUE, {})
        try:
            return await measure(lambda: _send(store, body), args.producers, args.seconds)
        finally:
            await store.close()

    base_rate, base_lat = await embedded(0, "embedded")
    print(f"embedded store, no log        {describe(base_rate, base_lat, None)}")
    rate, lat = await embedded(100_000, "embedded-log")
    print(f"embedded store, log kept      {describe(rate, lat, base_rate)}")

    for mode in (ReplicationMode.SYNC, ReplicationMode.ASYNC):
        rate, lat, lag = await replicated(root / mode.value, mode, body, args)
        print(f"{mode.value:5} replication, 3 replicas {describe(rate, lat, base_rate)}  lag at end {lag}")


async def _send(store: LmdbBackend, body: bytes) -> None:
    [result] = await store.send(TENANT, QUEUE, [NewMessage(body)])
    if isinstance(result, Exception):
        raise result


async def replicated(
    root: Path, mode: ReplicationMode, body: bytes, args: argparse.Namespace
) -> tuple[float, list[float], dict[str, int]]:
    followers = []
    for name in ("f1", "f2"):
        proc = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--follower", str(root / name),
            stdout=asyncio.subprocess.PIPE,
            start_new_session=True,
        )  # fmt: skip
        assert proc.stdout is not None
        followers.append((name, proc, int(await proc.stdout.readline())))
    leader_store = await open_store(root / "leader", 100_000)
    leader = ReplicationLeader(
        leader_store, partition=0, epoch=Epoch(1), replicas=3, node_id="leader", mode=mode
    )
    await leader.start()
    links = []
    for name, _, port in followers:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        links.append(asyncio.create_task(leader.follow(name, reader, writer)))
    await leader_store.create_queue(TENANT, QUEUE, {})

    async def send() -> None:
        await _send(leader_store, body)
        await leader.replicate(leader_store.last_lsn, timeout_s=30)

    try:
        rate, latencies = await measure(send, args.producers, args.seconds)
        lag = leader.lag()
    finally:
        for _, proc, _ in followers:
            proc.kill()
            await proc.wait()
        for link in links:
            link.cancel()
        await asyncio.gather(*links, return_exceptions=True)
        await leader_store.close()
    return rate, latencies, lag


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument("--producers", type=int, default=64)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--dir", default=None, help="where the stores go (default: the temp dir)")
    parser.add_argument("--follower", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.follower:
        asyncio.run(run_follower(args.follower))
    else:
        asyncio.run(bench(args))


if __name__ == "__main__":
    main()
