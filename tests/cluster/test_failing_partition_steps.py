"""A step of a node's reconcile round that keeps failing for one partition costs that
partition alone (real node processes, real etcd).

Found by reading, after session 45's unopenable replica (test_unopenable_replica.py), and
reproduced with these recipes (session 46). A node's round was all or nothing: one step that
raised for one partition ended the round before the node published its record or reconciled
the partitions after it, and the next round failed the same way. The node's record stopped
changing for every partition (positions, strays), and no partition of the node changed role
again. Two steps write a small file first, so a full disk fails them every time:

- a deletion on a move's tombstone keeps the move's receipt before the copy goes
  (node/receipts.py); here the ``receipts`` path is a file, so the receipt cannot be written;
- a replica served on a new voting set keeps that set first (node/served_sets.py); here the
  ``sets`` path is a file.

Each recipe's node must go on serving and publishing its other partitions, report the
failing one, keep its data, and finish the step once the file can be written.
"""

from __future__ import annotations

import collections
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from backend_store.cluster.node.receipts import RECEIPTS_DIR
from backend_store.cluster.node.served_sets import SETS_DIR
from tests.fixtures.etcd_server import unique_prefix

from .processes import ClusterHarness
from .workload import has_replicas, replicated_everywhere

T = "acme"


@pytest.fixture
async def harness(etcd_endpoints: list[str], tmp_path: Path) -> AsyncIterator[ClusterHarness]:
    h = ClusterHarness(etcd_endpoints, tmp_path, unique_prefix("steps") + "/")
    try:
        yield h
    finally:
        await h.close()


async def _lsn(h: ClusterHarness, node: str, pid: int) -> int | None:
    record = (await h.node_records()).get(node)
    position = record.replicas.get(pid) if record is not None else None
    return position.lsn if position is not None else None


async def test_a_deletion_whose_receipt_cannot_be_written_costs_that_replica_alone(
    harness: ClusterHarness,
) -> None:
    # Two nodes hold three queues' replicas; a third joins and the manager moves one replica
    # off each of them (a rebalance), deleting the old copies on tombstones with receipts.
    h = await harness.start(nodes=3, managers=1, running=2)
    queues = ["q0", "q1", "q2"]
    for queue in queues:
        await h.create_queue(T, queue, {"replication_factor": 2, "partitions": 1})
    pids = {queue: await h.partition_of(T, queue) for queue in queues}
    for pid in pids.values():
        await h.wait_for("two replicas", lambda pid=pid: has_replicas(h, pid, 2))
    sent: dict[str, list[str]] = collections.defaultdict(list)
    for queue, pid in pids.items():
        for i in range(3):
            sent[queue].append(f"{queue}-{i}")
            await h.send_until_ok(pid, T, queue, sent[queue][-1])
    blocker = h.root / "n0" / RECEIPTS_DIR
    blocker.write_text("not a directory: n0 cannot keep a receipt (as on a full disk)")
    h.nodes["n2"].start()

    async def moved_off_n0() -> int | None:
        records = await h.partitions()
        return next((pid for pid in pids.values() if "n0" not in records[pid].members), None)

    moved: int = await h.wait_for("a replica to move off n0", moved_off_n0, timeout=60)
    copy = h.root / "n0" / "partitions" / str(moved)

    async def reported() -> bool:
        record = (await h.node_records()).get("n0")
        why = record.strays.get(moved, "") if record is not None else ""
        return why.startswith("deleting its copy failed") and copy.is_dir()

    await h.wait_for("n0 to report the copy it cannot delete, and keep it", reported)
    # n0 goes on with the partitions it keeps: it follows new sends and publishes them.
    kept = {q: pid for q, pid in pids.items() if pid != moved and "n0" in (await h.partitions())[pid].members}
    assert kept
    for queue, pid in kept.items():
        before = await _lsn(h, "n0", pid)
        assert before is not None
        sent[queue].append(f"{queue}-after")
        await h.send_until_ok(pid, T, queue, sent[queue][-1])

        async def n0_published_it(pid: int = pid, before: int = before) -> bool:
            return (await _lsn(h, "n0", pid) or 0) > before

        await h.wait_for("n0 to publish the new send", n0_published_it)

    # The disk has room again: the copy goes, its receipt kept, and n0 reports nothing stray.
    blocker.unlink()

    async def deleted() -> bool:
        record = (await h.node_records()).get("n0")
        return (
            record is not None
            and moved not in record.strays
            and moved not in record.replicas
            and not copy.exists()
            and (blocker / str(moved)).is_file()
        )

    await h.wait_for("n0 to delete the copy once it can keep the receipt", deleted)
    for queue, pid in pids.items():
        assert sorted(await h.read_queue(pid, T, queue)) == sorted(sent[queue])


async def test_a_served_set_that_cannot_be_kept_costs_that_replica_alone(harness: ClusterHarness) -> None:
    h = await harness.start(nodes=3, managers=1)
    rf3 = {"replication_factor": 3, "partitions": 1, "replication_mode": "sync"}
    # Three partitions, their leaders spread over the three nodes: the next queue's leader is
    # then the first of its set, n0.
    await h.create_queue(T, "first", {**rf3, "partitions": 3})
    first = await h.partition_of(T, "first")
    for index in (1, 2):
        await h.partition_of(T, "first", index)
    await h.send_until_ok(first, T, "first", "first-0")
    await replicated_everywhere(h, first, ["n0", "n1", "n2"])
    sets = h.root / "n0" / SETS_DIR
    aside = sets.with_name("sets.aside")
    sets.rename(aside)
    sets.write_text("not a directory: n0 cannot keep a served set (as on a full disk)")

    # A new queue designated to n0, which cannot keep its voting set: n0 does not serve it,
    # says why, and another replica is promoted in its place.
    await h.create_queue(T, "second", rf3)
    second = await h.partition_of(T, "second")
    placed = (await h.partitions())[second]
    # Designated n0 at first (or already promoted over: designated anew).
    assert placed.leader == "n0" or placed.designation > 0

    async def n0_reports_it() -> bool:
        record = (await h.node_records()).get("n0")
        if record is None or second in record.replicas:
            return False
        return record.strays.get(second, "").startswith("keeping on disk what serving it needs failed")

    await h.send_until_ok(second, T, "second", "second-0")
    leader, _, _ = await h.serving_leader(second)
    assert leader != "n0"
    await h.wait_for("n0 to report the replica it cannot serve", n0_reports_it)
    # n0 goes on with the first queue: it follows new sends and publishes them (before, its
    # record stopped changing at the first failed round).
    before = await _lsn(h, "n0", first)
    assert before is not None
    await h.send_until_ok(first, T, "first", "first-1")

    async def n0_published_it() -> bool:
        return (await _lsn(h, "n0", first) or 0) > before

    await h.wait_for("n0 to publish the first queue's new send", n0_published_it)
    await replicated_everywhere(h, first, ["n0", "n1", "n2"])

    # Once the set can be kept, n0 tries again (every 30 s), keeps it and serves the second
    # queue, caught up.
    sets.unlink()
    aside.rename(sets)
    kept = sets / str(second)

    async def n0_serves_it() -> bool:
        record = (await h.node_records()).get("n0")
        return (
            kept.is_file()
            and record is not None
            and second in record.replicas
            and second not in record.strays
        )

    await h.wait_for("n0 to keep the second queue's set and serve it", n0_serves_it, timeout=60)
    await h.send_until_ok(second, T, "second", "second-1")
    await replicated_everywhere(h, second, ["n0", "n1", "n2"])
    assert sorted(await h.read_queue(first, T, "first")) == ["first-0", "first-1"]
    assert sorted(await h.read_queue(second, T, "second")) == ["second-0", "second-1"]
