"""Coalescing of acks, nacks and sends: many requests, one backend call per key and turn.

Each key (a tenant's shard for acks, a queue for sends) has one call under way (by
default); whatever arrives meanwhile waits and goes in the next call. The store
group-commits anyway, but fewer, bigger calls mean fewer rows of Python per message and no
task per request: a task exists only per key while it has work, and a caller that awaits
its answer and finds its key idle makes the call in its own coroutine
(:meth:`KeyedBatcher.add_inline`). Sends: :mod:`push.send_path`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Hashable, Sequence
from typing import Generic, Protocol, TypeVar

from backend_store.backend import ReceiptShards
from backend_store.errors import PushgateError
from backend_store.limits import MAX_RECEIPTS
from backend_store.types import AckResult, QueueName, ReceiptFailure, TenantId

from .observed import AckReply, QueueOf, SettledTally, observed_ack_reply
from .observer import ACK, NACK, Observer

logger = logging.getLogger("pushgate.push")

K = TypeVar("K", bound=Hashable)
I = TypeVar("I")  # noqa: E741 - an item, as in the typing docs


class KeyedBatcher(Generic[K, I]):
    """Runs :meth:`flush` with the items queued for a key, at most ``concurrency`` calls
    per key at a time; whatever arrives while they are all busy goes in the next call.

    Calls are submitted in arrival order and the store applies them in that order, so one
    producer's messages keep their order. One call at a time is the default: measured at
    2,000 msg/s, four at a time made more, smaller store operations (more CPU per message)
    and did not lower the send->push latency.
    """

    def __init__(self, concurrency: int = 1) -> None:
        self._concurrency = concurrency
        self._pending: dict[K, list[I]] = {}
        self._running: dict[K, int] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._inline = 0  # calls made in a caller's coroutine, under way
        self._idle: asyncio.Event | None = None

    def add(self, key: K, item: I) -> None:
        items = self._pending.get(key)
        if items is not None:
            items.append(item)
            return
        self._pending[key] = [item]
        running = self._running.get(key, 0)
        if running < self._concurrency:
            self._running[key] = running + 1
            self._start(key)

    async def add_inline(self, key: K, item: I) -> bool:
        """:meth:`add` for a caller that awaits the answer anyway: when ``key`` has nothing
        queued and room for a call, flush ``item`` now in this coroutine (no task) and
        return True once it is answered; else queue it and return False. Items that
        arrive meanwhile go in the next call, as with :meth:`add`."""
        running = self._running.get(key, 0)
        if key in self._pending or running >= self._concurrency:
            self.add(key, item)
            return False
        self._running[key] = running + 1
        self._inline += 1
        try:
            await self._flush_logged(key, [item])
        finally:
            self._inline -= 1
            if key in self._pending:
                self._start(key)  # what came meanwhile: the call slot passes to a task
            else:
                self._release(key)
            if not self._inline and self._idle is not None:
                self._idle.set()
        return True

    def _start(self, key: K) -> None:
        task = asyncio.get_running_loop().create_task(self._drain(key))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _drain(self, key: K) -> None:
        try:
            while items := self._pending.pop(key, None):
                await self._flush_logged(key, items)
        finally:
            self._release(key)

    def _release(self, key: K) -> None:
        left = self._running[key] - 1
        if left:
            self._running[key] = left
        else:
            del self._running[key]

    async def _flush_logged(self, key: K, items: list[I]) -> None:
        try:
            await self.flush(key, items)
        except Exception:
            # flush answers every item itself; this is a bug, not a store error.
            logger.exception("push batch failed")

    async def flush(self, key: K, items: list[I]) -> None:
        raise NotImplementedError

    async def wait_idle(self) -> None:
        """Return when nothing is queued or under way (used by shutdown and tests)."""
        while self._tasks or self._inline:
            if self._tasks:
                await asyncio.gather(*self._tasks, return_exceptions=True)
            else:
                self._idle = asyncio.Event()
                await self._idle.wait()
                self._idle = None


def _split_ack(receipts: Sequence[str], failed: dict[str, str]) -> AckResult:
    if not failed:
        return AckResult(acked=len(receipts), failed=[])
    mine = [ReceiptFailure(r, failed[r]) for r in receipts if r in failed]
    return AckResult(acked=len(receipts) - len(mine), failed=mine)


class Settles(Protocol):
    """What the ack batcher needs of a store: ``Backend``'s ack and nack."""

    async def ack(
        self, tenant: TenantId, receipts: Sequence[str], queue: QueueName | None = None
    ) -> AckResult:
        """See ``Backend.ack``."""

    async def nack(
        self, tenant: TenantId, receipts: Sequence[str], delay_s: float = 0, queue: QueueName | None = None
    ) -> AckResult:
        """See ``Backend.nack``."""


# An ack batch's key: the tenant, the shard (see ReceiptShards) and the nack delay (None: an ack).
AckKey = tuple[TenantId, int | None, float | None]
# How a request's receipts count in usage: the transport it came by and each receipt's queue.
# None: not counted (the gateway's own releases).
Counted = tuple[str, QueueOf]
AckItem = tuple[Sequence[str], AckReply | None, Counted | None]


class AckBatcher(KeyedBatcher[AckKey, AckItem]):
    """Acks (delay ``None``) and nacks (delay in seconds) per tenant and shard.

    A shard is what a backend settles on its own (a cluster partition: its leader); with
    the backend's optional :class:`~backend_store.backend.ReceiptShards` each shard has its
    own call in flight, so one slow or frozen shard holds up only its own receipts.
    A request whose receipts span shards is split, and answered once every part is.

    A request given ``counted`` is recorded with ``observer`` once the store answers
    (``ack`` or ``nack``, per queue and outcome): the requests of one call together, in
    one observer call per queue and outcome (:class:`~push.observed.SettledTally`).
    """

    def __init__(self, backend: Settles, observer: Observer | None = None) -> None:
        super().__init__()
        self._backend = backend
        self._observer = observer
        self._shards: ReceiptShards | None = backend if isinstance(backend, ReceiptShards) else None

    def ack(
        self,
        tenant: TenantId,
        receipts: Sequence[str],
        reply: AckReply | None = None,
        counted: Counted | None = None,
    ) -> None:
        self._add(tenant, None, receipts, reply, counted)

    def nack(
        self,
        tenant: TenantId,
        receipts: Sequence[str],
        delay_s: float = 0,
        reply: AckReply | None = None,
        counted: Counted | None = None,
    ) -> None:
        self._add(tenant, delay_s, receipts, reply, counted)

    def _add(
        self,
        tenant: TenantId,
        delay: float | None,
        receipts: Sequence[str],
        reply: AckReply | None,
        counted: Counted | None,
    ) -> None:
        if self._observer is None:
            counted = None
        shards = self._shards
        if shards is None:
            self.add((tenant, None, delay), (receipts, reply, counted))
            return
        shard_of = shards.receipt_shard
        first = shard_of(receipts[0]) if receipts else None
        by_shard: dict[int | None, list[str]] | None = None
        for i, receipt in enumerate(receipts):
            shard = shard_of(receipt)
            if by_shard is None:
                if shard == first:
                    continue
                by_shard = {first: list(receipts[:i])}
            by_shard.setdefault(shard, []).append(receipt)
        if by_shard is None:  # the common case: one shard
            self.add((tenant, first, delay), (receipts, reply, counted))
            return
        if counted is not None and self._observer is not None:
            # Counted once, as one request, when its parts are joined.
            transport, queue_of = counted
            operation = ACK if delay is None else NACK
            reply = observed_ack_reply(
                self._observer, tenant, operation, transport, receipts, queue_of, reply
            )
        joined = None if reply is None else _JoinedReply(receipts, len(by_shard), reply)
        for shard, part in by_shard.items():
            self.add((tenant, shard, delay), (part, None if joined is None else joined.part(part), None))

    async def flush(self, key: AckKey, items: list[AckItem]) -> None:
        tenant, _, delay = key
        receipts = [r for rs, _, _ in items for r in rs]
        failed: dict[str, str] = {}
        try:
            for start in range(0, len(receipts), MAX_RECEIPTS):
                chunk = receipts[start : start + MAX_RECEIPTS]
                if delay is None:
                    result = await self._backend.ack(tenant, chunk)
                else:
                    result = await self._backend.nack(tenant, chunk, delay)
                failed.update((f.receipt, f.code) for f in result.failed)
        except Exception as exc:
            if not isinstance(exc, PushgateError):
                logger.exception("ack/nack failed")
            self._record(tenant, delay, items, failed, exc)
            for _, reply, _ in items:
                if reply is not None:
                    reply(exc)
            return
        self._record(tenant, delay, items, failed, None)
        # Requests of as many receipts that all settled hear the same (immutable) result.
        settled: dict[int, AckResult] = {}
        for rs, reply, _ in items:
            if reply is None:
                continue
            if failed:
                reply(_split_ack(rs, failed))
                continue
            shared = settled.get(len(rs))
            if shared is None:
                shared = settled[len(rs)] = AckResult(len(rs), [])
            reply(shared)

    def _record(
        self,
        tenant: TenantId,
        delay: float | None,
        items: list[AckItem],
        failed: dict[str, str],
        error: Exception | None,
    ) -> None:
        """Usage of a call's counted requests, before they are answered (as a request alone is)."""
        observer = self._observer
        if observer is None:
            return
        tally = SettledTally(tenant, ACK if delay is None else NACK)
        for rs, _, counted in items:
            if counted is None:
                continue
            if error is None:
                tally.add(counted[0], rs, counted[1], failed)
            else:
                tally.add_error(counted[0], rs, counted[1], error)
        tally.report(observer)


class _JoinedReply:
    """One request's reply, given once the part of each of its shards is answered: acked
    counts summed, failures joined in the request's order. A part whose call failed lists
    its receipts as failed with the error's code (other shards' receipts did settle); when
    every part failed, the reply is the first error."""

    __slots__ = ("acked", "error", "errored", "failed", "left", "parts", "receipts", "reply")

    def __init__(self, receipts: Sequence[str], parts: int, reply: AckReply) -> None:
        self.receipts = receipts
        self.parts = self.left = parts
        self.errored = 0
        self.reply = reply
        self.acked = 0
        self.failed: list[ReceiptFailure] = []
        self.error: BaseException | None = None

    def part(self, receipts: Sequence[str]) -> AckReply:
        def answered(result: AckResult | BaseException) -> None:
            if isinstance(result, AckResult):
                self.acked += result.acked
                self.failed.extend(result.failed)
            else:
                self.errored += 1
                if self.error is None:
                    self.error = result
                code = result.code if isinstance(result, PushgateError) else "internal_error"
                self.failed.extend(ReceiptFailure(r, code) for r in receipts)
            self.left -= 1
            if not self.left:
                self._done()

        return answered

    def _done(self) -> None:
        if self.error is not None and self.errored == self.parts:
            self.reply(self.error)
            return
        order = {r: i for i, r in enumerate(self.receipts)}
        self.failed.sort(key=lambda f: order.get(f.receipt, len(order)))
        self.reply(AckResult(self.acked, self.failed))
