"""The cluster under failure: real etcd, real ``pushgate node`` and ``pushgate manager``
processes, real TCP on loopback, requests through ``NodeClient`` as a gateway makes them.

Every test runs its processes under a key prefix of its own in the session's etcd, and
stops them by PID (process groups) at the end.
"""

from __future__ import annotations

import asyncio
import collections
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from backend_store.cluster.protocol.ops import NotLeader, StaleLeader
from backend_store.cluster.protocol.wire import Notify
from backend_store.errors import StaleEpoch, Unavailable
from backend_store.types import Epoch, NewMessage, QueueName, TenantId
from tests.conftest import scaled
from tests.fixtures.etcd_server import unique_prefix

from .processes import ClusterHarness
from .workload import RF3_SYNC, Producers, Q, T, has_replicas, replicated_everywhere


@pytest.fixture
async def harness(etcd_endpoints: list[str], tmp_path: Path) -> AsyncIterator[ClusterHarness]:
    h = ClusterHarness(etcd_endpoints, tmp_path, unique_prefix("cluster") + "/")
    try:
        yield h
    finally:
        await h.close()


async def test_sync_sends_survive_repeated_leader_kills_and_the_manager_failing_over(
    harness: ClusterHarness,
) -> None:
    h = await harness.start(nodes=3, managers=2)
    await h.create_queue(T, Q, RF3_SYNC)
    pid = await h.partition_of(T, Q)
    await h.wait_for("three replicas", lambda: has_replicas(h, pid, 3))
    await h.serving_leader(pid)

    # Plain operations on a 3-node replica set; a send wakes the connected gateway.
    woken: asyncio.Queue[Notify] = asyncio.Queue()
    assert h.pool is not None
    h.pool.on_notify = lambda node, notify: woken.put_nowait(notify)
    await h.send_until_ok(pid, T, Q, "first")
    assert await asyncio.wait_for(woken.get(), scaled(5)) == Notify(pid, T, Q)
    got = await h.call(pid, "receive", tenant=TenantId(T), queue=QueueName(Q), max_messages=10)
    assert [m.body for m in got] == [b"first"]
    acked = await h.call(pid, "ack", tenant=TenantId(T), receipts=[got[0].receipt])
    assert acked.acked == 1
    # A follower points at the leader; an old epoch is told the current one.
    leader, address, epoch = await h.serving_leader(pid)
    follower = next(n for n in h.nodes if n != leader)
    assert h.pool is not None
    with pytest.raises(NotLeader) as not_leader:
        await h.pool.client(follower, h.addresses[follower]).call("get_queue", pid, tenant=T, name=Q)
    assert (not_leader.value.leader, not_leader.value.epoch) == (address, epoch)
    with pytest.raises(StaleLeader) as stale:
        await h.pool.client(leader, address).call("get_queue", pid, Epoch(epoch - 1), tenant=T, name=Q)
    assert (stale.value.leader, stale.value.epoch) == (address, epoch)

    producers = Producers(h, pid)
    for round_ in range(3):
        if round_ == 1:
            # The active manager dies too: the standby must take over and do the promoting.
            active = await h.wait_for("the active manager", lambda: _active_manager(h))
            next(m for m in h.managers if m.name == active).kill()
        producers.start()
        await producers.more(20, "sends before the kill")
        victim, _, epoch = await h.serving_leader(pid)
        h.nodes[victim].kill()
        _, _, new_epoch = await h.serving_leader(pid, not_node=victim)
        assert new_epoch > epoch
        await producers.more(20, "sends after the failover")
        await producers.stop()
        # The killed node comes back on its data dir and catches up as a follower.
        h.nodes[victim].start()
        await replicated_everywhere(h, pid, list(h.nodes))

    producers.check(await h.read_queue(pid, T, Q))
    # Every follower caught up from the log, which keeps far more than this test writes: a
    # re-seed (a copy of the whole store) would be a new leader taking its log for trimmed.
    reseeds = [
        f"{name}: {line}"
        for name, proc in h.nodes.items()
        for line in proc.log_path.read_text().splitlines()
        if "snapshot" in line
    ]
    assert not reseeds, "re-seeded for nothing:\n" + "\n".join(reseeds)


async def test_a_frozen_leader_is_fenced_and_loses_nothing_acknowledged(harness: ClusterHarness) -> None:
    h = await harness.start(nodes=3, managers=1)
    await h.create_queue(T, Q, RF3_SYNC)
    pid = await h.partition_of(T, Q)
    await h.wait_for("three replicas", lambda: has_replicas(h, pid, 3))
    producers = Producers(h, pid)
    producers.start()
    await producers.more(20, "sends before the freeze")
    # Frozen mid-stream: sends are in flight to it, and more queue up while its key lives on.
    frozen, address, epoch = await h.serving_leader(pid)
    h.nodes[frozen].signal(signal.SIGSTOP)
    try:
        _, _, new_epoch = await h.serving_leader(pid, not_node=frozen)
        assert new_epoch > epoch
        await producers.more(20, "sends to the new leader")
    finally:
        h.nodes[frozen].signal(signal.SIGCONT)
    # Woken up past its lease, the old leader acknowledges nothing at its old epoch: its
    # session is lost (not_leader) or the followers' fences refuse it (stale_epoch).
    assert h.pool is not None
    old = h.pool.client(frozen, address)
    message = NewMessage(b"to-the-old-leader", dedupe_id="to-the-old-leader")
    with pytest.raises((NotLeader, StaleEpoch, Unavailable)):
        await old.call("send", pid, epoch, tenant=TenantId(T), queue=QueueName(Q), messages=[message])
    await producers.more(10, "sends after the old leader woke")
    await producers.stop()
    # It rejoins as a follower (dropping what it wrote but nobody acknowledged) and ends
    # with the new leader's log.
    await replicated_everywhere(h, pid, list(h.nodes))
    received = await h.read_queue(pid, T, Q)
    producers.check(received)
    assert "to-the-old-leader" not in received


async def test_draining_a_leader_under_sync_writes_loses_nothing_acknowledged(
    harness: ClusterHarness,
) -> None:
    # A hand-over is not a failure: the old leader is alive and was acknowledging writes on a
    # majority that may not include its successor. It must stop writing and wait for the
    # successor to hold everything before it gives the key up.
    h = await harness.start(nodes=4, managers=1)
    await h.wait_for("four nodes", lambda: _nodes(h, 4))
    await h.create_queue(T, Q, RF3_SYNC)
    pid = await h.partition_of(T, Q)
    await h.wait_for("three replicas", lambda: has_replicas(h, pid, 3))
    producers = Producers(h, pid, count=6)
    producers.start()
    await producers.more(30, "sends before the drain")
    drained, _, epoch = await h.serving_leader(pid)
    await h.manager_command("--drain", drained)
    _, _, new_epoch = await h.serving_leader(pid, not_node=drained)
    assert new_epoch > epoch
    await producers.more(30, "sends after the hand-over")
    await producers.stop()
    record = (await h.partitions())[pid]
    await replicated_everywhere(h, pid, [n for n in record.replicas if n != drained])
    producers.check(await h.read_queue(pid, T, Q))


async def test_a_node_that_joins_receives_replicas_and_leadership(harness: ClusterHarness) -> None:
    h = await harness.start(nodes=3, managers=1, running=2)
    await h.wait_for("two nodes", lambda: _nodes(h, 2))
    queues = [Q, "q1", "q2"]
    for queue in queues:
        await h.create_queue(T, queue, {"replication_factor": 2, "partitions": 1})
    pids = [await h.partition_of(T, queue) for queue in queues]
    for pid in pids:
        await h.wait_for("two replicas", lambda pid=pid: has_replicas(h, pid, 2))
    for queue, pid in zip(queues[1:], pids[1:], strict=True):
        for i in range(5):
            await h.send_until_ok(pid, T, queue, f"{queue}-{i}")
    producers = Producers(h, pids[0])  # writes go on while replicas and leaders move
    producers.start()
    await producers.more(10, "sends before the join")
    h.nodes["n2"].start()

    async def even() -> bool:
        records = await h.partitions()
        ours = [records[pid] for pid in pids]
        replicas = collections.Counter(n for r in ours for n in r.replicas)
        leaders = collections.Counter(r.leader for r in ours)
        return replicas == {"n0": 2, "n1": 2, "n2": 2} and leaders == {"n0": 1, "n1": 1, "n2": 1}

    await h.wait_for("replicas and leaders spread over three nodes", even, timeout=60)
    for pid in pids:
        await h.serving_leader(pid)
    await producers.more(10, "sends after the moves")
    await producers.stop()
    records = await h.partitions()
    for queue, pid in zip(queues, pids, strict=True):
        leader, _, _ = await h.serving_leader(pid)
        assert leader == records[pid].leader
        await replicated_everywhere(h, pid, list(records[pid].replicas))
        if queue != Q:
            assert sorted(await h.read_queue(pid, T, queue)) == [f"{queue}-{i}" for i in range(5)]
    producers.check(await h.read_queue(pids[0], T, Q))


async def test_a_drained_leader_hands_over_and_its_replica_moves(harness: ClusterHarness) -> None:
    h = await harness.start(nodes=3, managers=1)
    await h.wait_for("three nodes", lambda: _nodes(h, 3))
    await h.create_queue(T, Q, {"replication_factor": 2, "partitions": 1})
    pid = await h.partition_of(T, Q)
    await h.wait_for("two replicas", lambda: has_replicas(h, pid, 2))
    for i in range(5):
        await h.send_until_ok(pid, T, Q, f"m{i}")
    drained, _, epoch = await h.serving_leader(pid)
    assert h.coordinator is not None
    await h.manager_command("--drain", drained)
    assert await h.coordinator.get(h.layout.drain + drained) is not None

    async def moved() -> bool:
        record = (await h.partitions())[pid]
        return drained not in record.replicas and len(record.replicas) == 2

    await h.wait_for("the replica to leave the drained node", moved)
    _, _, new_epoch = await h.serving_leader(pid, not_node=drained)
    assert new_epoch > epoch
    record = (await h.partitions())[pid]
    await replicated_everywhere(h, pid, list(record.replicas))
    assert sorted(await h.read_queue(pid, T, Q)) == [f"m{i}" for i in range(5)]
    # The drained node no longer serves the partition. Its copy goes only on a tombstone the
    # manager writes once the new replica set committed past it (a stray until then): a
    # drain frees the node's disk.
    await h.wait_for("the drained node to stop serving the partition", lambda: _serves_not(h, drained, pid))
    await h.wait_for("the drained node to delete its copy", lambda: _hosts_nothing(h, drained, pid))
    await h.manager_command("--undrain", drained)
    assert await h.coordinator.get(h.layout.drain + drained) is None

    # Attribute changes in etcd reach the partition's store; a deleted queue leaves every node.
    await h.create_queue(T, Q, {"replication_factor": 2, "partitions": 1, "visibility_timeout_s": 7})

    async def updated() -> bool:
        info = await h.call_until_ok(pid, "get_queue", tenant=TenantId(T), name=QueueName(Q))
        return bool(info.attributes.visibility_timeout_s == 7)

    await h.wait_for("the new attributes on the leader", updated)
    # One replica is down while the queue is deleted: it sweeps the orphan when it is back.
    record = (await h.partitions())[pid]
    down = next(n for n in record.replicas if n != record.leader)
    h.nodes[down].kill()
    assert h.coordinator is not None
    key = h.layout.queue(T, Q)
    entry = await h.coordinator.get(key)
    assert entry is not None
    await h.coordinator.fenced_commit(
        key, Epoch(entry.create_revision), {}, [key], holder=entry.value
    )  # a delete
    await h.wait_for("the deleted queue's partition to leave the map", lambda: _unmapped(h, pid))
    assert (h.root / down / "partitions" / str(pid)).exists()
    h.nodes[down].start()
    for node in h.nodes:
        await h.wait_for(
            f"{node} to drop the deleted queue's partition", lambda n=node: _hosts_nothing(h, n, pid)
        )


async def _unmapped(h: ClusterHarness, pid: int) -> bool:
    return pid not in await h.partitions()


async def _nodes(h: ClusterHarness, count: int) -> bool:
    return len(await h.node_records()) >= count


async def _serves_not(h: ClusterHarness, node: str, pid: int) -> bool:
    record = (await h.node_records()).get(node)
    return record is not None and pid not in record.replicas


async def _hosts_nothing(h: ClusterHarness, node: str, pid: int) -> bool:
    record = (await h.node_records()).get(node)
    return (
        record is not None
        and pid not in record.replicas
        and not (h.root / node / "partitions" / str(pid)).exists()
    )


async def _active_manager(h: ClusterHarness) -> str | None:
    assert h.coordinator is not None
    entry = await h.coordinator.get(h.layout.manager)
    return entry.value.decode() if entry is not None else None
