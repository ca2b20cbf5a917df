"""Failover after supervisors' restarts (issue 48, item 2): rounds of "SIGKILL the leader of a
new queue under load, then restart that node with its own command line", then a SIGSTOP of
the leader of another new queue for ``--hold`` seconds; each round's time from the signal
to the first acknowledged send begun after it (tests/cluster/failover_rounds.py).

Starts its own etcd, 3 ``pushgate node`` processes and 2 ``pushgate manager`` processes
(tests/cluster/processes.py, lease TTL 2 s); ``--producers`` tasks send plain messages
through a ``ClusterBackend``, as a gateway does, to a new RF 3 sync queue each round.

    .venv/bin/python bench/failover_rounds.py --kills 2 --freezes 1 --runs 3
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.cluster.failover_rounds import failover_round
from tests.cluster.processes import ClusterHarness
from tests.fixtures.etcd_server import etcd_cluster


async def run(args: argparse.Namespace, root: Path) -> list[float]:
    with etcd_cluster(root / "etcd") as etcd:
        h = await ClusterHarness(etcd.endpoints, root, "/failover-rounds/").start(nodes=3, managers=2)
        try:
            times = []
            sequence = [signal.SIGKILL] * args.kills + [signal.SIGSTOP] * args.freezes
            for i, sig in enumerate(sequence):
                done = await failover_round(
                    h,
                    f"q{i}",
                    sig,
                    producers=args.producers,
                    hold_s=args.hold,
                    restart_after_s=args.restart_after,
                )
                print(f"  {done}", flush=True)
                times.append(done.took_s)
            return times
        finally:
            await h.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--kills", type=int, default=2)
    parser.add_argument("--freezes", type=int, default=1)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--producers", type=int, default=16)
    parser.add_argument(
        "--restart-after",
        type=float,
        default=None,
        help="restart a killed node this many seconds after the kill (default: once sends resumed)",
    )
    parser.add_argument("--hold", type=float, default=6.0, help="seconds a frozen leader stays frozen")
    parser.add_argument(
        "--bound", type=float, default=3.0, help="keep the logs of a run with a round over this"
    )
    args = parser.parse_args()
    every: list[float] = []
    for n in range(args.runs):
        print(f"run {n + 1}", flush=True)
        tmp = Path(tempfile.mkdtemp(prefix="pushgate-failover-rounds-"))
        times = asyncio.run(run(args, tmp))
        every += times
        if max(times) > args.bound:
            print(f"  a round over {args.bound:g} s: the processes' logs are kept in {tmp}", flush=True)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    load = os.getloadavg()
    print(f"rounds: {min(every):.2f}-{max(every):.2f} s; load {load[0]:.1f}; {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
