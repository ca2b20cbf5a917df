"""The cluster on loopback: send throughput against the embedded store, failover time, and
what async replication loses when its leader is killed.

Starts its own etcd (Debian's ``etcd``), 3 ``pushgate node`` processes and a ``pushgate
manager`` (the test harness in ``tests/cluster/processes.py``), then measures:

1. Durable sends of one message each from ``--producers`` concurrent producers for
   ``--seconds``: the embedded store in this process (the baseline), then through
   ``NodeClient`` to a partition's leader with replication factor 3 in ``sync`` (the reply
   waits for a majority fsync) and ``async`` mode (only the leader's fsync). Sends/s and
   p50/p99 per send, each as a ratio to the embedded store of the same run.
2. Failover, ``--kills`` times: SIGKILL the sync partition's leader (lease TTL 2 s) while a
   client sends, and time from the kill to the first acknowledged send on that partition.
3. Async loss: SIGKILL the async partition's leader during a stream of sends and count the
   acknowledged messages the new leader does not have.
3a. Failover as a gateway sees it, ``--freezes`` rounds each: the sync partition's leader
   SIGKILLed, then SIGSTOPped (until its successor serves), while 8 producers send through
   a ``ClusterBackend`` (the gateway's path: requests held at a frozen leader are given up
   once the map shows its successor); time from the signal to the first acknowledged send.
4. Through a gateway (``--gateway-rounds``, 0 to skip): ``POST /v1/queues/bench/messages``
   of one message each from ``--producers`` keep-alive connections (http_bench.py's load
   generator, in its own process) to a ``pushgate serve`` on the embedded store and to one on
   ``cluster://`` (RF 3, sync), alternating, as a ratio: what a user choosing between the two
   sees per gateway, with each round's CPU per send of the gateway and of the nodes.
   ``--compare-batching`` adds a cluster gateway with ``send_batching=0`` and rounds of
   ``ClusterBackend.send`` in this process (unbatched, 1, 2 and 4 requests in flight per
   partition) with node requests per send.

With ``--tls`` every node-protocol connection (node ports, leader links, the clients and the
gateway on ``cluster://``) runs mutual TLS with certificates made for the run: run it with
and without to see what TLS costs (each run has its own embedded baseline to compare with).

    .venv/bin/python bench/cluster_bench.py --seconds 5 --producers 32 --kills 3
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx

from backend_store.cluster.client.cluster_backend import open_cluster_backend
from backend_store.cluster.protocol.tls import NodeTls, TlsFiles
from backend_store.cluster.protocol.tls_certs import make_cluster_certificates
from backend_store.errors import StaleEpoch, Unavailable
from backend_store.lmdb_store.engine import LmdbBackend
from backend_store.options import StoreOptions
from backend_store.types import NewMessage, QueueName, TenantId
from bench.http_bench import _load as http_load
from bench.push_common import cpu_seconds, fdatasync_cost, serve, start_gateway
from bench.store_bench import machine
from tests.cluster.processes import ClusterHarness
from tests.fixtures.etcd_server import etcd_cluster

TENANT = "bench"


async def measure(
    send: Callable[[int], Awaitable[None]], producers: int, seconds: float
) -> tuple[float, list[float]]:
    latencies: list[float] = []
    stop = time.monotonic() + seconds
    counter = iter(range(10**9))

    async def producer() -> None:
        while time.monotonic() < stop:
            started = time.perf_counter()
            await send(next(counter))
            latencies.append(time.perf_counter() - started)

    began = time.monotonic()
    await asyncio.gather(*(producer() for _ in range(producers)))
    return len(latencies) / (time.monotonic() - began), latencies


def describe(name: str, rate: float, latencies: list[float], base: float | None) -> str:
    p50 = statistics.median(latencies) * 1000
    p99 = statistics.quantiles(latencies, n=100)[98] * 1000 if len(latencies) > 100 else float("nan")
    ratio = f"{rate / base:5.2f}x" if base else "  1.00x"
    return f"{name:<28} {rate:8.0f} sends/s  {ratio}   p50 {p50:6.2f} ms   p99 {p99:7.2f} ms"


def nodes_cpu_s(h: ClusterHarness) -> float:
    """CPU seconds (user + system) the node processes have used so far (Linux /proc)."""
    total = 0
    for proc in h.nodes.values():
        if proc.process is not None and proc.running:
            fields = Path(f"/proc/{proc.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return total / os.sysconf("SC_CLK_TCK")


async def embedded(root: Path, producers: int, seconds: float, body: bytes) -> tuple[float, list[float]]:
    store = LmdbBackend(root / "embedded", StoreOptions(sweep_interval_s=0))
    await store.start()
    try:
        await store.create_queue(TenantId(TENANT), QueueName("q"), {})

        async def send(i: int) -> None:
            await store.send(TenantId(TENANT), QueueName("q"), [NewMessage(body)])

        return await measure(send, producers, seconds)
    finally:
        await store.close()


async def cluster_sends(
    h: ClusterHarness, pid: int, queue: str, producers: int, seconds: float, body: bytes
) -> tuple[float, list[float]]:
    node, address, epoch = await h.serving_leader(pid)
    assert h.pool is not None
    client = h.pool.client(node, address)

    async def send(i: int) -> None:
        await client.call(
            "send", pid, epoch, tenant=TenantId(TENANT), queue=QueueName(queue), messages=[NewMessage(body)]
        )

    return await measure(send, producers, seconds)


async def failover_time(h: ClusterHarness, pid: int, queue: str) -> float:
    victim, _, _ = await h.serving_leader(pid)
    await h.send_until_ok(pid, TENANT, queue, f"warm-{time.monotonic()}")
    killed = time.monotonic()
    h.nodes[victim].kill()
    n = 0
    while True:
        n += 1
        try:
            await h.call(
                pid,
                "send",
                tenant=TenantId(TENANT),
                queue=QueueName(queue),
                messages=[NewMessage(b"after", dedupe_id=f"after-{killed}-{n}")],
            )
            took = time.monotonic() - killed
            break
        except (Unavailable, StaleEpoch):
            await asyncio.sleep(0.01)
    h.nodes[victim].start()
    return took


async def gateway_failover(h: ClusterHarness, pid: int, queue: str, sig: signal.Signals) -> float:
    """Seconds from ``sig`` to the leader to the first send a gateway's backend acknowledged
    after it (8 producers, deduplicated sends, as clients retry); the victim then runs again."""
    url = f"cluster://{','.join(h.endpoints)}{h.prefix}"
    backend = open_cluster_backend(url, StoreOptions())
    await backend.start()
    acked: list[float] = []
    stop = asyncio.Event()
    counter = iter(range(10**9))

    async def producer() -> None:
        while not stop.is_set():
            body = f"g{time.monotonic()}-{next(counter)}"
            try:
                await backend.send(
                    TenantId(TENANT), QueueName(queue), [NewMessage(body.encode(), dedupe_id=body)]
                )
                acked.append(time.monotonic())
                progress.set()
            except (Unavailable, StaleEpoch):
                await asyncio.sleep(0.01)

    async def until_acked(count: int, after: float) -> None:
        while sum(t > after for t in acked) < count:
            progress.clear()
            await progress.wait()

    progress = asyncio.Event()
    tasks = [asyncio.create_task(producer()) for _ in range(8)]
    try:
        await until_acked(50, 0.0)
        # The leader now (a rebalancing hand-over may have moved it since the last round).
        victim, _, _ = await h.serving_leader(pid)
        signalled = time.monotonic()
        if sig == signal.SIGKILL:
            h.nodes[victim].kill()  # and reaped
        else:
            h.nodes[victim].signal(sig)
        await until_acked(1, signalled)
        took = min(t for t in acked if t > signalled) - signalled
    finally:
        stop.set()
        await asyncio.gather(*tasks)
        await backend.close()
    if sig == signal.SIGSTOP:
        h.nodes[victim].signal(signal.SIGCONT)
    else:
        h.nodes[victim].start()
    await wait_rejoined(h, pid, victim)
    return took


async def wait_rejoined(h: ClusterHarness, pid: int, node: str) -> None:
    """Until ``node`` publishes the leader's last LSN again (it caught up as a follower)."""

    async def caught_up() -> bool:
        records = await h.node_records()
        found = await h.leader(pid)
        if found is None or node not in records or found[0] not in records:
            return False
        mine, head = records[node].replicas.get(pid), records[found[0]].replicas.get(pid)
        return mine is not None and head is not None and mine.lsn == head.lsn

    await h.wait_for(f"{node} to catch up", caught_up, timeout=60)


async def receive_all(h: ClusterHarness, pid: int, queue: str) -> list[str]:
    """Receive and ack everything visible on the partition's leader (retrying through errors)."""
    bodies: list[str] = []
    while True:
        try:
            got = await h.call(
                pid,
                "receive",
                tenant=TenantId(TENANT),
                queue=QueueName(queue),
                max_messages=1000,
                visibility_timeout_s=300,
            )
            if not got:
                return bodies
            bodies += [m.body.decode() for m in got]
            await h.call(pid, "ack", tenant=TenantId(TENANT), receipts=[m.receipt for m in got])
        except (Unavailable, StaleEpoch):
            await asyncio.sleep(0.05)


async def async_loss(h: ClusterHarness, pid: int, queue: str) -> tuple[int, int]:
    """Acknowledged async sends, and how many of them the new leader lacks after a SIGKILL."""
    acknowledged: list[str] = []
    stop = asyncio.Event()
    counter = iter(range(10**9))

    async def producer() -> None:
        while not stop.is_set():
            body = f"a{next(counter)}"
            try:
                await h.call(
                    pid,
                    "send",
                    tenant=TenantId(TENANT),
                    queue=QueueName(queue),
                    messages=[NewMessage(body.encode(), dedupe_id=body)],
                )
                acknowledged.append(body)
            except (Unavailable, StaleEpoch):
                await asyncio.sleep(0.01)

    victim, _, _ = await h.serving_leader(pid)
    tasks = [asyncio.create_task(producer()) for _ in range(16)]
    await asyncio.sleep(1.0)
    h.nodes[victim].kill()
    await h.serving_leader(pid, not_node=victim)
    await asyncio.sleep(0.5)
    stop.set()
    await asyncio.gather(*tasks)
    received = set(await receive_all(h, pid, queue))
    h.nodes[victim].start()
    return len(acknowledged), len(set(acknowledged) - received)


def through_gateways(
    h: ClusterHarness, root: Path, args: argparse.Namespace, tls: TlsFiles | None = None
) -> None:
    """HTTP sends to a gateway on the embedded store and to gateways on the cluster (sends
    batched per partition, and with ``--compare-batching`` also one without), alternating;
    each round's CPU per send of the gateway and of the three nodes."""
    cluster_url = f"cluster://{','.join(h.endpoints)}{h.prefix}?replication_factor=3"
    if tls is not None:
        cluster_url += f"&tls_cert={tls.cert}&tls_key={tls.key}&tls_ca={tls.ca}"
    gateways: dict[str, tuple[subprocess.Popen[str], str, str]] = {}
    try:
        gateways["embedded"] = start_gateway(root / "gw-embedded")
        gateways["cluster"] = start_gateway(root / "gw-cluster", cluster_url)
        if args.compare_batching:
            # Same cluster, so the same tenants: it prints no bootstrap key of its own.
            proc, url = serve(root / "gw-unbatched", "--store", cluster_url + "&send_batching=0")
            gateways["unbatched"] = (proc, url, gateways["cluster"][2])
        for name, (_, url, key) in gateways.items():
            response = httpx.put(
                f"{url}/v1/queues/bench",
                headers={"Authorization": f"Bearer {key}"},
                json={"replication_mode": "sync"} if name != "embedded" else {},
                timeout=60,
            )
            response.raise_for_status()
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in gateways}
        for round_ in range(args.gateway_rounds):
            # The cluster gateways share a queue that grows: alternate which goes first.
            order = list(gateways.items())
            if round_ % 2:
                order = [order[0], *reversed(order[1:])]
            for name, (proc, url, key) in order:
                gateway_before, nodes_before = cpu_seconds(proc.pid), nodes_cpu_s(h)
                result = http_load(url, key, "send", args.seconds, args.producers, args.size)
                sends = max(1.0, result["req_per_s"] * result["seconds"])
                result["gateway_us"] = (cpu_seconds(proc.pid) - gateway_before) / sends * 1e6
                result["nodes_us"] = (nodes_cpu_s(h) - nodes_before) / sends * 1e6
                runs[name].append(result)
    finally:
        for proc, _, _ in gateways.values():
            proc.terminate()
            proc.wait()
    labels = {"embedded": "embedded store", "cluster": "cluster://", "unbatched": "cluster:// unbatched"}
    for name, results in runs.items():
        rates = ", ".join(f"{r['req_per_s']:,.0f}" for r in results)
        p50 = statistics.median(r["p50_ms"] for r in results)
        p99 = statistics.median(r["p99_ms"] for r in results)
        errors = sum(int(r["errors"]) for r in results)
        cpu = ", ".join(f"{r['gateway_us']:.0f}" for r in results)
        nodes = ", ".join(f"{r['nodes_us']:.0f}" for r in results)
        print(
            f"gateway on {labels[name]:<20} sends/s by round: {rates}   p50 {p50:.2f} ms  p99 {p99:.2f} ms"
            f"  errors {errors}\n    CPU us/send, gateway: {cpu}"
            + (f"; nodes: {nodes}" if name != "embedded" else "")
        )
    for name in runs:
        if name == "embedded":
            continue
        ratios = [c["req_per_s"] / e["req_per_s"] for e, c in zip(runs["embedded"], runs[name], strict=True)]
        print(
            f"gateway on {labels[name]} (RF 3, sync) / gateway on the embedded store: "
            + ", ".join(f"{r:.2f}x" for r in ratios)
        )


async def through_backend(h: ClusterHarness, args: argparse.Namespace, body: bytes) -> None:
    """``ClusterBackend.send`` in this process from ``--producers`` tasks, one message each,
    alternating batched and unbatched rounds: node requests per send and nodes' CPU."""
    url = f"cluster://{','.join(h.endpoints)}{h.prefix}?replication_factor=3"
    backend = open_cluster_backend(url, StoreOptions())
    await backend.start()
    try:
        queue = QueueName("direct")
        await backend.create_queue(TenantId(TENANT), queue, {"replication_mode": "sync"})
        await backend.send(TenantId(TENANT), queue, [NewMessage(b"warm-up")])
        batcher = backend.send_batcher

        async def send(i: int) -> None:
            await backend.send(TenantId(TENANT), queue, [NewMessage(body)])

        configs = [(False, 1), (True, 1), (True, 2), (True, 4)]
        for round_ in range(args.gateway_rounds):
            # Rotated, and each on an emptied queue: a queue that grew over earlier phases
            # (deeper B-trees, a grown map) would make whichever runs later look dearer.
            for enabled, in_flight in configs[round_ % 4 :] + configs[: round_ % 4]:
                await backend.purge_queue(TenantId(TENANT), queue)
                batcher.enabled, batcher.max_in_flight = enabled, in_flight
                requests_before, cpu_before = batcher.counters.requests, nodes_cpu_s(h)
                rate, lat = await measure(send, args.producers, args.seconds)
                requests = (batcher.counters.requests - requests_before) / max(1, len(lat))
                cpu = (nodes_cpu_s(h) - cpu_before) / max(1, len(lat)) * 1e6
                name = f"ClusterBackend, {in_flight} in flight" if enabled else "ClusterBackend, unbatched"
                print(
                    f"{name:<28} {rate:8.0f} sends/s   p50 {statistics.median(lat) * 1000:6.2f} ms"
                    f"   {requests:.3f} requests/send   nodes' CPU {cpu:4.0f} us/send"
                )
    finally:
        await backend.close()


async def main(args: argparse.Namespace) -> None:
    body = b"x" * args.size
    with tempfile.TemporaryDirectory(prefix="pushgate-cluster-bench-") as tmp:
        root = Path(tmp)
        print(machine())
        print(fdatasync_cost(root))
        print(
            f"{args.producers} producers, {args.seconds:g} s each, {args.size}-byte bodies, 3 nodes on loopback"
            + (", mutual TLS on the node protocol" if args.tls else "")
        )
        certs = make_cluster_certificates(root / "tls", ["n0", "n1", "n2", "client"]) if args.tls else {}

        def node_tls(name: str) -> list[str]:
            files = certs.get(name)
            return (
                []
                if files is None
                else ["--tls-cert", str(files.cert), "--tls-key", str(files.key), "--tls-ca", str(files.ca)]
            )

        client = certs.get("client")
        base_rate, base_lat = await embedded(root, args.producers, args.seconds, body)
        print(describe("embedded store", base_rate, base_lat, None))
        with etcd_cluster(root / "etcd") as etcd:
            client_tls = NodeTls.load(client).client if client is not None else None
            h = await ClusterHarness(etcd.endpoints, root, "/bench/").start(
                nodes=3, managers=1, node_args=node_tls, client_tls=client_tls
            )
            try:
                pids = {}
                for mode in ("sync", "async"):
                    await h.create_queue(TENANT, mode, {"replication_factor": 3, "replication_mode": mode})
                    pids[mode] = await h.partition_of(TENANT, mode)

                    async def three(pid: int = pids[mode]) -> bool:
                        record = (await h.partitions()).get(pid)
                        return record is not None and len(record.replicas) == 3

                    await h.wait_for("three replicas", three)
                    await h.send_until_ok(pids[mode], TENANT, mode, "warm-up")
                for mode in ("sync", "async"):
                    cpu_before = nodes_cpu_s(h)
                    rate, lat = await cluster_sends(h, pids[mode], mode, args.producers, args.seconds, body)
                    cpu_per_send = (nodes_cpu_s(h) - cpu_before) / max(1, len(lat)) * 1e6
                    print(describe(f"cluster, RF 3, {mode}", rate, lat, base_rate), end="")
                    print(f"   nodes' CPU {cpu_per_send:4.0f} us/send")
                times = []
                for _ in range(args.kills):
                    times.append(await failover_time(h, pids["sync"], "sync"))
                    await asyncio.sleep(1.0)  # the killed node rejoins
                if times:
                    print(
                        "failover (SIGKILL -> first acknowledged send, lease TTL 2 s): "
                        + ", ".join(f"{t:.2f} s" for t in times)
                        + f"; median {statistics.median(times):.2f} s"
                    )
                for sig in (signal.SIGKILL, signal.SIGSTOP) if args.freezes else ():
                    took = [await gateway_failover(h, pids["sync"], "sync", sig) for _ in range(args.freezes)]
                    print(
                        f"failover through a gateway ({sig.name} -> first acknowledged send): "
                        + ", ".join(f"{t:.2f} s" for t in took)
                        + f"; median {statistics.median(took):.2f} s"
                    )
                if args.kills:
                    sent, lost = await async_loss(h, pids["async"], "async")
                    print(f"async, leader SIGKILLed mid-stream: {lost} of {sent} acknowledged sends lost")
                if args.gateway_rounds and args.compare_batching and client is None:
                    await through_backend(h, args, body)
                if args.gateway_rounds:
                    await asyncio.to_thread(through_gateways, h, root, args, client)
            finally:
                await h.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--producers", type=int, default=32)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument(
        "--kills", type=int, default=3, help="failovers to time (0: none, and no async loss run)"
    )
    parser.add_argument(
        "--freezes", type=int, default=3, help="gateway-path failovers per signal (SIGKILL, SIGSTOP; 0: none)"
    )
    parser.add_argument("--gateway-rounds", type=int, default=3, help="alternating rounds through gateways")
    parser.add_argument(
        "--compare-batching",
        action="store_true",
        help="also a cluster gateway (and in-process rounds) without send batching",
    )
    parser.add_argument("--tls", action="store_true", help="mutual TLS on every node-protocol connection")
    asyncio.run(main(parser.parse_args()))
