"""The message operations of ``QueueStore`` on the cluster (send, receive, ack, nack,
visibility), ``ReceiptShards`` and ``DeadLetters``: each goes to the leaders of the queue's
partitions (:mod:`.routing` picks a send's partition, and every receipt names its partition).
A part of :class:`~.cluster_backend.ClusterBackend`, which provides the attributes below."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence
from typing import Any

from ...attributes import check_number, check_receive
from ...errors import InvalidReceipt, InvalidRequest, PushgateError, QueueNotFound, Unavailable
from ...limits import MAX_RECEIVE_PER_CALL
from ...types import (
    AckResult,
    NewMessage,
    PeekedMessage,
    QueueName,
    ReceiptFailure,
    ReceivedMessage,
    SendResult,
    TenantId,
)
from .partition_calls import PartitionCalls
from .partition_map import ClusterView, PartitionInfo
from .queue_parts import QueueParts
from .routing import plan_sends, prefix_receipt, split_receipt
from .send_batcher import SendBatcher


class MessageOperations:
    view: ClusterView
    calls: PartitionCalls
    queue_parts: QueueParts
    send_batcher: SendBatcher
    _round_robin: itertools.count[int]

    async def send(
        self, tenant: TenantId, queue: QueueName, messages: Sequence[NewMessage]
    ) -> list[SendResult | PushgateError]:
        record = await self.queue_parts.record(tenant, queue)
        out: list[SendResult | PushgateError | None] = [_unencodable(m) for m in messages]
        # Entries refused here (text that is not UTF-8) fail alone, as on the embedded store.
        valid = [i for i, r in enumerate(out) if r is None]
        plan = plan_sends([messages[i] for i in valid], record.attributes, next(self._round_robin))
        parts = self.queue_parts.parts(record)

        async def send_to(index: int) -> None:
            batch = [messages[valid[i]] for i in plan.by_index[index]]
            # Safe to repeat only if the partition dedupes every message of the batch.
            safe = record.attributes.content_dedupe or all(m.dedupe_id is not None for m in batch)
            results = await self.send_batcher.send(parts[index], queue, batch, safe=safe)
            for position, result in zip(plan.by_index[index], results, strict=True):
                out[valid[position]] = result

        if len(plan.by_index) == 1:
            await send_to(next(iter(plan.by_index)))  # one partition (most sends): no task for it
        else:
            await asyncio.gather(*(send_to(i) for i in plan.by_index))
        return [r if r is not None else Unavailable("no result") for r in out]

    async def receive(
        self,
        tenant: TenantId,
        queue: QueueName,
        max_messages: int,
        visibility_timeout_s: float | None = None,
    ) -> list[ReceivedMessage]:
        # Checked here as the store checks them: the loop below would answer 0 with [].
        check_receive(max_messages, visibility_timeout_s)
        record = await self.queue_parts.record(tenant, queue)
        parts = self.queue_parts.holders(record)
        start = next(self._round_robin) % len(parts)
        got: list[ReceivedMessage] = []
        failure: PushgateError | None = None
        # The partitions in turn, from a rotating start, until the request is filled.
        for part in parts[start:] + parts[:start]:
            if len(got) >= max_messages:
                break
            try:
                batch = await self.calls.call(
                    part,
                    "receive",
                    queue=queue,
                    max_messages=max_messages - len(got),
                    visibility_timeout_s=visibility_timeout_s,
                )
            except Unavailable as exc:
                failure = exc  # one partition down must not starve the others
                continue
            for message in batch:
                message.receipt = prefix_receipt(part.id, message.receipt)
            got.extend(batch)
        if not got and failure is not None:
            raise failure
        return got

    async def ack(
        self, tenant: TenantId, receipts: Sequence[str], queue: QueueName | None = None
    ) -> AckResult:
        return await self._settle_receipts(tenant, receipts, queue, "ack", {})

    async def nack(
        self,
        tenant: TenantId,
        receipts: Sequence[str],
        delay_s: float = 0,
        queue: QueueName | None = None,
    ) -> AckResult:
        return await self._settle_receipts(tenant, receipts, queue, "nack", {"delay_s": delay_s})

    async def _settle_receipts(
        self,
        tenant: TenantId,
        receipts: Sequence[str],
        queue: QueueName | None,
        op: str,
        extra: dict[str, Any],
    ) -> AckResult:
        if queue is not None:
            await self.queue_parts.record(tenant, queue)
        failed: list[ReceiptFailure] = []
        groups: dict[int, tuple[PartitionInfo, list[str]]] = {}
        originals: dict[tuple[int, str], str] = {}
        for receipt in receipts:
            found = self.queue_parts.receipt_partition(tenant, receipt, queue)
            if found is None:
                failed.append(ReceiptFailure(receipt, InvalidReceipt.code))
                continue
            part, inner = found
            groups.setdefault(part.id, (part, []))[1].append(inner)
            originals[(part.id, inner)] = receipt

        async def settle(part: PartitionInfo, inner: list[str]) -> AckResult:
            if part.id not in self.view.map.partitions:  # dropped since the receipts were checked
                return AckResult(0, [ReceiptFailure(r, InvalidReceipt.code) for r in inner])
            try:
                result: AckResult = await self.calls.call(part, op, receipts=inner, queue=queue, **extra)
            except QueueNotFound:
                # The partition's queue went away: its receipts are dead.
                return AckResult(0, [ReceiptFailure(r, InvalidReceipt.code) for r in inner])
            return result

        results = await asyncio.gather(*(settle(part, inner) for part, inner in groups.values()))
        acked = 0
        for pid, result in zip(groups, results, strict=True):
            acked += result.acked
            failed.extend(
                ReceiptFailure(originals.get((pid, f.receipt), f.receipt), f.code) for f in result.failed
            )
        order = {r: i for i, r in enumerate(receipts)}
        failed.sort(key=lambda f: order.get(f.receipt, len(order)))
        return AckResult(acked, failed)

    def receipt_shard(self, receipt: str) -> int | None:
        """The optional ``ReceiptShards`` capability: a receipt's partition (its prefix), so
        the push engine batches acks per partition and a frozen leader stalls only its own."""
        split = split_receipt(receipt)
        return None if split is None else split[0]

    async def change_visibility(
        self, tenant: TenantId, queue: QueueName, receipt: str, timeout_s: float
    ) -> None:
        await self.queue_parts.record(tenant, queue)
        found = self.queue_parts.receipt_partition(tenant, receipt, queue)
        if found is None:
            raise InvalidReceipt("receipt is not valid for this queue")
        part, inner = found
        await self.calls.call(part, "change_visibility", queue=queue, receipt=inner, timeout_s=timeout_s)

    async def next_visible_at(self, tenant: TenantId, queue: QueueName) -> float | None:
        record = await self.queue_parts.record(tenant, queue)
        times = await self.queue_parts.each_holder(record, "next_visible_at", retry_unknown=True, queue=queue)
        known = [t for t in times if t is not None]
        return min(known) if known else None

    # Dead letters (the DeadLetters capability) ------------------------------------

    async def peek(self, tenant: TenantId, queue: QueueName, max_messages: int) -> list[PeekedMessage]:
        check_number("max", max_messages, 1, MAX_RECEIVE_PER_CALL, integer=True)
        record = await self.queue_parts.record(tenant, queue)
        batches = await self.queue_parts.each_holder(
            record, "peek", retry_unknown=True, queue=queue, max_messages=max_messages
        )
        merged = sorted((m for batch in batches for m in batch), key=lambda m: (m.sent_at, m.seq))
        return merged[:max_messages]

    async def redrive(self, tenant: TenantId, queue: QueueName, to: QueueName, max_messages: int) -> int:
        check_number("max", max_messages, 1, 100_000, integer=True)
        await self.queue_parts.record(tenant, queue)
        target = await self.queue_parts.record(tenant, to)
        if target.attributes.dead_letter_queue != queue:
            # A partition store holds a queue and its dead-letter queue: the one atomic move
            # there is back into the queue that dead-lettered the message.
            raise InvalidRequest(
                f"in cluster mode, redrive moves dead letters back to a queue whose dead_letter_queue is {queue!r}"
            )
        moved = 0
        for part in self.queue_parts.own(target):
            if moved >= max_messages:
                break
            moved += int(
                await self.calls.call(part, "redrive", queue=queue, to=to, max_messages=max_messages - moved)
            )
        return moved


def _unencodable(message: NewMessage) -> InvalidRequest | None:
    """An error for a message whose text cannot travel (a lone surrogate is a Python str but
    not UTF-8); None if it can."""
    texts = [message.group_id, message.dedupe_id, *message.attributes, *message.attributes.values()]
    try:
        for text in texts:
            if text is not None:
                text.encode()
    except UnicodeEncodeError:
        return InvalidRequest("group_id, dedupe_id and attributes must be valid Unicode text")
    return None
