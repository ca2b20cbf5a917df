"""Send-to-push latency on the cluster, with and without standing receives.

Starts its own etcd (Debian's ``etcd``), 3 ``pushgate node`` processes and a ``pushgate
manager`` (the test harness in ``tests/cluster/processes.py``) and a gateway on
``cluster://`` in this process (its own thread and loop), creates a queue replicated three
times in ``sync`` mode, and subscribes one WebSocket consumer. Then, one message at a time
(the dispatcher idle before each), it times an HTTP send until the message arrives on the
WebSocket, and acks it:

- ``standing``: the dispatcher's demand waits on the partition's leader, which receives in
  the sending commit and pushes the message once that commit is replicated (one replicated
  commit per message);
- ``notify``: the gateway's engine is told it has no standing receive (what the cluster did
  before): the leader's ``Notify`` wakes the dispatcher, which sends a receive request, a
  second replicated commit.

Rounds alternate between the two so load on the machine hits both alike. Prints p50/p90/p99
of each and their ratio, the time until the send itself returned (stored and replicated),
and the log entries each message cost its partition (from the positions nodes publish).
Sends go straight into the gateway's store on its loop, not over HTTP, whose own round trip
(tens of milliseconds on this machine, the same in both modes) would hide the difference.

    .venv/bin/python bench/standing_bench.py --messages 200 --rounds 4
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
from pathlib import Path
from typing import Any

import httpx
import orjson
from websockets.asyncio.client import connect
from websockets.typing import Subprotocol

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backend_store.backend import StandingReceive
from backend_store.types import NewMessage, QueueName, SendResult, TenantId
from gateway.settings import Settings
from tests.cluster.processes import ClusterHarness
from tests.fixtures.etcd_server import etcd_cluster
from tests.gateway.conftest import RunningGateway

QUEUE = "latency"


def percentiles(values: list[float]) -> str:
    ordered = sorted(values)

    def at(p: float) -> float:
        return ordered[min(len(ordered) - 1, int(p * len(ordered)))] * 1000

    return f"p50 {at(0.5):6.2f} ms  p90 {at(0.9):6.2f} ms  p99 {at(0.99):6.2f} ms"


async def round_trip(
    gateway: RunningGateway, ws: Any, count: int, idle_s: float
) -> tuple[list[float], list[float]]:
    pushed: list[float] = []
    stored: list[float] = []
    backend = gateway.services.backend
    for i in range(count):
        await asyncio.sleep(idle_s)  # the dispatcher goes idle (and, if it can, stands)
        started = time.perf_counter()
        # Straight into the gateway's store, on its loop: HTTP's own round trip (tens of ms
        # here, the same in both modes) would hide what the store path costs.
        coro = backend.send(TenantId("default"), QueueName(QUEUE), [NewMessage(f"m{i}".encode())])
        send = asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, gateway.loop))
        while True:
            frame = orjson.loads(await ws.recv())
            if frame["op"] == "message":
                break
        pushed.append(time.perf_counter() - started)
        [result] = await send
        stored.append(time.perf_counter() - started)
        assert isinstance(result, SendResult), result
        await ws.send(
            orjson.dumps({"op": "ack", "receipts": [frame["message"]["receipt"]], "id": i}).decode()
        )
        while orjson.loads(await ws.recv()).get("id") != i:
            pass
    return pushed, stored


async def settled_lsn(client: httpx.AsyncClient) -> int:
    """The queue's partitions' leader LSNs summed, once nodes have published them (positions
    go to etcd at most every 0.5 s): two reads 1.2 s apart that agree."""
    previous = -1
    while True:
        doc = (await client.get("/v1/cluster")).json()
        total = int(sum(p["lsn"] for p in doc["partitions"] if p["queue"] == QUEUE))
        if total == previous:
            return total
        previous = total
        await asyncio.sleep(1.2)


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="pushgate-standing-bench-") as tmp:
        root = Path(tmp)
        print(f"python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} cpus")
        print(
            f"3 nodes on loopback, RF {args.rf} {args.mode}, {args.partitions} partition(s); one message at a time"
        )
        with etcd_cluster(root / "etcd") as etcd:
            h = await ClusterHarness(etcd.endpoints, root, "/bench/").start(nodes=3, managers=1)
            gateway: RunningGateway | None = None
            try:
                url = f"cluster://{','.join(etcd.endpoints)}/bench/"
                settings = Settings(data_dir=root / "gateway", store_url=url, log_level="warning")
                gateway = await asyncio.to_thread(RunningGateway(settings).start)
                engine = gateway.services.engine
                standing = engine.standing
                assert isinstance(standing, StandingReceive), "the cluster backend has no standing receives"
                headers = {"Authorization": f"Bearer {gateway.admin_key}"}
                async with httpx.AsyncClient(base_url=gateway.url, headers=headers, timeout=30) as client:
                    attributes = {
                        "replication_factor": args.rf,
                        "replication_mode": args.mode,
                        "partitions": args.partitions,
                    }
                    response = await client.put(f"/v1/queues/{QUEUE}", json=attributes)
                    assert response.status_code == 201, response.text
                    ws_url = gateway.url.replace("http", "ws", 1) + "/v1/ws"
                    async with connect(
                        ws_url, subprotocols=[Subprotocol("pushgate.v1")], additional_headers=headers
                    ) as ws:
                        await ws.send(
                            orjson.dumps(
                                {"op": "subscribe", "queue": QUEUE, "id": "s", "prefetch": 10}
                            ).decode()
                        )
                        assert orjson.loads(await ws.recv())["op"] == "ok"
                        await round_trip(gateway, ws, 20, args.idle_s)  # warm-up
                        results: dict[str, tuple[list[float], list[float]]] = {
                            "standing": ([], []),
                            "notify": ([], []),
                        }
                        entries = {"standing": 0, "notify": 0}
                        per_round = max(1, args.messages // args.rounds)
                        for _ in range(args.rounds):
                            for mode in ("standing", "notify"):
                                engine.standing = standing if mode == "standing" else None
                                # Not counted: a demand registered before the switch may serve it.
                                await round_trip(gateway, ws, 1, args.idle_s)
                                lsn = await settled_lsn(client)
                                pushed, created = await round_trip(gateway, ws, per_round, args.idle_s)
                                entries[mode] += await settled_lsn(client) - lsn
                                results[mode][0].extend(pushed)
                                results[mode][1].extend(created)
                        engine.standing = standing
                for mode, (pushed, created) in results.items():
                    print(f"{mode:9s} send->push {percentiles(pushed)}   send->stored {percentiles(created)}")
                    per = entries[mode] / len(pushed)
                    print(f"{'':9s} log entries per message (send, receive, ack): {per:.2f}")
                ratio = statistics.median(results["standing"][0]) / statistics.median(results["notify"][0])
                print(f"standing / notify, median send->push: {ratio:.2f}")
            finally:
                if gateway is not None:
                    await asyncio.to_thread(gateway.stop)
                await h.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=200, help="per mode, over all rounds")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--partitions", type=int, default=1)
    parser.add_argument("--rf", type=int, default=3, help="replication factor")
    parser.add_argument("--mode", default="sync", choices=["sync", "async"])
    parser.add_argument("--idle-s", type=float, default=0.02, help="pause before each send")
    asyncio.run(main(parser.parse_args()))
