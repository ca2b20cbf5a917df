"""The SQS API's throughput against the native ``/v1`` API, on one gateway, in one run.

Run: ``python bench/sqs_bench.py [--workers 8] [--rounds 100] [--size 1024] [--repeat 3]``

Each worker loops ``rounds`` times over the same cycle of three requests for ten messages:

- SQS: ``SendMessageBatch`` (10 entries), ``ReceiveMessage`` (``MaxNumberOfMessages`` 10),
  ``DeleteMessageBatch`` of what it received: the AWS JSON 1.0 protocol, each request signed
  with SigV4 by botocore's signer in the load process;
- ``/v1``: ``POST .../messages`` (a batch of 10), ``POST .../receive`` (``max`` 10), ``POST
  .../ack`` of the receipts: the same work through the native API, with a bearer key.

Both run against one ``pushgate serve`` (embedded store, every send fsynced), each API on a
queue of its own, alternately, ``--repeat`` times. It prints messages acked per second (wall)
and the gateway process's CPU per message (``/proc``), and their ratios SQS / ``/v1``: CPU per
message is the steadier figure on a shared machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
from botocore.auth import SigV4Auth  # type: ignore[import-untyped]
from botocore.awsrequest import AWSRequest  # type: ignore[import-untyped]
from botocore.credentials import Credentials  # type: ignore[import-untyped]

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from a checkout

from bench.push_common import cpu_seconds, machine, start_gateway, stop

REPO = Path(__file__).resolve().parents[1]
BATCH = 10


class SqsClient:
    """AWS JSON 1.0 requests signed with SigV4 (botocore's signer), sent with httpx."""

    def __init__(self, http: httpx.AsyncClient, url: str, access_key_id: str, secret: str) -> None:
        self.http = http
        self.url = url.rstrip("/") + "/"
        self.credentials = Credentials(access_key_id, secret)

    async def call(self, action: str, params: dict[str, Any]) -> dict[str, Any]:
        body = json.dumps(params).encode()
        request = AWSRequest(
            method="POST",
            url=self.url,
            data=body,
            headers={"Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": f"AmazonSQS.{action}"},
        )
        SigV4Auth(self.credentials, "sqs", "us-east-1").add_auth(request)
        answer = await self.http.post(self.url, content=body, headers=dict(request.headers.items()))
        answer.raise_for_status()
        out: dict[str, Any] = answer.json()
        return out


def sqs_cycle(client: SqsClient, queue_url: str, payload: str) -> Callable[[], Awaitable[int]]:
    entries = [{"Id": f"m{i}", "MessageBody": payload} for i in range(BATCH)]

    async def cycle() -> int:
        await client.call("SendMessageBatch", {"QueueUrl": queue_url, "Entries": entries})
        got = await client.call("ReceiveMessage", {"QueueUrl": queue_url, "MaxNumberOfMessages": BATCH})
        messages = got.get("Messages", [])
        if messages:
            delete = [{"Id": f"d{i}", "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)]
            await client.call("DeleteMessageBatch", {"QueueUrl": queue_url, "Entries": delete})
        return len(messages)

    return cycle


def v1_cycle(http: httpx.AsyncClient, queue: str, payload: str) -> Callable[[], Awaitable[int]]:
    batch = {"messages": [{"body": payload} for _ in range(BATCH)]}

    async def cycle() -> int:
        (await http.post(f"/v1/queues/{queue}/messages", json=batch)).raise_for_status()
        got = await http.post(f"/v1/queues/{queue}/receive", json={"max": BATCH})
        got.raise_for_status()
        receipts = [m["receipt"] for m in got.json()["messages"]]
        if receipts:
            (await http.post(f"/v1/queues/{queue}/ack", json={"receipts": receipts})).raise_for_status()
        return len(receipts)

    return cycle


async def run(cycles: list[Callable[[], Awaitable[int]]], rounds: int, pid: int) -> tuple[float, float]:
    """(messages acked per second, gateway CPU microseconds per message)."""

    async def worker(cycle: Callable[[], Awaitable[int]]) -> int:
        return sum([await cycle() for _ in range(rounds)])

    cpu0, t0 = cpu_seconds(pid), time.perf_counter()
    acked = sum(await asyncio.gather(*(worker(c) for c in cycles)))
    wall, cpu = time.perf_counter() - t0, cpu_seconds(pid) - cpu0
    return acked / wall, cpu / max(acked, 1) * 1e6


async def bench(url: str, key: str, aws: tuple[str, str], args: argparse.Namespace, pid: int) -> None:
    payload = "x" * args.size
    limits = httpx.Limits(max_connections=args.workers)
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, limits=limits, timeout=60) as http:
        for name in ("bench-v1", "bench-sqs"):
            (await http.put(f"/v1/queues/{name}", json={})).raise_for_status()
        sqs = SqsClient(http, url, *aws)
        queue_url = f"{url.rstrip('/')}/default/bench-sqs"
        v1 = [v1_cycle(http, "bench-v1", payload) for _ in range(args.workers)]
        sq = [sqs_cycle(sqs, queue_url, payload) for _ in range(args.workers)]
        await run(v1, 5, pid)  # warm both up
        await run(sq, 5, pid)
        print(
            f"{'round':>5} {'/v1 msg/s':>10} {'SQS msg/s':>10} {'ratio':>6} {'/v1 us/msg':>11} {'SQS us/msg':>11} {'ratio':>6}"
        )
        for i in range(args.repeat):
            v1_rate, v1_cpu = await run(v1, args.rounds, pid)
            sqs_rate, sqs_cpu = await run(sq, args.rounds, pid)
            print(
                f"{i + 1:>5} {v1_rate:>10,.0f} {sqs_rate:>10,.0f} {sqs_rate / v1_rate:>6.2f} "
                f"{v1_cpu:>11,.0f} {sqs_cpu:>11,.0f} {sqs_cpu / v1_cpu:>6.2f}"
            )


def aws_credentials(data_dir: Path) -> tuple[str, str]:
    done = subprocess.run(
        [
            *(sys.executable, "-m", "gateway.admin_cli", "--data", str(data_dir), "key", "create"),
            *("--tenant", "default", "--scope", "admin send:* receive:*", "--aws"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    created = json.loads(done.stdout)
    return created["aws_access_key_id"], created["aws_secret_access_key"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--workers", type=int, default=8, help="concurrent loops per API")
    parser.add_argument("--rounds", type=int, default=100, help="cycles of 10 messages per loop")
    parser.add_argument("--size", type=int, default=1024, help="body bytes")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(machine())
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp) / "data"
        proc, url, key = start_gateway(data_dir)
        try:
            asyncio.run(bench(url, key, aws_credentials(data_dir), args, proc.pid))
        finally:
            stop(proc)


if __name__ == "__main__":
    main()
