"""A node deletes no replica because the map does not name it (docs/cluster.md, "Never
delete on absence"), and acts on nothing in an etcd that does not hold its cluster.

Real node and manager processes on the session's etcd (``harness``): a partition record
that cannot be parsed leaves its replicas kept and reported, and served again once the
record is readable; a node started with another ``--prefix`` (an etcd namespace without its
cluster) refuses, says why, deletes nothing, and serves again with its own prefix.
"""

from __future__ import annotations

from backend_store.cluster.coordination.layout import PartitionRecord

from .processes import ClusterHarness

T = "acme"
RF3 = {"replication_factor": 3, "partitions": 1}


def _files(h: ClusterHarness, pid: int) -> dict[str, bool]:
    return {n: (h.root / n / "partitions" / str(pid) / "data.mdb").exists() for n in h.nodes}


async def _reported(h: ClusterHarness, pid: int, words: str) -> bool:
    records = await h.node_records()
    return set(records) == set(h.nodes) and all(words in r.strays.get(pid, "") for r in records.values())


async def test_an_unreadable_partition_record_deletes_nothing(harness: ClusterHarness) -> None:
    h = harness
    assert h.coordinator is not None
    await h.create_queue(T, "q", RF3)
    pid = await h.partition_of(T, "q")
    await h.serving_leader(pid)
    for i in range(10):
        await h.send_until_ok(pid, T, "q", f"m{i}")
    key = h.layout.partition(pid)
    entry = await h.coordinator.get(key)
    assert entry is not None
    good = entry.value
    # Stop the manager first: it would rewrite the record (or plan on what it cannot read).
    for manager in h.managers:
        manager.stop()
    await h.coordinator.put(key, b"\xc1 not msgpack")

    await h.wait_for("every node to keep the replica as a stray", lambda: _reported(h, pid, "cannot be read"))
    assert all(_files(h, pid).values())

    await h.coordinator.put(key, good)
    for manager in h.managers:
        manager.start()
    assert sorted(await h.read_queue(pid, T, "q")) == sorted(f"m{i}" for i in range(10))
    assert PartitionRecord.unpack(good).replicas


async def test_a_node_started_with_another_prefix_refuses_and_deletes_nothing(
    harness: ClusterHarness,
) -> None:
    h = harness
    await h.create_queue(T, "q", RF3)
    pid = await h.partition_of(T, "q")
    await h.serving_leader(pid)
    for i in range(10):
        await h.send_until_ok(pid, T, "q", f"m{i}")
    node = h.nodes["n2"]
    node.stop()
    right = list(node.argv)
    wrong = list(right)
    wrong[wrong.index("--prefix") + 1] = h.prefix.rstrip("/") + "-other/"
    node.argv = wrong
    before = node.log_path.stat().st_size
    node.start()

    async def refused() -> bool:
        return "holds no cluster id but this node belongs to cluster" in node.log_path.read_text()[before:]

    await h.wait_for("n2 to refuse the other prefix", refused)
    assert node.running
    assert _files(h, pid)["n2"]

    node.stop()
    node.argv = right
    node.start()

    async def serving_again() -> bool:
        record = (await h.node_records()).get("n2")
        return record is not None and record.state == "up" and pid in record.replicas

    await h.wait_for("n2 to serve its replica again", serving_again)
    assert sorted(await h.read_queue(pid, T, "q")) == sorted(f"m{i}" for i in range(10))
