"""The retention sweep's CPU at many queues that each hold a message (an inbox per user, most
owners offline): what a store pays every ``sweep_interval_s`` (5 s) with nothing to drop.

An embedded ``LmdbBackend`` in a temporary directory; ``--queues`` queues (retention 4 days,
the default) get one message each; then ``--passes`` sweeps, each timed by this process's CPU.
The first pass visits every queue in full (as every pass did before ``sweep_memo.py``); the
later ones find the same queues with nothing due. With ``--sends``, every queue takes one more
message before each later pass (not timed): what a pass finds under sends, each queue's record
changed since the pass before. Printed: each pass's CPU, the later passes' median as a ratio
of the first, and what that costs a core at one pass every 5 s.

    .venv/bin/python bench/sweep_cost.py --queues 10000 --passes 5 [--sends]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from a checkout

from backend_store.lmdb_store.engine import LmdbBackend
from backend_store.options import StoreOptions
from backend_store.types import NewMessage, QueueName, TenantId
from bench.push_common import fdatasync_cost, machine


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _run(queues: int, passes: int, sends: bool, directory: Path) -> list[float]:
    store = LmdbBackend(directory / "store", StoreOptions(sweep_interval_s=0))
    await store.start()
    try:
        tenant = TenantId("bench")
        names = [QueueName(f"inbox-{i:05d}") for i in range(queues)]
        for name in names:
            await store.create_queue(tenant, name, {})
        await asyncio.gather(*(store.send(tenant, name, [NewMessage(body=b"hello")]) for name in names))
        costs = []
        for number in range(passes):
            if sends and number:
                await asyncio.gather(
                    *(store.send(tenant, name, [NewMessage(body=b"more")]) for name in names)
                )
            before = _cpu()
            dropped = await store.sweep()
            costs.append(_cpu() - before)
            assert dropped == 0, dropped
        return costs
    finally:
        await store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queues", type=int, default=10_000)
    parser.add_argument("--passes", type=int, default=5)
    parser.add_argument("--sends", action="store_true", help="a send to every queue before each later pass")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sweep-cost") as tmp:
        directory = Path(tmp)
        print(
            f"machine: {machine()}; fdatasync of 4 KiB: {fdatasync_cost(directory)}; load {os.getloadavg()[0]:.1f}"
        )
        costs = asyncio.run(_run(args.queues, args.passes, args.sends, directory))
    print("CPU a pass (ms): " + ", ".join(f"{1000 * c:.0f}" for c in costs))
    later = statistics.median(costs[1:]) if len(costs) > 1 else costs[0]
    print(
        f"{args.queues} queues holding messages{', each sent to between passes' if args.sends else ''}: first pass {1000 * costs[0]:.0f} ms, later passes "
        f"{1000 * later:.0f} ms ({later / costs[0]:.2f}x); a pass every 5 s costs "
        f"{100 * later / 5:.1f}% of a core"
    )


if __name__ == "__main__":
    main()
