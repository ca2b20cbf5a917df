"""SIGKILL to a real `pushgate serve` while producers send and consumers ack over HTTP: after
a restart every acknowledged send nobody tried to ack is there, and no acknowledged ack is
undone.

The gateway's embedded store journals (docs/store.md, "Durability"): the kill lands between
checkpoints, so the restart writes the checkpoint's meta pages back and replays the journal.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx

from backend_store.lmdb_store import checkpoint
from tests.conftest import scaled

from .processes import serve

PRODUCERS = 8
CONSUMERS = 4


async def produce(http: httpx.AsyncClient, name: int, acked: set[str], stop: asyncio.Event) -> None:
    """Send to ``jobs`` (consumed) and ``kept`` (never consumed) in turn."""
    n = 0
    while not stop.is_set():
        queue = ("jobs", "kept")[n % 2]
        body = f"{queue}-{name}-{n}"
        try:
            r = await http.post(f"/v1/queues/{queue}/messages", json={"body": body})
        except httpx.HTTPError:
            return  # the gateway is gone
        if r.status_code == 201:
            acked.add(body)
        n += 1


async def consume(http: httpx.AsyncClient, attempted: set[str], acked: set[str], stop: asyncio.Event) -> None:
    """Receive and ack ``jobs``; ``attempted``: bodies an ack was sent for (the kill may cut
    its answer off after the ack was stored), ``acked``: bodies whose ack was answered."""
    while not stop.is_set():
        try:
            r = await http.post("/v1/queues/jobs/receive", json={"max": 10})
            messages = r.json()["messages"]
            if not messages:
                continue
            attempted.update(m["body"] for m in messages)
            a = await http.post("/v1/queues/jobs/ack", json={"receipts": [m["receipt"] for m in messages]})
        except (httpx.HTTPError, ValueError):
            return
        if a.status_code == 200:
            # A receipt whose visibility ran out fails; the others were deleted.
            failed = {f["receipt"] for f in a.json()["failed"]}
            acked.update(m["body"] for m in messages if m["receipt"] not in failed)


async def test_sigkill_loses_no_acknowledged_send_or_ack(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    proc = serve(data_dir)
    sent: set[str] = set()
    attempted: set[str] = set()
    acked: set[str] = set()
    try:
        assert proc.key is not None
        headers = {"Authorization": f"Bearer {proc.key}"}
        limits = httpx.Limits(max_connections=PRODUCERS + CONSUMERS)
        async with httpx.AsyncClient(base_url=proc.url, headers=headers, limits=limits) as http:
            await http.put("/v1/queues/jobs", json={"visibility_timeout_s": 1})
            await http.put("/v1/queues/kept", json={})
            stop = asyncio.Event()
            tasks = [asyncio.create_task(produce(http, i, sent, stop)) for i in range(PRODUCERS)]
            tasks += [asyncio.create_task(consume(http, attempted, acked, stop)) for _ in range(CONSUMERS)]
            deadline = time.monotonic() + scaled(60)
            while len(sent) < 400 or len(acked) < 60:
                assert time.monotonic() < deadline, f"only {len(sent)} sent, {len(acked)} acked"
                await asyncio.sleep(0.01)
            # Killed mid-run: the answers that arrived before it are what was promised.
            proc.stop()
            must_survive, promised_acks = set(sent) - attempted, set(acked)
            stop.set()
            await asyncio.gather(*tasks)
    finally:
        proc.stop()

    # The kill left the journaling run unclean: the restart recovers from its checkpoint.
    [checkpoint_file] = data_dir.rglob("checkpoint")
    saved = checkpoint.load(checkpoint_file.parent)
    assert saved is not None and not saved.clean
    again = serve(data_dir)
    try:
        key = (data_dir / "bootstrap-admin-key").read_text().strip()
        got: set[str] = set()
        async with httpx.AsyncClient(base_url=again.url, headers={"Authorization": f"Bearer {key}"}) as http:
            deadline = time.monotonic() + scaled(60)
            # Receives in flight at the kill come back once their 1 s of visibility ends.
            while not must_survive <= got:
                assert time.monotonic() < deadline, f"{len(must_survive - got)} acknowledged sends lost"
                for queue in ("jobs", "kept"):
                    r = await http.post(f"/v1/queues/{queue}/receive", json={"max": 100, "wait_s": 0.5})
                    messages = r.json()["messages"]
                    got.update(m["body"] for m in messages)
                    if messages:
                        receipts = [m["receipt"] for m in messages]
                        await http.post(f"/v1/queues/{queue}/ack", json={"receipts": receipts})
        resurrected = promised_acks & got
        assert not resurrected, f"{len(resurrected)} acknowledged acks were undone"
    finally:
        again.stop()
