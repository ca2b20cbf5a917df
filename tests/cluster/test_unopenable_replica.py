"""A replica a node cannot open costs that replica alone (real node processes, real etcd).

Found with this recipe (session 45): stop a node, overwrite one replica's ``data.mdb``, start
it. Each reconcile round opened the healthy replica, then failed on the damaged one and
gave up the round, leaving the healthy one open but unrecorded; every round after failed on
opening it a second time. The node served no partition at all and never published a
position again.
"""

from __future__ import annotations

from .processes import ClusterHarness

T = "acme"
RF3 = {"replication_factor": 3, "partitions": 1, "replication_mode": "sync"}


async def test_a_replica_that_cannot_be_opened_is_kept_as_a_stray_and_the_others_serve(
    harness: ClusterHarness,
) -> None:
    h = harness
    pids: dict[str, int] = {}
    sent: dict[str, list[str]] = {"healthy": [], "damaged": []}
    for queue in sent:
        await h.create_queue(T, queue, RF3)
        pids[queue] = await h.partition_of(T, queue)
        await h.serving_leader(pids[queue])
        for i in range(5):
            sent[queue].append(f"{queue}-{i}")
            await h.send_until_ok(pids[queue], T, queue, sent[queue][-1])
    healthy, damaged = pids["healthy"], pids["damaged"]

    h.nodes["n0"].stop()
    data = h.root / "n0" / "partitions" / str(damaged) / "data.mdb"
    original = data.read_bytes()
    garbage = b"\xa5" * len(original)
    data.write_bytes(garbage)
    h.nodes["n0"].start()

    async def n0_reports_both() -> bool:
        record = (await h.node_records()).get("n0")
        return (
            record is not None
            and record.state == "up"
            and healthy in record.replicas
            and damaged not in record.replicas
            and "cannot be opened here" in record.strays.get(damaged, "")
        )

    await h.wait_for("n0 to serve the healthy replica and report the damaged one", n0_reports_both)
    # n0 really serves the healthy partition: with the other follower down, a sync send
    # needs n0's acknowledgement.
    leader, _, _ = await h.serving_leader(healthy)
    other = next(node for node in h.nodes if node not in ("n0", leader))
    h.nodes[other].kill()
    sent["healthy"].append("healthy-after")
    await h.send_until_ok(healthy, T, "healthy", "healthy-after")
    # The damaged partition goes on on its two other replicas, and nothing is lost.
    h.nodes[other].start()
    sent["damaged"].append("damaged-after")
    await h.send_until_ok(damaged, T, "damaged", "damaged-after", timeout=60)
    for queue, bodies in sent.items():
        assert sorted(await h.read_queue(pids[queue], T, queue)) == sorted(bodies)
    # Kept as it was: never repaired, replaced or deleted behind the operator's back.
    assert data.read_bytes() == garbage

    # The operator puts the file right: the node opens it at its next try (every 30 s) and
    # serves it again, caught up on what was sent meanwhile.
    data.write_bytes(original)

    async def n0_serves_it_again() -> bool:
        records = await h.node_records()
        mine, lead = records.get("n0"), records.get(damaged_leader)
        return (
            mine is not None
            and lead is not None
            and damaged not in mine.strays
            and damaged in mine.replicas
            and damaged in lead.replicas
            and mine.replicas[damaged].lsn == lead.replicas[damaged].lsn
        )

    damaged_leader, _, _ = await h.serving_leader(damaged)
    await h.wait_for("n0 to open the repaired replica and catch up", n0_serves_it_again, timeout=60)


async def test_a_designated_leader_that_cannot_open_its_replica_gives_the_partition_up(
    harness: ClusterHarness,
) -> None:
    # n0 can open no new replica (its partitions directory cannot be made, as on a full
    # disk); a new queue is placed [n0, n1, n2] and n0, designated to lead it, never will.
    # Before session 46 the manager waited for n0 to campaign for as long as n0 was up, and
    # the queue was never served although two of its three replicas were fine.
    h = harness
    (h.root / "n0" / "partitions").write_text("not a directory: n0 can open no new replica")
    await h.create_queue(T, "q", RF3)
    pid = await h.partition_of(T, "q")
    assert (await h.partitions())[pid].replicas[0] == "n0"
    await h.send_until_ok(pid, T, "q", "m0")
    leader, _, _ = await h.serving_leader(pid)
    assert leader != "n0"
    record = (await h.node_records())["n0"]
    assert "cannot be opened here" in record.strays[pid]
    assert await h.read_queue(pid, T, "q") == ["m0"]
