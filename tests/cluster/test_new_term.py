"""A new leader's term, on a real :class:`PartitionHost` with two real followers over TCP
(test_replication.py's ``FollowerNode``): what the simulation's ``minority`` seeds 400568 and
400730 found (issue 24's defect 7 again; tests/simulation/test_minority_hand_over.py runs them).

- The term's first entry waits for a majority, for as long as the replication timeout when
  none answers. It is written in a task of its own, so the node's reconcile tick, which
  awaits ``lead``, goes on: check-quorum gives the term up in its window, not after 5 s.
- A hand-over begins only once the successor answered after it was asked for: a successor
  cut off a moment before was heard from within a heartbeat, and a term handed to it could
  commit nothing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from backend_store.cluster.coordination.layout import PartitionRecord
from backend_store.cluster.node.partition_host import PartitionHost
from backend_store.cluster.protocol.ops import encode_args
from backend_store.types import Epoch, NewMessage, QueueName, TenantId
from tests.conftest import scaled

from .test_replication import FollowerNode, leader_host, open_store, until

QUEUES = {("t", "q"): {"replication_factor": 3}}
RECORD = PartitionRecord("t", "q", 0, ("leader", "f1", "f2"), "leader")
WINDOW_S = 2.0  # check-quorum's window, the node's default (one lease TTL)


@pytest.fixture
async def followers(tmp_path: Path) -> AsyncIterator[dict[str, FollowerNode]]:
    nodes = {name: FollowerNode(name, await open_store(tmp_path / name)) for name in ("f1", "f2")}
    for node in nodes.values():
        await node.start()
    yield nodes
    for node in nodes.values():
        await node.stop()
        await node.store.close()


@pytest.fixture
async def host(tmp_path: Path) -> AsyncIterator[PartitionHost]:
    host = leader_host(tmp_path / "leader")
    await host.open()
    yield host
    await host.close()


def addresses(followers: dict[str, FollowerNode]) -> dict[str, str]:
    return {name: f"127.0.0.1:{node.port}" for name, node in followers.items()}


async def test_a_leader_no_follower_answers_starts_at_once_and_check_quorum_can_end_it(
    host: PartitionHost, followers: dict[str, FollowerNode]
) -> None:
    links = addresses(followers)
    for node in followers.values():
        await node.stop()
    began = time.monotonic()
    await asyncio.wait_for(host.lead(Epoch(3), RECORD, links, QUEUES, quorum_window_s=WINDOW_S), 1.0)
    assert host.leading and not host.ready  # its first entry waits for a majority
    await until(lambda: host.lacks_quorum(time.monotonic(), {"f1", "f2"}), "check-quorum's verdict")
    # Within the window, while the first entry still waits (its timeout is 5 s).
    assert time.monotonic() - began < WINDOW_S + scaled(1)
    assert not host.ready
    await host.resign_for_quorum(time.monotonic(), RECORD.designation)
    assert not host.leading


async def test_a_hand_over_begins_once_the_successor_answered_after_it_was_asked(
    host: PartitionHost, followers: dict[str, FollowerNode]
) -> None:
    await host.lead(Epoch(3), RECORD, addresses(followers), QUEUES, quorum_window_s=WINDOW_S)
    await until(lambda: host.ready, "the term's first entry")
    send = encode_args("send", tenant="t", queue="q", messages=[NewMessage(b"m")])
    await host.handle("send", Epoch(3), send, timeout_s=scaled(5))
    await followers["f1"].stop()  # cut off now: heard from a moment ago, within a heartbeat
    # Once the link saw the close, every answer f1 sent before it was read: one still in
    # flight when the hand-over is asked for counts as an answer (it left at most a round
    # trip before), and the leader cannot tell it from a later one (CI, session 42's stop).
    leader = host.leader
    assert leader is not None
    await until(lambda: not leader.followers["f1"].connected, "the leader seeing f1's link close")
    for _ in range(10):
        assert host.hand_over("f1", time.monotonic(), RECORD.designation) is None
        assert host.handing_over_to is None  # not begun: requests are served meanwhile
        await host.handle("send", Epoch(3), send, timeout_s=scaled(5))
        await asyncio.sleep(0.1)
    # One that answers is handed the term once it did (an idle heartbeat: 0.5 s).
    resignation = None
    deadline = time.monotonic() + scaled(5)
    while resignation is None:
        assert time.monotonic() < deadline, "the hand-over to f2 never happened"
        resignation = host.hand_over("f2", time.monotonic(), RECORD.designation)
        await asyncio.sleep(0.05)
    assert resignation.lsn == host.store.last_lsn


async def test_a_new_term_writes_nothing_for_a_queue_its_store_already_holds_as_its_record_says(
    host: PartitionHost, followers: dict[str, FollowerNode]
) -> None:
    """Each term applies its queue's record; one the store holds with those attributes is
    left as it is (a create with the attributes the queue has is answered by the queue, as
    SQS's CreateQueue is, and writes nothing): the term's first entry is its only write, so
    a failover replicates no entry a queue. A changed record is written."""
    links = addresses(followers)
    await host.lead(Epoch(3), RECORD, links, QUEUES, quorum_window_s=WINDOW_S)
    await until(lambda: host.ready, "the first term applying its queue")
    await host.step_down("a test's new term")
    before = host.store.last_lsn
    await host.lead(Epoch(4), RECORD, links, QUEUES, quorum_window_s=WINDOW_S)
    await until(lambda: host.ready, "the second term applying its queue")
    assert host.store.last_lsn == before + 1
    # A changed record is still written.
    changed = {("t", "q"): {"replication_factor": 3, "visibility_timeout_s": 7}}
    await host.apply_queue_attributes(changed)
    assert host.store.last_lsn == before + 2
    assert (await host.store.get_queue(TenantId("t"), QueueName("q"))).attributes.visibility_timeout_s == 7
