"""The sampler: reads every queue's stats every few seconds (and soon after a send)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from backend_store.backend import Backend, StorageStats
from backend_store.errors import PushgateError
from backend_store.types import QueueAttributes, QueueInfo, QueueName, QueueStats, StorageUsage, TenantId

from .cluster_sample import cluster_from_doc
from .history import DepthHistory, StorageHistory
from .rates import RateHistory
from .snapshot import QueueSample, Snapshot

log = logging.getLogger("pushgate.monitor")

SampleListener = Callable[[Snapshot], Awaitable[None]]
# Distinct attribute documents kept for sharing; past this many the memo starts afresh.
_ATTRIBUTE_DOCS = 4096
# Queues read a page at a time (``_read``): 10,000 read and sampled at once held a gateway's
# event loop 80-130 ms every 20 s, and its requests with it (session 85).
PAGE_SIZE = 1000
# Seconds of timer pace a queue sampled (timer_gap): the default 5 s up to 2,500 queues, 20 s
# at 10,000.
S_PER_QUEUE = 0.002


@dataclass(eq=False)
class MonitorSources:
    """What the sampler reads, injected by the gateway (the monitor imports no gateway code).

    ``tenants`` lists every tenant; ``consumers`` counts a queue's push subscribers and
    ``delivered`` the deliveries this gateway made from it; ``cluster`` returns API.md's
    ``GET /v1/cluster`` document (with what the gateway adds for the console: drain
    requests, replica positions), or None without a cluster.
    """

    backend: Backend
    tenants: Callable[[], Awaitable[list[str]]]
    consumers: Callable[[TenantId, QueueName], int] = lambda tenant, queue: 0
    delivered: Callable[[TenantId, QueueName], int] = lambda tenant, queue: 0
    cluster: Callable[[], Awaitable[Mapping[str, Any] | None]] | None = None
    clock: Callable[[], float] = field(default=time.time)


class QueueSampler:
    """Samples on a timer; while someone watches live, a store change (a send) brings the
    next sample forward.

    ``interval_s`` is the slowest pace, longer for a large store (``s_per_queue`` a queue
    sampled: see :func:`timer_gap`); ``min_gap_s`` the fastest (a burst of sends watched
    live causes at most one sample per gap). Sampling never takes more than a tenth of the
    time: after a sample that took ``d`` seconds the next waits at least ``10 d`` (a store
    with many queues is sampled less often rather than slowing the gateway). Nor does a
    sample hold the event loop for long: it reads ``page_size`` queues at a time and adds
    to the histories a thousand at a time, letting the gateway's requests run between.
    Each sample goes to every listener in turn (the alert engine, live console pages).
    """

    # Sampling's share of the time at most: the gap after a sample is at least duration / DUTY.
    DUTY = 0.1

    def __init__(
        self,
        sources: MonitorSources,
        *,
        interval_s: float = 5.0,
        min_gap_s: float = 0.5,
        s_per_queue: float = S_PER_QUEUE,
        history: DepthHistory | None = None,
        page_size: int = PAGE_SIZE,
    ) -> None:
        self.sources = sources
        self.page_size = page_size
        self.interval_s = interval_s
        self.s_per_queue = s_per_queue
        self.min_gap_s = min(min_gap_s, interval_s)
        self.history = history or DepthHistory()
        self.rates = RateHistory(self.history.span_s, self.history.step_s)
        self.storage_history = StorageHistory(self.history.span_s, self.history.step_s)
        self.latest = Snapshot(at=0.0)
        self.listeners: list[SampleListener] = []
        self._poke = asyncio.Event()
        self._sampled = asyncio.Condition()
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self.samples_taken = 0
        self.stopped = False
        # Live console streams open now: only they need samples sooner than interval_s.
        self.watchers = 0
        self.last_duration_s = 0.0
        self._attribute_docs: dict[QueueAttributes, Mapping[str, Any]] = {}

    # Reading ------------------------------------------------------------------

    async def sample(self, max_age_s: float | None = None) -> Snapshot:
        """Read everything now, update ``latest`` and the history, tell listeners.

        With ``max_age_s``, a sample someone else finished while this call waited for the
        lock is good enough (concurrent page loads and scrapes share one read).
        """
        async with self._lock:
            if max_age_s is not None and self.sources.clock() - self.latest.at <= max_age_s:
                return self.latest
            snapshot = await self._read()
            self.latest = snapshot
            for _ in self.history.adding(snapshot.at, snapshot.queues):
                await asyncio.sleep(0)
            for _ in self.rates.adding(snapshot.at, snapshot.queues):
                await asyncio.sleep(0)
            self.storage_history.add(snapshot.at, _stored(snapshot))
            self.samples_taken += 1
        for listener in list(self.listeners):
            try:
                await listener(snapshot)
            except Exception:
                log.exception("sample listener %r failed", listener)
        async with self._sampled:
            self._sampled.notify_all()
        return snapshot

    async def fresh(self, max_age_s: float) -> Snapshot:
        """``latest`` if younger than ``max_age_s``, else a new sample (scrapes, page loads)."""
        if self.sources.clock() - self.latest.at <= max_age_s:
            return self.latest
        return await self.sample(max_age_s)

    async def next_sample(self, after: float, timeout: float) -> Snapshot | None:
        """Wait (up to ``timeout``) for a snapshot taken after ``after``; return the latest,
        or None once the sampler has stopped (shutdown)."""
        async with self._sampled:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._sampled.wait_for(lambda: self.latest.at > after or self.stopped)
        return None if self.stopped else self.latest

    async def _read(self) -> Snapshot:
        src = self.sources
        prev = self.latest
        now = src.clock()
        elapsed = now - prev.at if prev.at > 0 else 0.0
        queues: list[QueueSample] = []
        changed: list[QueueSample] = []
        tenants = await src.tenants()
        for tenant in tenants:
            # A page at a time, as GET /v1/queues reads: the store's reading and the
            # samples' making of one page hold the event loop, not a whole tenant's.
            after = ""
            while True:
                page = await src.backend.list_queues(TenantId(tenant), after=after, limit=self.page_size)
                for info in page:
                    before = prev.queue(info.tenant, info.name)
                    sample = self._sample_of(
                        info,
                        src.consumers(info.tenant, info.name),
                        src.delivered(info.tenant, info.name),
                        before,
                        elapsed,
                    )
                    queues.append(sample)
                    if sample is not before:
                        changed.append(sample)
                if len(page) < self.page_size:
                    break
                after = page[-1].name
        storage: StorageUsage | None = None
        if isinstance(src.backend, StorageStats):
            storage = await src.backend.storage_usage()
        cluster_doc = await src.cluster() if src.cluster is not None else None
        cluster = cluster_from_doc(cluster_doc)
        return Snapshot(
            at=now,
            queues=tuple(queues),
            storage=storage,
            nodes=cluster.nodes,
            cluster=cluster_doc is not None,
            partitions=cluster.partitions,
            identity=cluster.identity,
            tenants=tuple(tenants),
            changed=tuple(changed),
            previous_at=prev.at,
        )

    def _sample_of(
        self, info: QueueInfo, consumers: int, delivered: int, before: QueueSample | None, elapsed: float
    ) -> QueueSample:
        """The queue's sample: ``before`` itself when nothing about the queue changed and its
        rates were already 0 (at thousands of queues most are idle, and an idle queue then
        costs a sampling tick one comparison and no objects, nor any alert evaluation:
        ``Snapshot.changed``), else a new one with its rates since ``before``."""
        s, attributes = info.stats, self._attributes_doc(info.attributes)
        if (
            before is not None
            and before.attributes is attributes
            and before.consumers == consumers
            and before.delivered_total == delivered
            and (before.visible, before.in_flight, before.delayed, before.oldest_age_s)
            == (s.visible, s.in_flight, s.delayed, s.oldest_age_s)
            and (before.sent_total, before.acked_total, before.dead_lettered_total)
            == (s.sent_total, s.acked_total, s.dead_lettered_total)
            and not (before.send_rate or before.ack_rate or before.delivered_rate or before.dead_letter_rate)
        ):
            return before
        if before is None or elapsed <= 0:
            return QueueSample.of(info, consumers, delivered, attributes)
        return QueueSample.of(info, consumers, delivered, attributes, _rates(s, delivered, before, elapsed))

    def _attributes_doc(self, attributes: QueueAttributes) -> Mapping[str, Any]:
        """One shared document per distinct set of attributes (most queues share a few)."""
        doc = self._attribute_docs.get(attributes)
        if doc is None:
            if len(self._attribute_docs) >= _ATTRIBUTE_DOCS:
                self._attribute_docs.clear()
            doc = self._attribute_docs[attributes] = MappingProxyType(attributes.to_dict())
        return doc

    # Running ------------------------------------------------------------------

    def poke(self, tenant: TenantId | None = None, queue: QueueName | None = None) -> None:
        """Bring the next sample forward if someone watches (a backend listener: after a commit)."""
        if self.watchers:
            self._poke.set()

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        """Held by a live page's stream: sends then bring samples forward. A new watcher
        brings one forward too: its page was rendered from a sample up to a second old, and
        a change between the page load and the stream's start must not wait ``interval_s``."""
        self.watchers += 1
        self._poke.set()
        try:
            yield
        finally:
            self.watchers -= 1

    async def start(self) -> None:
        if self._task is None:
            self.sources.backend.add_listener(self.poke)
            self._task = asyncio.create_task(self._run(), name="pushgate-sampler")

    async def drain(self) -> None:
        """Shutdown has begun: stop sampling and end every wait (live pages close their streams)."""
        self.stopped = True
        async with self._sampled:
            self._sampled.notify_all()
        await self.close()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            started = time.monotonic()
            self._poke.clear()  # a poke from now on (even during the read) brings the next one forward
            try:
                await self.sample()
            except PushgateError as exc:
                log.warning("sampling the store failed: %s", exc.detail)
            self.last_duration_s = time.monotonic() - started
            # At least min_gap_s (and DUTY) between samples, at most interval_s (or DUTY); a
            # poke ends the wait early.
            floor = max(self.min_gap_s, self.last_duration_s / self.DUTY)
            await asyncio.sleep(max(0.0, floor - self.last_duration_s))
            gap = timer_gap(self.interval_s, len(self.latest.queues), self.s_per_queue)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, gap - floor)):
                    await self._poke.wait()


def timer_gap(interval_s: float, queues: int, s_per_queue: float) -> float:
    """Seconds between samples nobody asked for: ``interval_s``, or ``s_per_queue`` a
    queue the last sample held if that is longer. A sample reads every queue's stats, in
    the gateway and, on a cluster, on every partition leader, whose CPU the duty cycle above
    does not see: at 10,000 queues, samples every 5 s and the stores' sweeps together cost
    the cluster 6-26% of its CPU a send (bench/README.md, session 62). RabbitMQ's answer to
    the same cost is to stop per-object statistics by default; here they stay, at a pace
    that keeps their cost a second about flat past ``interval_s / s_per_queue`` queues."""
    return max(interval_s, queues * s_per_queue)


def _rates(
    s: QueueStats, delivered: int, before: QueueSample, elapsed: float
) -> tuple[float, float, float, float]:
    """Sends, acks, deliveries and dead-letterings a second since ``before``. Built into the
    sample at once: a ``dataclasses.replace`` of each sample was a third of a sample's Python
    at 10,000 queues holding messages (each one's oldest age moves, so each is new)."""
    return (
        max(0, s.sent_total - before.sent_total) / elapsed,
        max(0, s.acked_total - before.acked_total) / elapsed,
        max(0, delivered - before.delivered_total) / elapsed,
        max(0, s.dead_lettered_total - before.dead_lettered_total) / elapsed,
    )


def _stored(snapshot: Snapshot) -> list[tuple[str, int]]:
    """Bytes stored, per node on a cluster (its published figure), else the store's."""
    if snapshot.cluster:
        return [(n.id, n.storage.used_bytes) for n in snapshot.nodes if n.storage is not None]
    return [] if snapshot.storage is None else [("store", snapshot.storage.used_bytes)]
