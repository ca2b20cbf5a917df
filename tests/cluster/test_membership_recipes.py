"""Issue 24's recipes where operators act (defects 2 and 3), as real processes: real etcd,
real ``pushgate node`` and ``pushgate manager`` processes, each node behind TCP proxies the
test controls (``ClusterNetwork.separate``: its replication links to and from the other
nodes are held, etcd and the test's requests still reach it).

- **A drain while a follower lags** (defect 2): the old one-step swap replaced the drained
  follower with a spare at once and the drained node deleted its copy, while the other
  follower was cut off and the spare had caught up with nothing; a leader killed then took
  with it the sends acknowledged since the cut. A move now goes through a learner that
  must catch up, never while a voter that stays lags.
- **A drained leader** (defect 3): the old plan removed the leader in the pass that named its
  successor, so its hand-over never ran, and a successor that had been cut off campaigned
  without the sends acknowledged meanwhile. Leadership now moves only to a follower in sync
  with the leader for a while, by a hand-over that waits until it holds the whole log.

Each ends by reading the partition's log from whoever leads: every acknowledged send is
there, in place (the id and seq its acknowledgement gave).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.fixtures.etcd_server import unique_prefix

from .processes import ClusterHarness
from .workload import RF3_SYNC, Producers, Q, T, check_acknowledged_in_place, has_replicas

# The manager acts within a few plans (0.25 s each) and a settle time (3 s): after this
# long a move it would make has been made. A fixed wait, to let a wrong outcome show.
ROOM_TO_ACT_S = 10.0


@pytest.fixture
async def harness(etcd_endpoints: list[str], tmp_path: Path) -> AsyncIterator[ClusterHarness]:
    h = ClusterHarness(etcd_endpoints, tmp_path, unique_prefix("recipes") + "/")
    try:
        yield h
    finally:
        await h.close()


async def _gone_or_waited(h: ClusterHarness, pid: int, node: str, since: float) -> bool:
    """The node left the voters and deleted its copy (the old swap), or the room to act passed."""
    record = (await h.partitions()).get(pid)
    removed = record is not None and node not in record.members
    deleted = not (h.root / node / "partitions" / str(pid)).exists()
    return (removed and deleted) or time.monotonic() - since > ROOM_TO_ACT_S


async def test_draining_a_follower_while_the_other_lags_loses_nothing_acknowledged(
    harness: ClusterHarness,
) -> None:
    h = await harness.start(nodes=4, managers=1, proxied=True)
    assert h.network is not None
    await h.create_queue(T, Q, RF3_SYNC)
    pid = await h.partition_of(T, Q)
    await h.wait_for("three replicas", lambda: has_replicas(h, pid, 3))
    record = (await h.partitions())[pid]
    leader, _, _ = await h.serving_leader(pid)
    f1, f2 = (n for n in record.replicas if n != leader)
    spare = next(n for n in h.nodes if n not in record.replicas)
    producers = Producers(h, pid)
    producers.start()
    await producers.more(10, "sends before the cut")
    h.network.separate(f2)  # F2 falls behind
    await producers.more(50, "sends acknowledged by the leader and F1 alone")
    await producers.stop()
    h.network.separate(spare)  # the spare can catch up with nothing
    await h.manager_command("--drain", f1)
    since = time.monotonic()
    await h.wait_for("the drain to act (or not)", lambda: _gone_or_waited(h, pid, f1, since), timeout=60)
    after = (await h.partitions())[pid]
    assert f1 in after.replicas, f"F1 left the voters while F2 lagged: {after}"
    h.nodes[leader].kill()
    # What the dead leader had shipped into the cut links dies with it (the proxies would
    # deliver held bytes at the heal, as a live sender's retransmissions).
    for node in (f2, spare):
        h.network.nodes[node].inbound.cut()
    h.network.heal()
    await h.serving_leader(pid, not_node=leader)
    log = await h.read_log(pid, T, Q)
    producers.check([m.body.decode() for m in log])
    check_acknowledged_in_place(producers.results, log)


async def test_draining_a_leader_whose_only_live_follower_was_cut_off_loses_nothing(
    harness: ClusterHarness,
) -> None:
    # A fourth node, the spare the drained leader's replica moves to in the end.
    h = await harness.start(nodes=4, managers=1, proxied=True)
    assert h.network is not None
    await h.create_queue(T, Q, RF3_SYNC)
    pid = await h.partition_of(T, Q)
    await h.wait_for("three replicas", lambda: has_replicas(h, pid, 3))
    leader, _, _ = await h.serving_leader(pid)
    a, b = (n for n in (await h.partitions())[pid].replicas if n != leader)
    producers = Producers(h, pid)
    producers.start()
    await producers.more(10, "sends before the cut")
    h.network.separate(a)
    await producers.more(40, "sends acknowledged by the leader and B alone")
    await producers.stop()
    h.nodes[b].kill()

    async def b_expired() -> bool:
        return b not in await h.node_records()

    await h.wait_for("B's record to expire", b_expired)
    await h.manager_command("--drain", leader)
    # While A is cut off nobody may take over: the drained leader keeps leading.
    await asyncio.sleep(ROOM_TO_ACT_S)
    found = await h.leader(pid)
    assert found is not None and found[0] == leader, f"leadership moved to a replica cut off: {found}"
    h.network.heal()
    new, _, _ = await h.serving_leader(pid, not_node=leader)
    assert new == a
    h.nodes[b].start()
    log = await h.read_log(pid, T, Q)
    producers.check([m.body.decode() for m in log])
    check_acknowledged_in_place(producers.results, log)
    # The drained node hands its replica over once B is back in sync; nothing is lost then either.
    await h.wait_for("the drained leader's replica to move", lambda: _left(h, pid, leader), timeout=90)
    final = await h.read_log(pid, T, Q)
    check_acknowledged_in_place(producers.results, final)


async def _left(h: ClusterHarness, pid: int, node: str) -> bool:
    record = (await h.partitions()).get(pid)
    return record is not None and node not in record.members and len(record.replicas) == 3


async def test_leadership_does_not_move_back_to_a_leader_cut_off_from_its_peers(
    harness: ClusterHarness,
) -> None:
    # Defect 7: under a cut, the rebalancer handed leadership back to the node that had just
    # resigned for lack of a quorum (it led the fewest partitions), and writes to that
    # partition waited for the heal. Three partitions, one led by each node; the leader of
    # the first is cut off from the others (etcd still reaches it).
    h = await harness.start(nodes=3, managers=1, proxied=True)
    assert h.network is not None
    queues = [Q, "q1", "q2"]
    for queue in queues:
        await h.create_queue(T, queue, RF3_SYNC)
    pids = [await h.partition_of(T, queue) for queue in queues]
    for pid in pids:
        await h.wait_for("three replicas", lambda pid=pid: has_replicas(h, pid, 3))
    leaders = {pid: (await h.serving_leader(pid))[0] for pid in pids}
    assert len(set(leaders.values())) == 3, f"the manager did not spread the leaders: {leaders}"
    pid = pids[0]
    cut_off = leaders[pid]
    producers = Producers(h, pid)
    producers.start()
    await producers.more(10, "sends before the cut")
    h.network.separate(cut_off)
    await h.serving_leader(pid, not_node=cut_off)  # it resigned (check-quorum); another leads
    await producers.more(10, "sends to the new leader")
    # The rebalancer sees the cut-off node leading nothing: it must not hand leadership back.
    until = time.monotonic() + ROOM_TO_ACT_S
    while time.monotonic() < until:
        record = (await h.partitions())[pid]
        found = await h.leader(pid)
        assert cut_off not in (record.leader, record.successor), f"leadership sent back: {record}"
        assert found is not None and found[0] != cut_off
        await asyncio.sleep(0.2)
    await producers.more(10, "sends while the cut lasts")
    h.network.heal()
    await producers.more(10, "sends after the heal")
    await producers.stop()
    log = await h.read_log(pid, T, Q)
    producers.check([m.body.decode() for m in log])
    check_acknowledged_in_place(producers.results, log)
