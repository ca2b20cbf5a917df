"""Durable throughput and latency of the embedded store, beside Redis ``appendfsync always``.

Run: ``python bench/store_bench.py [--seconds 2] [--producers 1,16,128] [--size 1024] [--no-redis]``

Prints figures; it is not a test. What it measures, in one run on this machine so the
ratios compare like with like (absolute numbers move by +-20% between runs):

- ``send``: ``Backend.send`` of one 1 KiB message per call from 1, 16 and 128 concurrent
  producers (asyncio tasks), each call returning only once its message is fsynced.
  Twice: with group commit (the default) and with one commit and sync per operation
  (``StoreOptions.max_batch = 1``), and the ratio of the two at the most producers.
- ``receive+ack``: consumers that ``receive`` one message and ``ack`` its receipt, and
  consumers that receive up to 100 and ack them in one call; pairs (messages) per second.
- p50 / p99 latency of each call.
- the same workload on a ``redis-server --appendonly yes --appendfsync always`` started here
  on an ephemeral port in a temp dir (redis-py asyncio: XADD, XREADGROUP, XACK), when
  ``redis-server`` is installed, and Pushgate / Redis as a ratio. Redis is reached over
  loopback TCP; the store is in-process, as the gateway uses it.

The store's files go to a temp dir on the disk under ``--dir`` (default: the system temp
dir), never a tmpfs, so the syncs are real.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from backend_store import (  # noqa: E402  (runs as a script from a checkout)
    Backend,
    NewMessage,
    QueueName,
    StoreOptions,
    TenantId,
    open_backend,
)
from gateway.local_ports import free_port  # noqa: E402

TENANT = TenantId("bench")
QUEUE = QueueName("bench")


# Figures ------------------------------------------------------------------------


@dataclass
class Run:
    """One measured workload: how many operations/messages in how long, and call latencies."""

    name: str
    messages: int = 0
    elapsed: float = 0.0
    latencies: dict[str, list[float]] = field(default_factory=dict)
    # Store operations per commit in the run (Pushgate only): how much group commit grouped.
    per_commit: float | None = None
    # This process's CPU time (all threads) per message: with the store in-process, it tells
    # whether a run is bound by the CPU (Python) or by the disk (fsync). For Redis it is only
    # the client's share (the server is another process).
    cpu_per_message: float | None = None
    cpu_label: str = "CPU/msg"

    @property
    def rate(self) -> float:
        return self.messages / self.elapsed if self.elapsed else 0.0

    def record(self, op: str, seconds: float) -> None:
        self.latencies.setdefault(op, []).append(seconds)

    def percentiles(self) -> str:
        parts = [] if self.per_commit is None else [f"{self.per_commit:.1f} ops/commit"]
        if self.cpu_per_message is not None:
            parts.append(f"{self.cpu_per_message * 1e6:.0f} us {self.cpu_label}")
        for op, values in self.latencies.items():
            values.sort()
            parts.append(f"{op} p50 {_pct(values, 0.50):.2f} / p99 {_pct(values, 0.99):.2f} ms")
        return "; ".join(parts)


def _pct(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))] * 1000


def machine() -> str:
    cpu = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    import lmdb

    return (
        f"nproc {os.cpu_count()}, CPU {cpu}, Python {platform.python_version()} "
        f"({platform.python_implementation()}), py-lmdb {lmdb.__version__} (LMDB {'.'.join(map(str, lmdb.version()))}), "
        f"{platform.system()} {platform.release()}, load average {os.getloadavg()[0]:.2f}"
    )


def filesystem_of(path: Path) -> str:
    """The mount's type (ext4, tmpfs, ...) from /proc/mounts: the syncs mean little on tmpfs."""
    best, kind = "", "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/mounts").read_text().splitlines():
            _, mount, fstype, *_ = line.split()
            if str(path.resolve()).startswith(mount) and len(mount) > len(best):
                best, kind = mount, fstype
    return kind


# Load generators, shared by both systems -------------------------------------------


async def timed_workers(
    workers: int, seconds: float, step: Callable[[int, Run], Awaitable[int]], run: Run
) -> Run:
    """Run ``workers`` loops of ``step`` until the time is up or a step returns 0 (drained)."""
    stop_at = time.perf_counter() + seconds

    async def worker(w: int) -> None:
        while time.perf_counter() < stop_at:
            done = await step(w, run)
            if done == 0:
                return
            run.messages += done

    start, cpu_start = time.perf_counter(), time.process_time()
    await asyncio.gather(*(worker(w) for w in range(workers)))
    run.elapsed = time.perf_counter() - start
    if run.messages:
        run.cpu_per_message = (time.process_time() - cpu_start) / run.messages
    return run


# The disk under the store: bare LMDB, no Pushgate --------------------------------------


def raw_lmdb(path: Path, per_commit: int, seconds: float, body: bytes) -> float:
    """1 KiB puts/s into a bare LMDB environment, synced like the store, ``per_commit`` per commit.

    The floor and ceiling the engine works between: what a commit costs on this disk, and
    what batching alone buys without any of the engine's Python.
    """
    import lmdb

    env = lmdb.open(str(path), map_size=1 << 30, sync=True, metasync=True)
    try:
        key, done = 0, 0
        stop_at = time.perf_counter() + seconds
        start = time.perf_counter()
        while time.perf_counter() < stop_at:
            with env.begin(write=True) as txn:
                for _ in range(per_commit):
                    key += 1
                    txn.put(key.to_bytes(8, "big"), body, append=True)
            done += per_commit
        return done / (time.perf_counter() - start)
    finally:
        env.close()
        shutil.rmtree(path, ignore_errors=True)


# Pushgate --------------------------------------------------------------------------

# Whether the store journals (``--no-journal``: LMDB syncs each commit, the design before it).
JOURNAL = {"on": True}


@contextlib.asynccontextmanager
async def pushgate_store(root: Path, name: str, max_batch: int | None = None) -> AsyncIterator[Backend]:
    # A generous map so the runs measure syncs, not map growth.
    store = open_backend(
        f"lmdb://{root / name}",
        StoreOptions(
            map_size=1 << 30, max_batch=1024 if max_batch is None else max_batch, journal=JOURNAL["on"]
        ),
    )
    await store.start()
    try:
        await store.create_queue(TENANT, QUEUE, {"visibility_timeout_s": 600})
        yield store
    finally:
        await store.close()
        shutil.rmtree(root / name, ignore_errors=True)


def commit_counters(store: Backend) -> tuple[int, int] | None:
    """(commits, operations) so far, when the engine exposes them (LmdbBackend.stats)."""
    stats = getattr(store, "stats", None)
    if not isinstance(stats, dict) or "batches" not in stats:
        return None
    return int(stats["batches"]), int(stats["operations"])


def ops_per_commit(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    if before is None or after is None or after[0] == before[0]:
        return None
    return (after[1] - before[1]) / (after[0] - before[0])


async def pushgate_sends(
    root: Path, producers: int, seconds: float, body: bytes, max_batch: int | None
) -> Run:
    label = "group commit" if max_batch is None else f"max_batch={max_batch}"
    async with pushgate_store(root, f"send-{producers}-{label}", max_batch) as store:
        message = [NewMessage(body=body, is_text=False)]

        async def step(_: int, run: Run) -> int:
            t0 = time.perf_counter()
            await store.send(TENANT, QUEUE, message)
            run.record("send", time.perf_counter() - t0)
            return 1

        # Warm up (first commits, page allocation) outside the measured window.
        await timed_workers(producers, 0.2, step, Run("warm-up"))
        before = commit_counters(store)
        run = await timed_workers(producers, seconds, step, Run(f"send x{producers} ({label})"))
        run.per_commit = ops_per_commit(before, commit_counters(store))
        return run


async def pushgate_receive_ack(
    root: Path, consumers: int, batch: int, seconds: float, body: bytes, fill: int
) -> Run:
    async with pushgate_store(root, f"recv-{consumers}-{batch}") as store:
        for start in range(0, fill, 100):
            n = min(100, fill - start)
            await store.send(TENANT, QUEUE, [NewMessage(body=body, is_text=False)] * n)

        async def step(_: int, run: Run) -> int:
            t0 = time.perf_counter()
            got = await store.receive(TENANT, QUEUE, batch)
            t1 = time.perf_counter()
            run.record("receive", t1 - t0)
            if not got:
                return 0
            await store.ack(TENANT, [m.receipt for m in got])
            run.record("ack", time.perf_counter() - t1)
            return len(got)

        before = commit_counters(store)
        run = await timed_workers(consumers, seconds, step, Run(f"receive{batch}+ack x{consumers}"))
        run.per_commit = ops_per_commit(before, commit_counters(store))
        return run


# Redis -----------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def redis_server(root: Path) -> AsyncIterator[Any]:
    """A private ``redis-server`` with every write fsynced before it answers."""
    import redis.asyncio as aioredis

    data = root / "redis"
    data.mkdir()
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        "redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data),
        "--appendonly", "yes", "--appendfsync", "always", "--save", "", "--daemonize", "no",
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    # Any: the installed redis-py is newer than its type stubs (aclose, asyncio typing).
    client: Any = aioredis.Redis(host="127.0.0.1", port=port, max_connections=256)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                await client.ping()
                break
            except (ConnectionError, OSError, aioredis.ConnectionError):
                if time.monotonic() > deadline or proc.returncode is not None:
                    raise RuntimeError("redis-server did not start") from None
                await asyncio.sleep(0.02)
        version = (await client.info("server"))["redis_version"]
        yield client, version
    finally:
        await client.aclose()
        proc.send_signal(signal.SIGTERM)
        try:
            async with asyncio.timeout(10):
                await proc.wait()
        except TimeoutError:
            proc.kill()
            await proc.wait()


async def redis_sends(client: Any, producers: int, seconds: float, body: bytes, stream: str) -> Run:
    async def step(_: int, run: Run) -> int:
        t0 = time.perf_counter()
        await client.xadd(stream, {"b": body})
        run.record("send", time.perf_counter() - t0)
        return 1

    await timed_workers(producers, 0.2, step, Run("warm-up"))
    # Open every pooled connection during warm-up, so the run does not pay for connecting.
    return await timed_workers(
        producers, seconds, step, Run(f"XADD x{producers}", cpu_label="client CPU/msg")
    )


async def redis_receive_ack(
    client: Any, consumers: int, batch: int, seconds: float, body: bytes, fill: int, stream: str
) -> Run:
    pipe = client.pipeline(transaction=False)
    for _ in range(fill):
        pipe.xadd(stream, {"b": body})
    await pipe.execute()
    await client.xgroup_create(stream, "g", id="0")

    async def step(w: int, run: Run) -> int:
        t0 = time.perf_counter()
        reply = await client.xreadgroup("g", f"c{w}", {stream: ">"}, count=batch)
        t1 = time.perf_counter()
        run.record("receive", t1 - t0)
        entries = reply[0][1] if reply else []
        if not entries:
            return 0
        await client.xack(stream, "g", *[entry_id for entry_id, _ in entries])
        run.record("ack", time.perf_counter() - t1)
        return len(entries)

    run = Run(f"XREADGROUP{batch}+XACK x{consumers}", cpu_label="client CPU/msg")
    return await timed_workers(consumers, seconds, step, run)


# Main ------------------------------------------------------------------------------


def row(label: str, ours: Run, theirs: Run | None) -> str:
    line = f"  {label:<26} {ours.rate:>10,.0f}/s"
    if theirs is not None:
        ratio = ours.rate / theirs.rate if theirs.rate else float("inf")
        line += f"   redis {theirs.rate:>10,.0f}/s   pushgate/redis {ratio:5.2f}x"
    return line


async def main(args: argparse.Namespace) -> None:
    body = os.urandom(args.size)
    base = Path(args.dir) if args.dir else Path(tempfile.gettempdir())
    root = Path(tempfile.mkdtemp(prefix="pushgate-store-bench-", dir=base))
    JOURNAL["on"] = not args.no_journal
    print(f"machine: {machine()}")
    print(f"store: {'journal, one fdatasync a commit' if JOURNAL['on'] else 'no journal (--no-journal)'}")
    print(
        f"store dir: {root} ({filesystem_of(root)}); {args.size} B messages; {args.seconds:g} s per run; "
        f"{args.loop} event loop"
    )
    if filesystem_of(root) == "tmpfs":
        print("WARNING: tmpfs: fsync is free here, the figures say nothing about durability cost")
    redis_ok = not args.no_redis and shutil.which("redis-server") is not None
    if not args.no_redis and not redis_ok:
        print("redis-server is not installed: Redis columns skipped (apt-get install redis-server)")
    try:
        baseline = {
            n: await asyncio.to_thread(raw_lmdb, root / f"raw-{n}", n, min(args.seconds, 1.0), body)
            for n in (1, 100)
        }
        # The first store of the process runs slower (file creation, cold caches, imports):
        # pay that on a throwaway run, or it lands on whichever row comes first.
        await pushgate_sends(root, 16, min(args.seconds, 0.5), body, None)
        grouped: dict[int, Run] = {}
        single: dict[int, Run] = {}
        for producers in args.producers:
            grouped[producers] = await pushgate_sends(root, producers, args.seconds, body, None)
            single[producers] = await pushgate_sends(root, producers, args.seconds, body, 1)
        receives = [
            await pushgate_receive_ack(root, consumers, batch, args.seconds, body, args.fill)
            for consumers, batch in ((args.consumers, 1), (max(1, args.consumers // 4), 100))
        ]

        redis_sends_by: dict[int, Run] = {}
        redis_receives: list[Run | None] = [None, None]
        redis_version = ""
        if redis_ok:
            async with redis_server(root) as (client, redis_version):
                for producers in args.producers:
                    redis_sends_by[producers] = await redis_sends(
                        client, producers, args.seconds, body, f"s{producers}"
                    )
                redis_receives = [
                    await redis_receive_ack(
                        client, consumers, batch, args.seconds, body, args.fill, f"r{batch}"
                    )
                    for consumers, batch in ((args.consumers, 1), (max(1, args.consumers // 4), 100))
                ]

        print()
        print(
            f"bare LMDB, synced commits of 1 KiB puts: 1 per commit {baseline[1]:,.0f}/s, "
            f"100 per commit {baseline[100]:,.0f}/s"
        )
        print()
        print("durable sends of one message per call (messages/s):")
        for producers in args.producers:
            print(
                row(f"{producers} producers, group commit", grouped[producers], redis_sends_by.get(producers))
            )
            print(row(f"{producers} producers, sync each", single[producers], None))
        top = max(args.producers)
        print(
            f"  group commit / sync each at {top} producers: "
            f"{grouped[top].rate / max(single[top].rate, 1e-9):.1f}x (target >= 20x)"
        )
        print()
        print("receive + ack (messages/s):")
        for ours, theirs in zip(receives, redis_receives, strict=True):
            print(row(ours.name, ours, theirs))
        print()
        print("latency per call:")
        for run in [*grouped.values(), *single.values(), *receives]:
            print(f"  pushgate {run.name:<32} {run.percentiles()}")
        for maybe in [*redis_sends_by.values(), *redis_receives]:
            if maybe is not None:
                print(f"  redis    {maybe.name:<32} {maybe.percentiles()}")
        if redis_version:
            print(
                f"\nredis-server {redis_version}, appendonly yes, appendfsync always, loopback TCP, redis-py asyncio"
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="measured time per workload (default 2)")
    parser.add_argument(
        "--producers",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[1, 16, 128],
        help="comma-separated producer counts (default 1,16,128)",
    )
    parser.add_argument("--consumers", type=int, default=16, help="consumers of the one-by-one receive run")
    parser.add_argument("--size", type=int, default=1024, help="message body bytes (default 1024)")
    parser.add_argument("--fill", type=int, default=30_000, help="messages stored before each receive run")
    parser.add_argument("--dir", help="where to put the store (default: the system temp dir)")
    parser.add_argument("--no-redis", action="store_true", help="skip the Redis comparison")
    parser.add_argument(
        "--no-journal",
        action="store_true",
        help="the store without its journal: LMDB syncs each commit (two fdatasyncs when idle)",
    )
    parser.add_argument(
        "--loop",
        choices=("asyncio", "uvloop"),
        default="asyncio",
        help="event loop (the gateway runs uvloop)",
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    arguments = parse_args()
    if arguments.loop == "uvloop":
        import uvloop

        uvloop.run(main(arguments))
    else:
        asyncio.run(main(arguments))
