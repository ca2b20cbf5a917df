"""What the failure tests run against a cluster and check afterwards: concurrent producers of
sync sends retried through failovers, and the wait for every replica to hold the same log.
"""

from __future__ import annotations

import asyncio
import collections

from backend_store.types import PeekedMessage, SendResult

from .processes import ClusterHarness

T = "tenant-one"
Q = "orders"
RF3_SYNC = {"replication_factor": 3, "replication_mode": "sync", "partitions": 1}


async def has_replicas(h: ClusterHarness, pid: int, count: int) -> bool:
    record = (await h.partitions()).get(pid)
    return record is not None and len(record.replicas) == count


async def replicated_everywhere(h: ClusterHarness, partition: int, nodes: list[str]) -> int:
    """Wait until every named node publishes the same last LSN, and the same epoch of its
    last entry, as the leader; return the LSN. (Same LSN and epoch of an entry: same log up
    to it, by log matching; the LSN alone would pass a replica keeping a deposed leader's
    entries at the LSNs the new leader wrote.)"""

    async def same() -> int | None:
        records = await h.node_records()
        positions = {n: records[n].replicas.get(partition) for n in nodes if n in records}
        if len(positions) != len(nodes) or any(p is None for p in positions.values()):
            return None
        ends = {(p.lsn, p.last_epoch) for p in positions.values() if p is not None}
        return ends.pop()[0] if len(ends) == 1 else None

    lsn: int = await h.wait_for(f"{nodes} to hold the same log", same)
    return lsn


class Producers:
    """Concurrent producers of sync sends, each retried (same dedupe id) until acknowledged.

    They send while fewer than ``headroom`` messages beyond what :meth:`more` last asked for
    were begun, so sends are in flight whenever a test acts (a kill, a cut) and the total
    stays within what one peek reads back (1,000), however fast the machine."""

    def __init__(self, h: ClusterHarness, pid: int, count: int = 4, headroom: int = 40) -> None:
        self.h, self.pid, self.count, self.headroom = h, pid, count, headroom
        self.acknowledged: list[str] = []
        self.results: dict[str, SendResult] = {}  # what each acknowledgement said (id, seq)
        self._next = iter(range(10**6))
        self._begun = 0
        self._allowed = 0
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._stop.clear()
        self._tasks = [asyncio.create_task(self._produce()) for _ in range(self.count)]

    async def _produce(self) -> None:
        while not self._stop.is_set():
            if self._begun >= self._allowed:
                await asyncio.sleep(0.01)
                continue
            self._begun += 1
            body = f"m{next(self._next)}"
            self.results[body] = await self.h.send_until_ok(self.pid, T, Q, body)
            self.acknowledged.append(body)

    async def more(self, count: int, what: str) -> None:
        target = len(self.acknowledged) + count
        self._allowed = max(self._allowed, target + self.headroom)

        async def reached() -> bool:
            return len(self.acknowledged) >= target

        await self.h.wait_for(what, reached)

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)

    def check(self, received: list[str]) -> None:
        """Every acknowledged message was received; none twice (every retry had its dedupe id)."""
        missing = set(self.acknowledged) - set(received)
        assert not missing, f"{len(missing)} acknowledged messages lost: {sorted(missing)[:10]}"
        counts = collections.Counter(received)
        assert [b for b, n in counts.items() if n > 1] == []


def check_acknowledged_in_place(acknowledged: dict[str, SendResult], log: list[PeekedMessage]) -> None:
    """Every acknowledged message is in the final log as the acknowledgement described it: same
    id, same seq (its place in the partition's order). Two leaders acknowledging at once would
    hand out one seq twice or an entry the surviving log lacks; a retry deduped on a new leader
    is acknowledged with the original's id and seq, so it passes."""
    final = {m.body.decode(): (m.id, m.seq) for m in log}
    moved = {
        body: (result.id, result.seq, final.get(body))
        for body, result in acknowledged.items()
        if final.get(body) != (result.id, result.seq)
    }
    assert not moved, f"{len(moved)} acknowledged messages lost or moved (acked id, seq, final): {moved}"
