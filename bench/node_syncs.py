"""Syncs per send on real ``pushgate node`` processes, counted with strace (docs/store.md,
"Durability"): 3 nodes, one partition of replication factor 3 in sync mode, ``--sends``
sequential sends (each one commit on the leader, one apply on a follower), strace attached
to every node meanwhile; then each node's fdatasync/fsync calls by file, per send.

    .venv/bin/python bench/node_syncs.py --sends 200 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.push_common import fdatasync_cost
from bench.store_bench import machine
from tests.cluster.processes import ClusterHarness
from tests.cluster.test_node_journal import SyncTrace
from tests.fixtures.etcd_server import etcd_cluster

TENANT, QUEUE = "bench", "syncs"


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="pushgate-node-syncs-") as tmp:
        root = Path(tmp)
        print(machine())
        print(fdatasync_cost(root))
        with etcd_cluster(root / "etcd") as etcd:
            h = await ClusterHarness(etcd.endpoints, root, "/bench/").start(nodes=3, managers=1)
            try:
                await h.create_queue(TENANT, QUEUE, {"replication_factor": 3, "replication_mode": "sync"})
                pid = await h.partition_of(TENANT, QUEUE)

                async def three() -> bool:
                    record = (await h.partitions()).get(pid)
                    return record is not None and len(record.replicas) == 3

                await h.wait_for("three replicas", three)
                leader, _, _ = await h.serving_leader(pid)
                await h.send_until_ok(pid, TENANT, QUEUE, "warm-up")
                for round_ in range(args.rounds):
                    traces = {}
                    for name, node in h.nodes.items():
                        assert node.process is not None
                        traces[name] = SyncTrace(node.process.pid, root / f"strace-{round_}-{name}.txt")
                    began = time.perf_counter()
                    for i in range(args.sends):
                        await h.send_until_ok(pid, TENANT, QUEUE, f"r{round_}-{i}")
                    took = time.perf_counter() - began
                    counted = {name: trace.stop() for name, trace in traces.items()}
                    print(
                        f"round {round_ + 1}: {args.sends} sequential sends in {took:.2f} s under strace "
                        f"({took / args.sends * 1000:.2f} ms each)"
                    )
                    for name, syncs in sorted(counted.items()):
                        directory = str(h.root / name / "partitions" / str(pid))
                        mine = {
                            "(directory)" if p == directory else p.removeprefix(directory + "/"): n
                            for p, n in syncs.items()
                            if p.startswith(directory)
                        }
                        total = sum(mine.values())
                        role = "leader  " if name == leader else "follower"
                        files = ", ".join(f"{path} {n}" for path, n in sorted(mine.items()))
                        print(f"  {name} {role}: {total / args.sends:.2f} syncs/send ({files})")
            finally:
                await h.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sends", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    asyncio.run(main(parser.parse_args()))
