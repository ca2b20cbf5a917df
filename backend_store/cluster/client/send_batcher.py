"""The gateway's sends to one partition, batched while a send to it is in flight.

Every ``ClusterBackend.send`` used to be its own node request: a frame, a future and a timer
in the gateway, a decode, a dispatch, a commit waiter and a reply at the leader. The leader
already commits concurrent requests together (one LMDB transaction, one replication
shipment), so what the cluster paid per *request* rather than per message was that framing
and asyncio machinery on both ends. Here sends to a partition are batched the way the
store's group-commit writer batches writes (Kafka's producer with ``linger.ms=0``): the
first send goes at once, in its caller's task; sends that arrive while it is in flight wait,
and go together as one request when it returns. No timer, so a lone sender waits for
nothing.

Semantics (docs/cluster.md, "Batched sends"):

- **Each caller gets its own results**, in its order: a request carries the callers' entries
  back to back in arrival order and its results are sliced back. Per-entry errors stay per
  entry. A request-level failure (``QueueNotFound``, ``Unavailable``, no answer) reaches
  every caller of the request, as it would have reached each alone. A request the node
  refused as malformed (``InvalidRequest``: an entry it cannot decode) or one the gateway
  could not encode is sent again caller by caller, so one caller's bad entry fails only that
  caller, as it did alone.
- **Retries.** ``PartitionCalls.call`` (partition_calls.py) retries a request whose outcome
  is unknown only when every message in it is safe to repeat (a dedupe id, or a ``content_dedupe`` queue). Safe and
  unsafe sends are batched in separate lanes, so merging never changes whether a send is
  retried.
- **Order.** A caller's entries stay contiguous and callers go in arrival order, so a FIFO
  group's order is what the callers see today (concurrent callers had no order between
  them before either; a caller's next send starts after its previous one returned).
- **Bounds.** A batched request holds at most ``max_messages`` entries and
  ``max_bytes`` (estimated) of them; a caller's own entries are never split (one caller over
  the bounds goes alone, as it did). At most ``max_waiting`` callers wait per lane; a caller
  past that sends on its own at once (the old path: no worse than before batching).
- **Cancellation.** A caller cancelled while waiting is dropped from its lane before its
  entries are sent. One cancelled while its request is in flight stops waiting; the request
  goes on for the others, and its entries may be stored (at-least-once, as when a caller
  is cancelled after its own request was written). The first caller's request runs in that
  caller's task, as before batching: cancelling it cancels that request only (the others
  wait in the lane, not in it), and the lane moves on.
- **Deadline.** A request's ``request_deadline_s`` counts from when its earliest caller
  called, not from when the request starts: waiting behind the one in flight spends the
  same budget a caller has alone.
- **Linger while busy** (``linger_s``, 5 ms by default: ``DEFAULT_LINGER_S``; Kafka's
  producer lingers 5 ms by default since 4.0). A node's CPU goes per commit round on each
  of three replicas more than per message, and with one request in flight per lane a
  partition commits once a round trip whatever the load (session 65: about 1 request a
  commit, 3 to 4 sends a request, at 350-420 sends a second on a 2-core dev cluster). So
  once a lane's requests carry several callers (it merged one within the last second), a
  caller that finds the lane free waits ``linger_s`` for others before its request goes, in
  a task of the lane's like the drain's.
  A lone sender, or one at a time, never merges and so never waits; a lingered request that
  carried one caller ends the lingering.
- **A pool partition's queues share a lane** (issue 49: one send to each of 10,000 queues
  was a node request each). Callers of one queue go as ``send``, as above; callers of
  several as one ``send_queues`` request, each caller's entries an entry of it naming its
  queue. An entry whose queue the leader has not applied (``not_leader``) or whose queue
  its store does not hold (``queue_not_found``: deleted) is answered so alone, nothing of it
  written, and its caller is sent again alone, off the lane, which waits for the queue or
  reports it gone as a lone send does; the request's other entries are served, and the
  lane's next request goes, meanwhile. A node that
  predates the operation answers ``invalid_request`` (unknown operation): every caller
  alone, as for a malformed request.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ...errors import InvalidRequest, PushgateError, QueueNotFound, Unavailable
from ...limits import MAX_BATCH
from ...types import NewMessage, QueueName, SendResult
from .partition_map import PartitionInfo

log = logging.getLogger("pushgate.cluster")

Results = list[SendResult | PushgateError]

# Entries per batched request: a few HTTP batches' worth. The leader's writer commits them in
# one transaction either way; this bounds one request's frame and its retry.
DEFAULT_MAX_MESSAGES = 4 * MAX_BATCH
# Estimated bytes per batched request, well under the wire's 16 MiB frame limit
# (wire.DEFAULT_MAX_FRAME) and the largest single message (1 MiB, max_message_bytes).
DEFAULT_MAX_BYTES = 2 * 1024 * 1024
# Requests under way per lane: while fewer are, a send goes at once. Measured (docs/cluster.md
# section 8): 2 or 4 cost the nodes more CPU per send than 1, as each request then carries
# fewer messages and the nodes' cost follows messages per commit.
DEFAULT_MAX_IN_FLIGHT = 1
# Callers waiting per lane before new ones bypass the batcher.
DEFAULT_MAX_WAITING = 4096
# How long a caller that finds a busy lane free waits for others (module docstring): on a
# 2-core dev cluster at 2,000 queues, 5 ms took 13-17% off the nodes' CPU a send
# (bench/README.md, "Session 65"). 15 ms took another 17-20% off the servers' CPU a send at
# 64 producers in session 74, at 2-4 ms of p50 paced at 400 a second, and no gain above
# the rounds' spread at 10,000 queues; it stays an option (docs/cluster.md, "Batched sends").
DEFAULT_LINGER_S = 0.005
# A lane that merged a request within this long lingers (its last state outlives the lane).
_BUSY_S = 1.0
_MAX_REMEMBERED = 1024
# Per entry on the wire beyond body and attributes (the list, flags, delay), a rough figure.
_ENTRY_OVERHEAD = 16


class PartitionCall(Protocol):
    """``PartitionCalls.call``: one operation on a partition's leader; ``since``: the
    monotonic time its deadline counts from (None: now)."""

    async def __call__(
        self,
        part: PartitionInfo,
        op: str,
        *,
        retry_unknown: bool = False,
        since: float | None = None,
        **kwargs: Any,
    ) -> Any: ...


@dataclass(eq=False, slots=True)
class _Waiter:
    part: PartitionInfo  # as its caller sees it: on a pool partition, bound to its queue
    queue: QueueName
    messages: Sequence[NewMessage]
    size: int
    future: asyncio.Future[Results]
    since: float  # when its caller called (time.monotonic): its deadline counts from here


@dataclass(eq=False, slots=True)
class _Lane:
    """The sends to one partition with one retry safety (on a pool partition, to any of its
    queues)."""

    safe: bool
    waiting: deque[_Waiter] = field(default_factory=deque)
    in_flight: int = 0  # requests of this lane under way (a caller's own, or a drain task's)


@dataclass(slots=True)
class BatchCounters:
    """What the batcher did, for benchmarks and tests (never reset)."""

    calls: int = 0  # ClusterBackend.send's per-partition sends (one per caller and partition)
    requests: int = 0  # node requests it made for them (first attempts; retries are inside)
    messages: int = 0
    merged: int = 0  # requests that carried more than one caller's entries
    bypassed: int = 0  # callers that went alone because their lane was full
    split: int = 0  # merged requests refused as malformed and sent again caller by caller
    queues: int = 0  # merged requests naming more than one queue (``send_queues``)
    alone: int = 0  # callers sent again alone after their queue was refused in one of those
    lingered: int = 0  # callers that found their lane free but busy and waited for others


_LaneKey = tuple[str, str, int, int | None, bool]


class SendBatcher:
    """Natural batching of sends per (partition, retry safety); see the module docstring."""

    def __init__(
        self,
        call: PartitionCall,
        *,
        enabled: bool = True,
        max_messages: int = DEFAULT_MAX_MESSAGES,
        max_bytes: int = DEFAULT_MAX_BYTES,
        max_waiting: int = DEFAULT_MAX_WAITING,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        linger_s: float = DEFAULT_LINGER_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._call = call
        self.enabled = enabled
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self.max_waiting = max_waiting
        self.max_in_flight = max_in_flight
        self.linger_s = linger_s
        self._clock = clock
        self.counters = BatchCounters()
        self._lanes: dict[_LaneKey, _Lane] = {}
        self._drains: set[asyncio.Task[None]] = set()
        # When each lane last sent a request of several callers (dropped by one of one caller).
        self._merged_at: dict[_LaneKey, float] = {}

    async def send(
        self, part: PartitionInfo, queue: QueueName, messages: Sequence[NewMessage], *, safe: bool
    ) -> Results:
        """Send ``messages`` to ``part`` (``safe``: each may be repeated; see the module
        docstring) and return their results, one per message, in order."""
        counters = self.counters
        counters.calls += 1
        if not self.enabled:
            return await self._request(part, queue, messages, safe)
        # A pool partition's queues share a lane (``part.id`` names the pool partition);
        # a queue's own partitions are told apart by the queue's incarnation.
        key = (
            (part.tenant, "", part.id, None, safe)
            if part.placed
            else (part.tenant, part.queue, part.index, part.queue_revision, safe)
        )
        lane = self._lanes.get(key)
        if lane is None:
            lane = self._lanes[key] = _Lane(safe)
        if lane.in_flight < self.max_in_flight and self._busy(key):
            # A free slot on a busy lane: wait for others in a task of the lane's.
            lane.in_flight += 1
            counters.lingered += 1
            self._start_drain(key, lane, self.linger_s)
        elif lane.in_flight < self.max_in_flight:
            # A free slot (then nobody waits): go at once, in this task (no task or timer
            # for a lone sender).
            lane.in_flight += 1
            try:
                return await self._request(part, queue, messages, safe)
            finally:
                self._next(key, lane)
        elif len(lane.waiting) >= self.max_waiting:
            counters.bypassed += 1
            return await self._request(part, queue, messages, safe)
        future: asyncio.Future[Results] = asyncio.get_running_loop().create_future()
        lane.waiting.append(_Waiter(part, queue, messages, _size(messages), future, time.monotonic()))
        # Cancelling the caller cancels the future: a waiter not taken yet is skipped, one
        # in flight has its results dropped.
        return await future

    # Internals ----------------------------------------------------------------------

    async def _request(
        self,
        part: PartitionInfo,
        queue: QueueName,
        messages: Sequence[NewMessage],
        safe: bool,
        since: float | None = None,
    ) -> Results:
        self.counters.requests += 1
        self.counters.messages += len(messages)
        results: Results = await self._call(
            part, "send", retry_unknown=safe, since=since, queue=queue, messages=messages
        )
        return results

    def _busy(self, key: _LaneKey) -> bool:
        if self.linger_s <= 0:
            return False
        merged_at = self._merged_at.get(key)
        if merged_at is None:
            return False
        if self._clock() - merged_at < _BUSY_S:
            return True
        del self._merged_at[key]
        return False

    def _note_merged(self, key: _LaneKey, callers: int) -> None:
        if callers > 1:
            now = self._clock()
            if len(self._merged_at) >= _MAX_REMEMBERED:  # lanes of queues long gone
                self._merged_at = {k: t for k, t in self._merged_at.items() if now - t < _BUSY_S}
            self._merged_at[key] = now
        else:
            self._merged_at.pop(key, None)

    def _start_drain(self, key: _LaneKey, lane: _Lane, linger_s: float = 0.0) -> None:
        task = asyncio.get_running_loop().create_task(self._drain(key, lane, linger_s))
        self._drains.add(task)
        task.add_done_callback(self._drains.discard)

    def _next(self, key: _LaneKey, lane: _Lane) -> None:
        """One of the lane's requests returned: its slot sends what waits, or is freed."""
        _drop_cancelled(lane.waiting)
        if lane.waiting:
            self._start_drain(key, lane)
            return
        lane.in_flight -= 1
        if lane.in_flight == 0 and self._lanes.get(key) is lane:
            del self._lanes[key]  # a lane lives while it has work: no map of every partition ever sent to

    async def _drain(self, key: _LaneKey, lane: _Lane, linger_s: float = 0.0) -> None:
        try:
            if linger_s > 0:
                await asyncio.sleep(linger_s)
            while True:
                _drop_cancelled(lane.waiting)
                if not lane.waiting:
                    break
                batch = self._take(lane)
                self._note_merged(key, len(batch))
                await self._flush(lane, batch)
        finally:
            # Only if this task was cancelled do callers still wait: _next hands them on.
            self._next(key, lane)

    def _take(self, lane: _Lane) -> list[_Waiter]:
        """The waiters of the next request: whole callers in arrival order, within the bounds
        (the first always, whatever its size)."""
        batch = [lane.waiting.popleft()]
        count, size = len(batch[0].messages), batch[0].size
        waiting = lane.waiting
        while waiting:
            nxt = waiting[0]
            if nxt.future.done():
                waiting.popleft()
                continue
            if count + len(nxt.messages) > self.max_messages or size + nxt.size > self.max_bytes:
                break
            batch.append(waiting.popleft())
            count += len(nxt.messages)
            size += nxt.size
        return batch

    async def _flush(self, lane: _Lane, batch: list[_Waiter]) -> None:
        first = batch[0]
        if len(batch) > 1:
            self.counters.merged += 1
        if any(w.queue != first.queue for w in batch):
            await self._flush_queues(lane, batch)
            return
        messages = [m for w in batch for m in w.messages] if len(batch) > 1 else list(first.messages)
        try:
            results = await self._request(first.part, first.queue, messages, lane.safe, first.since)
        except (InvalidRequest, TypeError, ValueError) as exc:
            if len(batch) == 1:
                _fail(first, exc)
                return
            # Malformed as a whole (the node could not decode an entry, or we could not
            # encode one): nothing was applied; each caller alone, so only the culprit fails.
            await self._split(lane, batch)
            return
        except Exception as exc:
            for waiter in batch:
                _fail(waiter, exc)
            return
        if not _answered(batch, len(results), len(messages), "results", "messages"):
            return
        start = 0
        for waiter in batch:
            end = start + len(waiter.messages)
            _succeed(waiter, results[start:end])
            start = end

    async def _flush_queues(self, lane: _Lane, batch: list[_Waiter]) -> None:
        """Callers sending to several queues of one pool partition: one ``send_queues``
        request, a caller's entries an entry of it. A queue the leader refused in it (not
        made there yet, or deleted) has its caller sent again alone, which waits for the
        queue or says it is gone as a lone send does."""
        counters = self.counters
        counters.queues += 1
        counters.requests += 1
        counters.messages += sum(len(w.messages) for w in batch)
        first = batch[0]
        try:
            results = await self._call(
                first.part,
                "send_queues",
                retry_unknown=lane.safe,
                since=first.since,
                sends=[(w.queue, w.messages) for w in batch],
            )
        except (InvalidRequest, TypeError, ValueError, QueueNotFound):
            # Malformed (a node that predates ``send_queues`` answers invalid_request: an
            # unknown operation), or the first caller's queue is gone: nothing was applied.
            await self._split(lane, batch)
            return
        except Exception as exc:
            for waiter in batch:
                _fail(waiter, exc)
            return
        if not _answered(batch, len(results), len(batch), "entries", "sends"):
            return
        refused: list[_Waiter] = []
        for waiter, result in zip(batch, results, strict=True):
            if isinstance(result, PushgateError):
                refused.append(waiter)
            elif len(result) != len(waiter.messages):
                _fail(
                    waiter,
                    Unavailable(f"node answered {len(result)} results for {len(waiter.messages)} messages"),
                )
            else:
                _succeed(waiter, result)
        counters.alone += len(refused)
        for waiter in refused:
            # Off the lane, each in a task of its own: a lone send may wait for its queue (a
            # new one the leader has not applied yet), and the partition's other queues must
            # not wait with it.
            task = asyncio.get_running_loop().create_task(self._alone(lane.safe, waiter))
            self._drains.add(task)
            task.add_done_callback(self._drains.discard)

    async def _split(self, lane: _Lane, batch: list[_Waiter]) -> None:
        self.counters.split += 1
        for waiter in batch:
            await self._alone(lane.safe, waiter)

    async def _alone(self, safe: bool, waiter: _Waiter) -> None:
        if waiter.future.done():
            return
        try:
            own = await self._request(waiter.part, waiter.queue, waiter.messages, safe, waiter.since)
        except Exception as alone:
            _fail(waiter, alone)
        else:
            _succeed(waiter, own)


def _size(messages: Sequence[NewMessage]) -> int:
    total = 0
    for m in messages:
        total += len(m.body) + _ENTRY_OVERHEAD
        if m.attributes:
            total += sum(len(k) + len(v) for k, v in m.attributes.items())
        if m.group_id is not None:
            total += len(m.group_id)
        if m.dedupe_id is not None:
            total += len(m.dedupe_id)
    return total


def _drop_cancelled(waiting: deque[_Waiter]) -> None:
    while waiting and waiting[0].future.done():
        waiting.popleft()


def _succeed(waiter: _Waiter, results: Results) -> None:
    if not waiter.future.done():
        waiter.future.set_result(results)


def _answered(batch: list[_Waiter], got: int, asked: int, answers: str, questions: str) -> bool:
    """Whether a node answered as many ``answers`` as it was asked ``questions``; if not (a
    node bug), every caller fails: nobody is handed someone else's results."""
    if got == asked:
        return True
    problem = Unavailable(f"node answered {got} {answers} for {asked} {questions}")
    for waiter in batch:
        _fail(waiter, problem)
    return False


def _fail(waiter: _Waiter, exc: BaseException) -> None:
    if not waiter.future.done():
        waiter.future.set_exception(exc)
