"""Coalescing of acks, nacks and sends: many requests, one backend call per key and turn.

Each key (a tenant for acks, a queue for sends) has one call under way (by default); whatever
arrives meanwhile waits and goes in the next call. The store group-commits anyway, but
fewer, bigger calls mean fewer rows of Python per message and no task per request:
a task exists only per key while it has work.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Hashable, Sequence
from typing import Generic, TypeVar, cast

from backend_store.backend import Backend
from backend_store.errors import InvalidRequest, PushgateError
from backend_store.limits import MAX_RECEIPTS
from backend_store.types import AckResult, NewMessage, QueueName, ReceiptFailure, SendResult, TenantId

logger = logging.getLogger("pushgate.push")

K = TypeVar("K", bound=Hashable)
I = TypeVar("I")  # noqa: E741 - an item, as in the typing docs

# What a request hears back: its own share of the combined call, or the call's error.
AckReply = Callable[[AckResult | BaseException], None]
SendReply = Callable[[list[SendResult | PushgateError] | BaseException], None]

MAX_MESSAGES_PER_CALL = 500


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

    def add(self, key: K, item: I) -> None:
        items = self._pending.get(key)
        if items is not None:
            items.append(item)
            return
        self._pending[key] = [item]
        running = self._running.get(key, 0)
        if running < self._concurrency:
            self._running[key] = running + 1
            task = asyncio.get_running_loop().create_task(self._drain(key))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _drain(self, key: K) -> None:
        try:
            while items := self._pending.pop(key, None):
                try:
                    await self.flush(key, items)
                except Exception:
                    # flush answers every item itself; this is a bug, not a store error.
                    logger.exception("push batch failed")
        finally:
            left = self._running[key] - 1
            if left:
                self._running[key] = left
            else:
                del self._running[key]

    async def flush(self, key: K, items: list[I]) -> None:
        raise NotImplementedError

    async def wait_idle(self) -> None:
        """Return when nothing is queued or under way (used by shutdown and tests)."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)


def _split_ack(receipts: Sequence[str], failed: dict[str, str]) -> AckResult:
    if not failed:
        return AckResult(acked=len(receipts), failed=[])
    mine = [ReceiptFailure(r, failed[r]) for r in receipts if r in failed]
    return AckResult(acked=len(receipts) - len(mine), failed=mine)


class AckBatcher(KeyedBatcher[tuple[TenantId, float | None], tuple[Sequence[str], AckReply | None]]):
    """Acks (delay ``None``) and nacks (delay in seconds) per tenant."""

    def __init__(self, backend: Backend) -> None:
        super().__init__()
        self._backend = backend

    def ack(self, tenant: TenantId, receipts: Sequence[str], reply: AckReply | None = None) -> None:
        self.add((tenant, None), (receipts, reply))

    def nack(
        self, tenant: TenantId, receipts: Sequence[str], delay_s: float = 0, reply: AckReply | None = None
    ) -> None:
        self.add((tenant, delay_s), (receipts, reply))

    async def flush(
        self, key: tuple[TenantId, float | None], items: list[tuple[Sequence[str], AckReply | None]]
    ) -> None:
        tenant, delay = key
        receipts = [r for rs, _ in items for r in rs]
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
            for _, reply in items:
                if reply is not None:
                    reply(exc)
            return
        for rs, reply in items:
            if reply is not None:
                reply(_split_ack(rs, failed))


class SendItem:
    """One share of a batched send: its entries and who hears their results.

    Open until the batcher takes it into a store call (:attr:`taken`): until then a
    connection may add entries to it (consecutive single-message sends, see
    :class:`push.send_group.SendGroup`), which then ride in the same call as the first.
    """

    __slots__ = ("entries", "reply", "taken", "valid")

    def __init__(self, entries: list[NewMessage | InvalidRequest], reply: SendReply, valid: bool) -> None:
        self.entries = entries
        self.reply = reply
        self.taken = False
        # Every entry is a NewMessage (none was refused by parsing): its results are one slice.
        self.valid = valid


class SendBatcher(KeyedBatcher[tuple[TenantId, QueueName], SendItem]):
    """Sends per queue; a bad entry keeps its own error and the others still go."""

    def __init__(self, backend: Backend) -> None:
        super().__init__()
        self._backend = backend

    def send(
        self,
        tenant: TenantId,
        queue: QueueName,
        entries: list[NewMessage | InvalidRequest],
        reply: SendReply,
    ) -> None:
        self.submit(tenant, queue, SendItem(entries, reply, all(isinstance(e, NewMessage) for e in entries)))

    def submit(self, tenant: TenantId, queue: QueueName, item: SendItem) -> None:
        """Queue an item (its entries may grow until :attr:`SendItem.taken`)."""
        self.add((tenant, queue), item)

    async def flush(self, key: tuple[TenantId, QueueName], items: list[SendItem]) -> None:
        tenant, queue = key
        valid: list[NewMessage] = []
        for item in items:
            item.taken = True  # nothing joins it from here on: its entries are in this call
            if item.valid:
                valid.extend(cast(list[NewMessage], item.entries))
            else:
                valid.extend(e for e in item.entries if isinstance(e, NewMessage))
        results: list[SendResult | PushgateError] = []
        try:
            for start in range(0, len(valid), MAX_MESSAGES_PER_CALL):
                results.extend(
                    await self._backend.send(tenant, queue, valid[start : start + MAX_MESSAGES_PER_CALL])
                )
        except Exception as exc:
            if not isinstance(exc, PushgateError):
                logger.exception("send failed")
            for item in items:
                item.reply(exc)
            return
        position = 0
        for item in items:
            entries = item.entries
            if item.valid:
                # Every entry went to the store: its results are one slice.
                end = position + len(entries)
                item.reply(results[position:end])
                position = end
                continue
            mine: list[SendResult | PushgateError] = []
            for entry in entries:
                if isinstance(entry, NewMessage):
                    mine.append(results[position])
                    position += 1
                else:
                    mine.append(entry)
            item.reply(mine)
