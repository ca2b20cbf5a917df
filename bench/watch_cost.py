"""What following a prefix of etcd costs per change, at many keys (issue 49).

Every node, manager and gateway follows ``queues/``, ``partitions/`` and ``leaders/`` with a
``WatchedPrefix``; with one record per queue, those prefixes hold as many keys as there are
queues. This starts a private etcd (free loopback ports, a temporary data directory,
stopped by PID), fills a prefix with ``--keys`` records of ``--size`` bytes, and puts
``--changes`` of them again one at a time, each awaited until the ``--followers``
``WatchedPrefix`` of this process (re-read whole every ``--reread`` seconds; nodes and
managers: 2 s) have it, then the same
puts with nobody following. The difference in this process's CPU time, per change and per
follower, is what a follower pays to take one change; the wall time per change is how late
followers learn of it.

    .venv/bin/python bench/watch_cost.py --keys 1000,10000 --changes 200
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from a checkout

from backend_store.cluster.coordination.coordinator import PrefixState
from backend_store.cluster.coordination.etcd_coordinator import EtcdCoordinator
from backend_store.cluster.coordination.watched_prefix import WatchedPrefix
from bench.push_common import machine
from tests.fixtures.etcd_server import etcd_cluster


async def fill(writer: EtcdCoordinator, prefix: str, keys: int, size: int) -> None:
    body = b"x" * size
    room = asyncio.Semaphore(64)

    async def one(i: int) -> None:
        async with room:
            await writer.put(f"{prefix}{i:06d}", body)

    await asyncio.gather(*(one(i) for i in range(keys)))


async def changes(
    writer: EtcdCoordinator, prefix: str, count: int, keys: int, follow: list[WatchedPrefix]
) -> float:
    """Put ``count`` keys again, each awaited until every follower holds it; the wall time."""
    arrived = asyncio.Event()
    revision = 0

    def listener(state: PrefixState, _keys: set[str]) -> None:
        if all(f.state.revision >= revision for f in follow):
            arrived.set()

    for f in follow:
        f.add_listener(listener)
    began = time.perf_counter()
    for n in range(count):
        arrived.clear()
        revision = await writer.put(f"{prefix}{(n * 7919) % keys:06d}", b"y" * 200)
        if follow and not all(f.state.revision >= revision for f in follow):
            await asyncio.wait_for(arrived.wait(), 30)
    return time.perf_counter() - began


async def one_size(endpoints: list[str], keys: int, args: argparse.Namespace) -> None:
    prefix = f"/bench/{keys}/"
    async with EtcdCoordinator(endpoints) as writer, EtcdCoordinator(endpoints) as reader:
        await fill(writer, prefix, keys, args.size)
        follow = [WatchedPrefix(reader, prefix, reread_every_s=args.reread) for _ in range(args.followers)]
        for f in follow:
            await f.start(timeout_s=60)
        cpu0 = time.process_time()
        wall = await changes(writer, prefix, args.changes, keys, follow)
        followed = time.process_time() - cpu0
        for f in follow:
            await f.close()
        cpu0 = time.process_time()
        await changes(writer, prefix, args.changes, keys, [])
        alone = time.process_time() - cpu0
        per = (followed - alone) / args.changes / args.followers * 1e3
        print(
            f"{keys:>7,} keys: {per:8.2f} ms CPU per change per follower; "
            f"{wall / args.changes * 1e3:7.2f} ms from a put to every follower holding it",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--keys", default="1000,10000", help="records under the prefix, comma-separated")
    parser.add_argument("--changes", type=int, default=200)
    parser.add_argument("--followers", type=int, default=3)
    parser.add_argument("--size", type=int, default=200, help="bytes per record")
    parser.add_argument("--reread", type=float, default=2.0, help="seconds between whole re-reads")
    args = parser.parse_args()
    print(machine())
    with (
        tempfile.TemporaryDirectory(prefix="pushgate-watch-cost-") as tmp,
        etcd_cluster(Path(tmp)) as cluster,
    ):
        for keys in (int(k) for k in args.keys.split(",")):
            asyncio.run(one_size(cluster.endpoints, keys, args))


if __name__ == "__main__":
    main()
