"""Issue 48's failover sequence as its report made it: ``pushgate dev-cluster`` and HTTP.

Starts ``pushgate dev-cluster`` (etcd, 3 nodes, 2 managers, a gateway; lease TTL 2 s) in a
temporary directory and, per round, creates a new RF 3 sync queue over HTTP, runs
``--producers`` tasks of plain ``POST /v1/queues/Q/messages`` (no ``Idempotency-Key``) on
keep-alive connections, and signals the queue's leader (found in etcd): SIGKILL, then the
node is started again from its own ``/proc/PID/cmdline`` ``--restart-after`` seconds after
sends resumed, as a supervisor would; or SIGSTOP for ``--hold`` seconds. Each round prints
the time from a moment taken before the signal to the first 2xx of a send begun after it.
A run whose freeze round passes ``--bound`` keeps its directory (every process's log).

    .venv/bin/python bench/dev_cluster_failover.py --runs 3
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx

from backend_store.cluster.coordination.etcd_coordinator import EtcdCoordinator
from backend_store.cluster.coordination.layout import Layout, LeaderRecord, PartitionRecord

REPO = Path(__file__).resolve().parents[1]
_CHILD = re.compile(r"^(\S+)\s+(\S+)\s+pid (\d+)", re.M)


def start(data: Path, *extra: str, tree: Path = REPO) -> tuple[subprocess.Popen[bytes], str]:
    """``pushgate dev-cluster`` (with ``extra`` arguments) until ready; its process and what it
    printed. ``tree``: the checkout it runs from (``python -m`` finds its packages first)."""
    out = data.parent / "dev-cluster.out"
    command = [sys.executable, "-m", "gateway.cli", "dev-cluster", "--data", str(data), "--port", "0", *extra]
    with out.open("wb") as sink:
        proc = subprocess.Popen(
            command, cwd=tree, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
        )
    deadline = time.monotonic() + 120
    while "ready: the gateway serves" not in out.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"pushgate dev-cluster did not start:\n{out.read_text()}")
        time.sleep(0.1)
    return proc, out.read_text()


def command_lines(pids: dict[str, int]) -> dict[str, list[bytes]]:
    """Each node's command line, read while it runs (a supervisor's restart uses it)."""
    return {
        n: Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")[:-1] for n, p in pids.items() if "node" in n
    }


def restart(command: list[bytes], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as sink:
        return subprocess.Popen(
            command, cwd=REPO, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
        )


async def leader_of(etcd: EtcdCoordinator, queue: str) -> tuple[int, str]:
    layout = Layout()
    while True:
        partitions = (await etcd.read_prefix(layout.partitions)).values()
        found = [
            int(k) for k, v in partitions.items() if k.isdigit() and PartitionRecord.unpack(v).queue == queue
        ]
        if found:
            entry = await etcd.get(layout.leader(found[0]))
            if entry is not None:
                return found[0], LeaderRecord.unpack(entry.value).node
        await asyncio.sleep(0.05)


async def one_run(args: argparse.Namespace, data: Path) -> list[float]:
    proc, printed = start(data)
    pids = {m[1]: int(m[3]) for m in _CHILD.finditer(printed)}
    addresses = {m[1]: m[2] for m in _CHILD.finditer(printed)}
    url = re.search(r"ready: the gateway serves (\S+)", printed)
    key = re.search(r"^Bootstrap admin key.*?(\S+)$", printed, re.M)
    assert url is not None and key is not None
    command = command_lines(pids)
    etcd = await EtcdCoordinator([addresses["etcd"]]).connect()
    restarted: dict[str, subprocess.Popen[bytes]] = {}
    times: list[float] = []
    try:
        headers = {"Authorization": f"Bearer {key[1]}"}
        async with httpx.AsyncClient(base_url=url[1], headers=headers, timeout=30) as client:
            sequence = [signal.SIGKILL] * args.kills + [signal.SIGSTOP]
            for n, sig in enumerate(sequence):
                queue = f"q{n}"
                created = await client.put(
                    f"/v1/queues/{queue}", json={"replication_mode": "sync", "replication_factor": 3}
                )
                created.raise_for_status()
                took = await one_round(args, client, etcd, queue, sig, pids, restarted)
                times.append(took[0])
                print(
                    f"  {queue}: {sig.name} of {took[1]}: first acknowledged send after {took[0]:.2f} s",
                    flush=True,
                )
                if sig == signal.SIGKILL:
                    await asyncio.sleep(args.restart_after)
                    restarted[took[1]] = restart(command[took[1]], data / "logs" / f"{took[1]}.restarted.log")
                    await asyncio.sleep(args.pause)
    finally:
        await etcd.close()
        for child in restarted.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGCONT)
                os.killpg(child.pid, signal.SIGTERM)
            child.wait()
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
    return times


async def one_round(
    args: argparse.Namespace,
    client: httpx.AsyncClient,
    etcd: EtcdCoordinator,
    queue: str,
    sig: signal.Signals,
    pids: dict[str, int],
    restarted: dict[str, subprocess.Popen[bytes]],
) -> tuple[float, str]:
    signalled = float("inf")
    acked: list[float] = []
    sent = 0
    stop, flowing, progress = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def producer() -> None:
        nonlocal sent
        while not stop.is_set():
            began = time.monotonic()
            with contextlib.suppress(httpx.HTTPError):
                reply = await client.post(f"/v1/queues/{queue}/messages", json={"body": "x" * 100})
                if reply.is_success:
                    sent += 1
                    if sent >= 200:
                        flowing.set()
                    if began > signalled:
                        acked.append(time.monotonic())
                        progress.set()
                    continue
            await asyncio.sleep(0.01)

    tasks = [asyncio.create_task(producer()) for _ in range(args.producers)]
    try:
        await flowing.wait()
        _, victim = await leader_of(etcd, queue)
        pid = restarted[victim].pid if victim in restarted else pids[victim]
        signalled = time.monotonic()
        os.killpg(pid, sig)
        if sig == signal.SIGSTOP:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(progress.wait(), args.hold)
            os.killpg(pid, signal.SIGCONT)
        await progress.wait()
        return acked[0] - signalled, victim
    finally:
        stop.set()
        await asyncio.gather(*tasks)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--kills", type=int, default=2)
    parser.add_argument("--producers", type=int, default=16)
    parser.add_argument("--hold", type=float, default=6.0, help="seconds the frozen leader stays frozen")
    parser.add_argument("--restart-after", type=float, default=0.2, help="seconds after sends resumed")
    parser.add_argument("--pause", type=float, default=3.0, help="seconds from a restart to the next round")
    parser.add_argument("--bound", type=float, default=3.0)
    args = parser.parse_args()
    every: list[float] = []
    for n in range(args.runs):
        print(f"run {n + 1}", flush=True)
        root = Path(tempfile.mkdtemp(prefix="pushgate-dev-failover-"))
        times = asyncio.run(one_run(args, root / "data"))
        every += times
        if times[-1] > args.bound:
            print(f"  the freeze took over {args.bound:g} s: logs kept in {root}", flush=True)
        else:
            shutil.rmtree(root, ignore_errors=True)
    load = os.getloadavg()
    print(f"rounds: {min(every):.2f}-{max(every):.2f} s; load {load[0]:.1f}; {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
