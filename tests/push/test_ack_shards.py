"""Acks and nacks batch per shard (push/batching.py ``AckBatcher``): a shard that never
answers (a cluster partition whose leader froze) holds up its own receipts only.

Sans-I/O: the batcher over a store of two shards whose shard 1 answers only when the test
opens its gate. Receipts name their shard as a cluster's do (``"<partition>.<rest>"``,
backend_store/cluster/routing.py); a receipt ending in ``bad`` is refused, as a stale one is.
Through a real cluster with a frozen leader: tests/cluster/test_acks_per_partition.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from backend_store.backend import ReceiptShards
from backend_store.errors import Unavailable
from backend_store.types import AckResult, QueueName, ReceiptFailure, TenantId
from push.batching import AckBatcher
from tests.conftest import scaled

T = TenantId("t")
Answer = AckResult | BaseException


class TwoShards:
    """A store of two shards; each call settles receipts of one shard (as the batcher sends them)."""

    def __init__(self) -> None:
        self.gates = {0: asyncio.Event(), 1: asyncio.Event()}
        self.gates[0].set()
        self.calls: list[tuple[str, list[str]]] = []
        self.fail: int | None = None  # a shard whose calls raise once its gate opens

    def receipt_shard(self, receipt: str) -> int | None:
        head, _, _ = receipt.partition(".")
        return int(head) if head.isdigit() else None

    async def _settle(self, op: str, receipts: Sequence[str]) -> AckResult:
        shards = {self.receipt_shard(r) for r in receipts}
        assert len(shards) == 1, f"one call mixed shards: {receipts}"
        (shard,) = shards
        self.calls.append((op, list(receipts)))
        if shard is not None:
            await self.gates[shard].wait()
        if shard is not None and shard == self.fail:
            raise Unavailable("the shard has no leader")
        failed = [
            ReceiptFailure(r, "invalid_receipt") for r in receipts if r.endswith("bad") or shard is None
        ]
        return AckResult(len(receipts) - len(failed), failed)

    async def ack(
        self, tenant: TenantId, receipts: Sequence[str], queue: QueueName | None = None
    ) -> AckResult:
        return await self._settle("ack", receipts)

    async def nack(
        self, tenant: TenantId, receipts: Sequence[str], delay_s: float = 0, queue: QueueName | None = None
    ) -> AckResult:
        return await self._settle("nack", receipts)


async def answered(future: asyncio.Future[Answer]) -> Answer:
    async with asyncio.timeout(scaled(5)):
        return await future


async def test_a_shard_that_never_answers_stalls_no_other_shards_acks() -> None:
    store = TwoShards()
    assert isinstance(store, ReceiptShards)
    batcher = AckBatcher(store)
    frozen: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
    batcher.ack(T, ["1.a"], frozen.set_result)  # its call never returns
    await asyncio.sleep(0)
    for i in range(3):  # acks and nacks of shard 0 keep flowing, one after the other
        ok: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        batcher.ack(T, [f"0.b{i}", f"0.c{i}"], ok.set_result)
        assert await answered(ok) == AckResult(2, [])
        nacked: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        batcher.nack(T, [f"0.n{i}"], 0, nacked.set_result)
        assert await answered(nacked) == AckResult(1, [])
    later: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
    batcher.ack(T, ["1.d"], later.set_result)  # waits behind shard 1's call in flight
    await asyncio.sleep(0.05)
    assert not frozen.done() and not later.done()
    assert ("ack", ["1.d"]) not in store.calls
    store.gates[1].set()
    assert await answered(frozen) == AckResult(1, [])
    assert await answered(later) == AckResult(1, [])
    await batcher.wait_idle()


async def test_a_request_across_shards_is_answered_once_with_its_failures_in_order() -> None:
    store = TwoShards()
    store.gates[1].set()
    batcher = AckBatcher(store)
    reply: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
    batcher.ack(T, ["0.a", "1.bad", "0.c", "nonsense", "1.e"], reply.set_result)
    assert await answered(reply) == AckResult(
        3, [ReceiptFailure("1.bad", "invalid_receipt"), ReceiptFailure("nonsense", "invalid_receipt")]
    )
    assert sorted(store.calls) == [("ack", ["0.a", "0.c"]), ("ack", ["1.bad", "1.e"]), ("ack", ["nonsense"])]


async def test_a_shard_that_fails_lists_its_receipts_and_the_others_settle() -> None:
    store = TwoShards()
    store.gates[1].set()
    store.fail = 1
    batcher = AckBatcher(store)
    reply: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
    batcher.ack(T, ["1.a", "0.b"], reply.set_result)
    assert await answered(reply) == AckResult(1, [ReceiptFailure("1.a", "unavailable")])
    # A request on the failing shard alone hears the error itself.
    alone: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
    batcher.ack(T, ["1.c"], alone.set_result)
    assert isinstance(await answered(alone), Unavailable)


@pytest.mark.parametrize("shards", [False, True])
async def test_without_shards_every_receipt_is_one_call(shards: bool) -> None:
    """A store without the capability (the embedded store) is one shard: one call per turn."""

    class OneShard:
        def __init__(self) -> None:
            self.calls: list[list[str]] = []

        async def ack(
            self, tenant: TenantId, receipts: Sequence[str], queue: QueueName | None = None
        ) -> AckResult:
            self.calls.append(list(receipts))
            return AckResult(len(receipts), [])

        async def nack(
            self,
            tenant: TenantId,
            receipts: Sequence[str],
            delay_s: float = 0,
            queue: QueueName | None = None,
        ) -> AckResult:
            raise AssertionError("no nack here")

    store = OneShard() if not shards else TwoShards()
    if isinstance(store, TwoShards):
        store.gates[1].set()
    batcher = AckBatcher(store)
    replies = [asyncio.get_running_loop().create_future() for _ in range(2)]
    batcher.ack(T, ["0.a", "1.b"], replies[0].set_result)
    batcher.ack(T, ["0.c"], replies[1].set_result)
    assert [await answered(r) for r in replies] == [AckResult(2, []), AckResult(1, [])]
    if not shards:
        assert isinstance(store, OneShard) and store.calls == [["0.a", "1.b", "0.c"]]
