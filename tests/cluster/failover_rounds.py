"""One round of issue 48's failover sequence, shared by its real-process test
(test_failover_after_restarts.py) and its benchmark (bench/failover_rounds.py).

A new RF 3 sync queue, ``producers`` tasks sending plain messages (no dedupe id, as ``POST
/v1/queues/Q/messages`` without ``Idempotency-Key``) through a ``ClusterBackend``, as a
gateway does; once sends flow, the queue's leader gets ``sig``; the round measures from a
moment taken before the signal to the first acknowledged send begun after it (a send begun
before may be answered after, from what the leader did before the signal). A SIGKILLed
leader is then restarted with its own command line, as a supervisor would; a SIGSTOPped
one is resumed after ``hold_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from dataclasses import dataclass

from backend_store.cluster.client.cluster_backend import open_cluster_backend
from backend_store.errors import StaleEpoch, Unavailable
from backend_store.options import StoreOptions
from backend_store.types import NewMessage, QueueName, TenantId
from tests.conftest import scaled

from .processes import ClusterHarness

TENANT = "tenant-one"
RF3_SYNC = {"replication_factor": 3, "replication_mode": "sync", "partitions": 1}


@dataclass(frozen=True)
class Round:
    queue: str
    sig: signal.Signals
    victim: str
    partition: int
    took_s: float  # from before the signal to the first acknowledged send begun after it

    def __str__(self) -> str:
        return (
            f"{self.queue}: {self.sig.name} of {self.victim} (partition {self.partition}):"
            f" first acknowledged send after {self.took_s:.2f} s"
        )


async def failover_round(
    h: ClusterHarness,
    queue: str,
    sig: signal.Signals,
    *,
    producers: int = 16,
    hold_s: float = 6.0,
    restart_after_s: float | None = None,
    returning: str | None = None,
) -> Round:
    """``restart_after_s``: restart a SIGKILLed node this long after the kill, while the
    failover may be under way (a supervisor's quick restart); None: once sends resumed.
    ``returning``: a node that is down when the queue is created (so it is placed on the
    others) and started again once sends flow; the signal goes once it registered."""
    url = f"cluster://{','.join(h.endpoints)}{h.prefix}"
    backend = open_cluster_backend(url, StoreOptions())
    await backend.start()
    signalled = float("inf")
    acked: list[float] = []  # when sends begun after the signal were acknowledged
    flowing = asyncio.Event()
    progress = asyncio.Event()
    stop = asyncio.Event()
    sent = 0

    async def producer() -> None:
        nonlocal sent
        while not stop.is_set():
            began = time.monotonic()
            try:
                await backend.send(TenantId(TENANT), QueueName(queue), [NewMessage(b"x" * 100)])
            except (Unavailable, StaleEpoch):
                await asyncio.sleep(0.01)
                continue
            sent += 1
            if sent >= 100:
                flowing.set()
            if began > signalled:
                acked.append(time.monotonic())
                progress.set()

    tasks: list[asyncio.Task[None]] = []
    try:
        await backend.create_queue(TenantId(TENANT), QueueName(queue), RF3_SYNC)
        pid = await h.partition_of(TENANT, queue)
        tasks = [asyncio.create_task(producer()) for _ in range(producers)]
        await asyncio.wait_for(flowing.wait(), scaled(60))
        if returning is not None:
            h.nodes[returning].start()
            await h.wait_registered([returning])
        victim, _, _ = await h.serving_leader(pid)
        signalled = time.monotonic()
        h.nodes[victim].signal(sig)
        if sig == signal.SIGKILL and restart_after_s is not None:
            h.nodes[victim].kill()  # reaped
            await asyncio.sleep(restart_after_s)
            h.nodes[victim].start()
        if sig == signal.SIGSTOP:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(progress.wait(), hold_s)
            h.nodes[victim].signal(signal.SIGCONT)
        await asyncio.wait_for(progress.wait(), scaled(60))
        took = acked[0] - signalled
    finally:
        stop.set()
        await asyncio.gather(*tasks)
        await backend.close()
    if sig == signal.SIGKILL and restart_after_s is None:
        h.nodes[victim].kill()  # reaped
        h.nodes[victim].start()  # its own command line, as a supervisor restarts it
    if sig == signal.SIGKILL:
        await h.wait_registered([victim])
    return Round(queue, sig, victim, pid, took)
