"""How long a gateway at many queues keeps a request waiting while its periodic work runs (the
console's samples, the alert rules, the usage flush): the slowest answers of a probe.

A gateway (``pushgate serve`` on the embedded store, or a ``pushgate dev-cluster``'s with
``--cluster``) from this checkout and, with ``--against DIR``, the same from another checkout
(``git worktree add DIR COMMIT``), alternated ``--rounds`` times: each gets ``--queues`` queues
holding a message each (every sample then finds every queue changed, its oldest message's age
having moved, as in an inbox per user), then one keep-alive client asks ``GET /healthz``
every 5 ms for ``--seconds`` (at 10,000 queues a sample comes every 20 s) and the answers'
p50, p99, p99.9 and slowest are printed. A request waits as long as the event loop is held,
so the slowest answers are the longest holds; the host's own stalls (a process not
scheduled) show there too, which is why it is a comparison in one run, never a bound.

    .venv/bin/python bench/loop_holds.py --queues 10000 --rounds 2 --against /tmp/before
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from a checkout

from bench.dev_cluster_failover import start
from bench.many_queues import System, clients, names, pool
from bench.push_common import fdatasync_cost, machine, start_gateway, stop

REPO = Path(__file__).resolve().parents[1]
_PROBE_GAP_S = 0.005


async def _probe(url: str, key: str, queues: int, cluster: bool, seconds: float) -> list[float]:
    attributes = {"replication_factor": 3, "replication_mode": "sync"} if cluster else {}
    async with clients(System("probed", url, key, Path(), {}), 64) as producers:

        async def fill(http: httpx.AsyncClient, queue: str) -> None:
            made = await http.put(f"/v1/queues/{queue}", json=attributes)
            sent = await http.post(f"/v1/queues/{queue}/messages", json={"body": "x"})
            if not (made.is_success and sent.is_success):
                raise SystemExit(f"{queue}: {made.status_code} {sent.status_code} {sent.text[:200]}")

        await pool(names(queues), producers, fill)
        http, took = producers[0], []
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            began = time.perf_counter()
            answer = await http.get("/healthz")
            took.append(time.perf_counter() - began)
            answer.raise_for_status()
            await asyncio.sleep(_PROBE_GAP_S)
        return sorted(took)


def _run(tree: Path, queues: int, cluster: bool, seconds: float) -> list[float]:
    root = Path(tempfile.mkdtemp(prefix="loop-holds-"))
    if not cluster:
        proc, url, key = start_gateway(root / "data", tree=tree)
        try:
            return asyncio.run(_probe(url, key, queues, cluster, seconds))
        finally:
            stop(proc)
    dev, printed = start(root / "cluster", tree=tree)
    try:
        url = printed.split("ready: the gateway serves ", 1)[1].split()[0]
        key = next(
            line.split()[-1] for line in printed.splitlines() if line.startswith("Bootstrap admin key")
        )
        return asyncio.run(_probe(url, key, queues, cluster, seconds))
    finally:
        dev.send_signal(signal.SIGINT)
        try:
            dev.wait(120)
        except subprocess.TimeoutExpired:
            dev.kill()
            dev.wait()


def _line(label: str, took: list[float]) -> str:
    def at(q: float) -> float:
        return took[min(len(took) - 1, int(len(took) * q))] * 1e3

    return (
        f"{label:<12} {len(took):>6} answers  p50 {at(0.5):5.1f}  p99 {at(0.99):5.1f}  "
        f"p99.9 {at(0.999):5.1f}  slowest {took[-1] * 1e3:6.1f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--queues", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=45.0, help="probing time a run (default 45)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--cluster", action="store_true", help="a dev cluster's gateway, not the embedded store"
    )
    parser.add_argument("--against", type=Path, help="another checkout, run alternately with this one")
    args = parser.parse_args()
    print(machine())
    print(fdatasync_cost(Path(tempfile.gettempdir())))
    trees = [("this", REPO)] + ([("against", args.against.resolve())] if args.against else [])
    for number in range(1, args.rounds + 1):
        for label, tree in trees:
            took = _run(tree, args.queues, args.cluster, args.seconds)
            print(_line(f"{number}: {label}", took), flush=True)


if __name__ == "__main__":
    main()
