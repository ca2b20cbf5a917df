"""Routing rules of the gateway side (no I/O): partition choice, receipts, the per-node breaker."""

from __future__ import annotations

import asyncio
import time
import zlib
from collections.abc import Callable
from typing import cast

import pytest

from backend_store.cluster.client.node_health import BreakerSettings, NodeHealth, NodeUnavailable
from backend_store.cluster.client.partition_calls import PartitionCalls, QueueRecords
from backend_store.cluster.client.partition_map import ClusterView, PartitionInfo, PartitionMap
from backend_store.cluster.client.routing import partition_index, plan_sends, prefix_receipt, split_receipt
from backend_store.types import NewMessage, QueueAttributes, QueueName, TenantId

FOUR = QueueAttributes(partitions=4)
FIFO = QueueAttributes(partitions=4, ordering="fifo")


def test_a_dedupe_id_always_lands_on_the_same_partition() -> None:
    message = NewMessage(b"x", dedupe_id="order-17")
    expected = zlib.crc32(b"order-17") % 4
    assert {partition_index(message, FOUR, rr) for rr in range(10)} == {expected}


def test_fifo_groups_hash_to_one_partition_and_others_rotate() -> None:
    grouped = NewMessage(b"x", group_id="user-9", dedupe_id="d1")
    assert {partition_index(grouped, FIFO, rr) for rr in range(8)} == {zlib.crc32(b"user-9") % 4}
    plain = NewMessage(b"x")
    assert [partition_index(plain, FOUR, rr) for rr in range(5)] == [0, 1, 2, 3, 0]
    assert {partition_index(plain, QueueAttributes(), rr) for rr in range(5)} == {0}


def test_a_batch_is_split_by_partition_keeping_positions() -> None:
    messages = [NewMessage(b"a"), NewMessage(b"b", dedupe_id="k"), NewMessage(b"c")]
    plan = plan_sends(messages, FOUR, round_robin=1)
    keyed = zlib.crc32(b"k") % 4
    assert plan.by_index[1][:1] == [0] and 2 in plan.by_index[1]
    assert 1 in plan.by_index[keyed]
    assert sorted(i for positions in plan.by_index.values() for i in positions) == [0, 1, 2]


@pytest.mark.parametrize("receipt", ["", "abc", "12", ".abc", "x.abc", "12.", "-1.abc", "1" * 19 + ".a"])
def test_receipts_not_handed_out_here_are_refused(receipt: str) -> None:
    assert split_receipt(receipt) is None


def test_receipts_round_trip_with_their_partition() -> None:
    assert split_receipt(prefix_receipt(42, "AbC.d-e_f")) == (42, "AbC.d-e_f")


def test_a_failing_node_is_cut_off_then_tried_again() -> None:
    now = [100.0]
    health = NodeHealth(
        BreakerSettings(failures_to_open=2, cooldown_s=1, max_cooldown_s=3), clock=lambda: now[0]
    )
    breaker = health.breaker("n1")
    breaker.before_request("n1")
    breaker.failed()
    breaker.before_request("n1")  # one failure is not enough
    breaker.failed()
    assert health.states() == {"n1": "open"}
    with pytest.raises(NodeUnavailable) as refused:
        breaker.before_request("n1")
    assert refused.value.retry_after_s == pytest.approx(1)
    health.breaker("n2").before_request("n2")  # other nodes are not affected
    now[0] += 1
    breaker.before_request("n1")  # the half-open trial
    with pytest.raises(NodeUnavailable):
        breaker.before_request("n1")  # only one trial at a time
    breaker.failed()
    now[0] += 1.5
    with pytest.raises(NodeUnavailable):
        breaker.before_request("n1")  # the cool-down doubled
    now[0] += 0.5
    breaker.before_request("n1")
    breaker.succeeded()
    assert health.states()["n1"] == "closed"
    breaker.before_request("n1")


def test_a_trial_given_up_without_a_verdict_hands_the_trial_on() -> None:
    # The trial request was held at a leader the map then showed replaced (or its caller
    # went away): nothing was learnt of the node, and the next request must be able to try
    # it. Before, the breaker stayed open for good (simulation seed ``restore`` 30325).
    now = [100.0]
    health = NodeHealth(BreakerSettings(failures_to_open=1, cooldown_s=1), clock=lambda: now[0])
    breaker = health.breaker("n1")
    assert not breaker.before_request("n1")  # closed: no trial
    breaker.failed()
    now[0] += 1
    assert breaker.before_request("n1")  # the half-open trial
    with pytest.raises(NodeUnavailable):
        breaker.before_request("n1")
    breaker.abandon()
    assert breaker.before_request("n1")  # the next request is the trial
    breaker.succeeded()
    assert health.states()["n1"] == "closed"


def test_a_node_that_won_a_newer_term_is_tried_at_once() -> None:
    # The node failed at epoch 40 while it led; it restarted and leads again at epoch 52
    # (epochs are etcd revisions): the first request of the new term is the trial, the
    # cool-down notwithstanding; a request of an old term still waits it out.
    now = [100.0]
    breaker = NodeHealth(BreakerSettings(failures_to_open=1, cooldown_s=4), clock=lambda: now[0]).breaker(
        "n1"
    )
    breaker.failed(epoch=40)
    with pytest.raises(NodeUnavailable):
        breaker.before_request("n1", epoch=40)
    breaker.before_request("n1", epoch=52)  # the trial
    with pytest.raises(NodeUnavailable):
        breaker.before_request("n1", epoch=52)  # one at a time
    breaker.failed(epoch=52)  # it failed again: only a newer term is tried before the cool-down
    with pytest.raises(NodeUnavailable):
        breaker.before_request("n1", epoch=52)
    breaker.before_request("n1", epoch=60)
    breaker.succeeded()
    assert breaker.state == "closed"


def test_a_request_refused_while_a_trial_is_out_hears_the_trials_verdict() -> None:
    # A node back in a newer term: one request is the trial, another is refused with the
    # rest of a doubled cool-down as its retry_after_s. It must not sleep that out once the
    # trial succeeded (simulation seed ``minority`` 401977: 1.8 s more).
    now = [100.0]
    breaker = NodeHealth(BreakerSettings(failures_to_open=1, cooldown_s=2), clock=lambda: now[0]).breaker(
        "n1"
    )
    breaker.failed(epoch=40)
    assert breaker.before_request("n1", epoch=52)  # the trial
    with pytest.raises(NodeUnavailable) as refused:
        breaker.before_request("n1", epoch=52)
    assert refused.value.retry_after_s > 1.5
    verdict = breaker.verdict()
    assert not verdict.is_set()
    breaker.succeeded()
    assert verdict.is_set()
    assert not breaker.before_request("n1", epoch=52)  # closed: it goes
    # A failed trial is a verdict too: the refused ask again, and wait out the cool-down.
    breaker.failed(epoch=52)
    verdict = breaker.verdict()
    breaker.before_request("n1", epoch=60)
    breaker.failed(epoch=60)
    assert verdict.is_set()
    with pytest.raises(NodeUnavailable):
        breaker.before_request("n1", epoch=60)


class MapThatNeverMoves:
    """The gateway's map, as far as a refused request waits on it: the leader never moves."""

    def add_listener(self, listener: Callable[[PartitionMap], None]) -> None:
        pass

    async def wait_for(self, condition: Callable[[PartitionMap], bool], timeout_s: float) -> bool:
        await asyncio.sleep(timeout_s)
        return False


async def test_a_request_the_breaker_refused_wakes_at_the_nodes_next_verdict() -> None:
    # The request loop's side of the test above (``PartitionCalls._until_moved_or_verdict``):
    # refused with 30 s of cool-down left, it goes on as soon as the trial's verdict comes.
    health = NodeHealth(BreakerSettings())
    calls = PartitionCalls(
        cast(ClusterView, MapThatNeverMoves()),
        cast(QueueRecords, None),  # not asked: the partition is placed
        health,
        deadline_s=60,
        node_timeout_s=1,
    )
    part = PartitionInfo(5, TenantId("t"), QueueName("q"), 0, ("n1",), "n1", "sync")
    breaker = health.breaker("n1")
    asyncio.get_running_loop().call_later(0.01, breaker.succeeded)  # the trial's verdict
    started = time.monotonic()
    async with asyncio.timeout(5):
        await calls._until_moved_or_verdict(part, breaker.verdict(), 30.0)
    assert time.monotonic() - started < 5
