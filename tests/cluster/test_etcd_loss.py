"""etcd lost or restored under a running cluster (docs/cluster.md, "Metadata survives etcd").

Real etcd (a member of this test's own, which it wipes and restores with ``etcdctl``), real
node and manager processes, a real gateway: an etcd that comes back empty is refused by the
nodes' cluster identity and deletes nothing; the gateway is not ready meanwhile; after the
operator restores a snapshot, every acknowledged message is served again, without restarting
anything; after a restore from an older snapshot, partitions made since are kept as strays
and reported, and a leader change made since cannot fence the cluster out.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import msgpack
import pytest
from prometheus_client.parser import text_string_to_metric_families

from backend_store.cluster.coordination.layout import ClusterIdentity
from tests.fixtures.etcd_server import EtcdCluster, etcd_cluster, unique_prefix

from .conftest import running_cluster_gateway
from .etcd_operator import restore, snapshot_save, wipe
from .processes import ClusterHarness

T = "acme"
RF3 = {"replication_factor": 3, "partitions": 1, "replication_mode": "sync"}


def _scale() -> float:
    return float(os.environ.get("PUSHGATE_TEST_TIMEOUT_SCALE", "1"))


@pytest.fixture
def own_etcd(tmp_path: Path) -> Iterator[EtcdCluster]:
    with etcd_cluster(tmp_path / "etcd") as cluster:
        yield cluster


@pytest.fixture
async def cluster(own_etcd: EtcdCluster, tmp_path: Path) -> AsyncIterator[ClusterHarness]:
    (tmp_path / "cluster").mkdir()
    h = ClusterHarness(own_etcd.endpoints, tmp_path / "cluster", unique_prefix("loss") + "/")
    try:
        yield await h.start(nodes=3, managers=1)
    finally:
        await h.close()


def _replica_files(h: ClusterHarness, pid: int) -> dict[str, int]:
    """Each node's bytes in its replica's LMDB data file (0: missing)."""
    sizes = {}
    for node in h.nodes:
        data = h.root / node / "partitions" / str(pid) / "data.mdb"
        sizes[node] = data.stat().st_size if data.exists() else 0
    return sizes


async def _readyz(client: httpx.AsyncClient) -> httpx.Response:
    return await client.get("/readyz")


async def _all_refuse(h: ClusterHarness, words: str) -> bool:
    records = await h.node_records()
    return set(records) == set(h.nodes) and all(
        r.state == "refused" and r.refusal is not None and words in r.refusal for r in records.values()
    )


async def test_an_etcd_that_comes_back_empty_deletes_nothing_and_a_restore_serves_everything(
    cluster: ClusterHarness, own_etcd: EtcdCluster, tmp_path: Path
) -> None:
    h = cluster
    await h.create_queue(T, "orders", RF3)
    pid = await h.partition_of(T, "orders")
    await h.serving_leader(pid)
    sent = [f"m{i}" for i in range(100)]
    for body in sent:
        await h.send_until_ok(pid, T, "orders", body)
    with running_cluster_gateway(
        h, tmp_path / "gateway", metrics_listen="127.0.0.1:0", monitor_interval_s=0.2
    ) as gateway:
        listener = gateway.app.state.operations.listener
        assert listener is not None  # /metrics without a token: the keys live in etcd
        metrics = f"http://127.0.0.1:{listener.bound_port}/metrics"
        async with httpx.AsyncClient(base_url=gateway.url, timeout=10) as client:
            await h.wait_for("the gateway to be ready", lambda: _status(client, 200))
            await h.wait_for(
                "the metrics to trust etcd", lambda: _identity_metrics(client, metrics, 1.0, 0.0)
            )
            snapshot = snapshot_save(own_etcd, tmp_path / "etcd.snapshot")
            before = _replica_files(h, pid)
            assert all(before.values()), before

            wipe(own_etcd)
            # The nodes refuse the empty etcd and say why; nothing is deleted.
            await h.wait_for(
                "every node to refuse the empty etcd", lambda: _all_refuse(h, "holds no cluster id")
            )
            for node in h.nodes.values():
                assert "holds no cluster id but this node belongs to cluster" in node.log_tail(200_000)
            # The gateway is not ready while etcd holds no cluster.
            await h.wait_for("the gateway to be not ready", lambda: _status(client, 503))
            reply = await _readyz(client)
            assert "cannot be trusted" in reply.text, reply.text
            # And the metrics say so: the gateway's verdict, and each node's refusal.
            await h.wait_for(
                "the metrics to distrust etcd", lambda: _identity_metrics(client, metrics, 0.0, 1.0)
            )
            # Time for the deletions the old code made within 15 s: a reconcile runs every
            # 0.2 s, and each node has refused for a while.
            await asyncio.sleep(3 * _scale())
            assert _replica_files(h, pid) == before

            restore(own_etcd, snapshot)
            # Everything acknowledged is served again, with no process restarted.
            bodies = await h.wait_for(
                "every acknowledged message back", lambda: _all_of(h, pid, "orders", sent), timeout=60
            )
            assert bodies == sent
            await h.wait_for("the gateway ready again", lambda: _status(client, 200), timeout=60)
            await h.wait_for(
                "the metrics to trust etcd again", lambda: _identity_metrics(client, metrics, 1.0, 0.0)
            )


async def test_a_node_added_while_etcd_is_empty_founds_no_second_cluster(
    own_etcd: EtcdCluster, tmp_path: Path
) -> None:
    """A node added (a fresh data directory) while etcd is empty must not make a cluster id
    of its own: the cluster's nodes would refuse that etcd, and after the restore the new
    node would refuse the restored one for good (simulation seed ``all`` 452512)."""
    (tmp_path / "cluster").mkdir()
    h = ClusterHarness(own_etcd.endpoints, tmp_path / "cluster", unique_prefix("found") + "/")
    try:
        await h.start(nodes=4, managers=1, running=3)
        assert h.coordinator is not None
        pid, _, sent = await _queue_with_sends(h, "orders")
        snapshot = snapshot_save(own_etcd, tmp_path / "etcd.snapshot")
        old, new = ["n0", "n1", "n2"], "n3"

        async def refusing(names: list[str], words: str) -> bool:
            records = await h.node_records()
            return all(
                name in records and records[name].state == "refused" and words in str(records[name].refusal)
                for name in names
            )

        wipe(own_etcd)
        await h.wait_for("the nodes to refuse the empty etcd", lambda: refusing(old, "holds no cluster id"))
        h.nodes[new].start()
        await h.wait_for("the new node to refuse", lambda: refusing([new], "will not found a second cluster"))
        assert await h.coordinator.get(h.layout.cluster) is None
        assert "refusing to serve or delete anything" in h.nodes[new].log_tail(200_000)

        restore(own_etcd, snapshot)

        async def all_up() -> bool:
            records = await h.node_records()
            return set(records) == {*old, new} and all(r.state == "up" for r in records.values())

        await h.wait_for("every node, the new one too, to serve the restored etcd", all_up, timeout=60)
        assert (tmp_path / "cluster" / new / "cluster-id").read_text().strip() == (
            (tmp_path / "cluster" / "n0" / "cluster-id").read_text().strip()
        )
        bodies = await h.wait_for(
            "every acknowledged message back", lambda: _all_of(h, pid, "orders", sent), timeout=60
        )
        assert bodies == sent
    finally:
        await h.close()


async def test_a_restore_from_an_older_snapshot_keeps_what_was_made_since(
    cluster: ClusterHarness, own_etcd: EtcdCluster, tmp_path: Path
) -> None:
    h = cluster
    assert h.coordinator is not None
    await h.create_queue(T, "early", RF3)
    early = await h.partition_of(T, "early")
    await h.serving_leader(early)
    acked = [f"e{i}" for i in range(20)]
    for body in acked:
        await h.send_until_ok(early, T, "early", body)
    snapshot = snapshot_save(own_etcd, tmp_path / "etcd.snapshot")

    # Made after the snapshot: a queue, its messages, more messages to the early queue, and
    # etcd revisions (so that the leader change below is far past the snapshot's revision).
    await h.create_queue(T, "late", RF3)
    late = await h.partition_of(T, "late")
    await h.serving_leader(late)
    for i in range(20):
        await h.send_until_ok(late, T, "late", f"l{i}")
    # Far past: a node whose campaigns fail on the fence burns about ten revisions a second,
    # so without a raised incarnation the queue would stay leaderless for minutes.
    coordinator = h.coordinator
    for start in range(0, 3000, 100):
        await asyncio.gather(
            *(coordinator.put(f"{h.prefix}scratch/{i}", b"x") for i in range(start, start + 100))
        )
    old_leader, _, old_epoch = await h.serving_leader(early)
    h.nodes[old_leader].kill()
    _, _, new_epoch = await h.serving_leader(early, not_node=old_leader)
    assert new_epoch > old_epoch
    for i in range(20, 40):
        body = f"e{i}"
        await h.send_until_ok(early, T, "early", body)
        acked.append(body)
    h.nodes[old_leader].start()
    late_files = _replica_files(h, late)
    assert all(late_files.values()), late_files

    restore(own_etcd, snapshot)

    # The early queue serves every message acknowledged, before and after the snapshot: its
    # new leader's epoch is past the fence the post-snapshot leader left (a raised incarnation).
    bodies = await h.wait_for(
        "the early queue's messages", lambda: _all_of(h, early, "early", acked), timeout=90
    )
    assert bodies == acked
    _, _, epoch = await h.serving_leader(early)
    assert epoch > new_epoch
    identity = await h.coordinator.get(h.layout.cluster)
    assert identity is not None and ClusterIdentity.unpack(identity.value).incarnation >= 1
    # The late queue's partition is named by no record: kept on every node and reported.
    await h.wait_for("every node to report the late partition as a stray", lambda: _strays(h, late))
    assert all(_replica_files(h, late).values())
    # The operator deletes one stray on purpose; the others stay.
    await h.manager_command("--delete-stray", f"n0:{late}")
    await h.wait_for("n0 to delete its stray", lambda: _gone(h, "n0", late))
    assert all(size for node, size in _replica_files(h, late).items() if node != "n0")
    # A queue made now gets a new partition id, not the late queue's.
    await h.create_queue(T, "newer", RF3)
    newer = await h.partition_of(T, "newer")
    assert newer > late
    await h.send_until_ok(newer, T, "newer", "n0", timeout=60)


async def _queue_with_sends(h: ClusterHarness, queue: str) -> tuple[int, str, list[str]]:
    """An RF 3 queue of one partition with ten acknowledged sends: its partition, its
    leader and the bodies."""
    await h.create_queue(T, queue, RF3)
    pid = await h.partition_of(T, queue)
    leader, _, _ = await h.serving_leader(pid)
    sent = [f"b{i}" for i in range(10)]
    for body in sent:
        await h.send_until_ok(pid, T, queue, body)
    return pid, leader, sent


async def _identity_metrics(client: httpx.AsyncClient, url: str, trusted: float, refused: float) -> bool:
    """Whether /metrics shows the gateway's trust as ``trusted`` and every node's refusal as
    ``refused``."""
    try:
        text = (await client.get(url)).text
    except httpx.HTTPError:
        return False
    families = {f.name: f for f in text_string_to_metric_families(text)}
    if "pushgate_cluster_metadata_trusted" not in families or "pushgate_cluster_node_refused" not in families:
        return False
    nodes = [s.value for s in families["pushgate_cluster_node_refused"].samples]
    return [s.value for s in families["pushgate_cluster_metadata_trusted"].samples] == [trusted] and (
        len(nodes) == 3 and all(value == refused for value in nodes)
    )


async def _status(client: httpx.AsyncClient, code: int) -> bool:
    try:
        return (await _readyz(client)).status_code == code
    except httpx.HTTPError:
        return False


async def _all_of(h: ClusterHarness, pid: int, queue: str, expected: list[str]) -> list[str] | None:
    try:
        bodies = await h.read_queue(pid, T, queue)
    except AssertionError:
        return None
    return bodies if sorted(bodies) == sorted(expected) else None


async def _strays(h: ClusterHarness, pid: int) -> bool:
    records = await h.node_records()
    return set(records) == set(h.nodes) and all(
        r.state == "up" and pid in r.strays and pid not in r.replicas for r in records.values()
    )


async def _gone(h: ClusterHarness, node: str, pid: int) -> bool:
    record = (await h.node_records()).get(node)
    return (
        record is not None
        and pid not in record.strays
        and not (h.root / node / "partitions" / str(pid)).exists()
        and await h.coordinator.get(h.layout.tombstone(pid, node)) is None  # type: ignore[union-attr]
    )


async def test_a_restore_that_undoes_a_move_does_not_count_the_copy_made_again(
    own_etcd: EtcdCluster, tmp_path: Path
) -> None:
    """The simulation's seeds ``all`` 222767, 234061, 240328 as an operator meets them. A
    drain moves a replica from X to the spare Y, and X deletes its copy on the move's
    tombstone (keeping a receipt). Follower B goes down; sends are acknowledged by the
    leader A and Y. A and Y go down, etcd is restored from a snapshot taken before the move
    (its set is A, B, X), and B comes back. X makes a new, empty copy on the restored record:
    counted, it and B would be a majority, and B would lead without the sends (it did,
    before receipts). It is published as made again and counts for nothing, so the
    partition waits for A; once A and Y are back, every acknowledged message is served."""
    (tmp_path / "cluster").mkdir()
    h = ClusterHarness(own_etcd.endpoints, tmp_path / "cluster", unique_prefix("undo") + "/")
    try:
        await h.start(nodes=4, managers=1, running=3)
        pid, a, before = await _queue_with_sends(h, "moved")
        snapshot = snapshot_save(own_etcd, tmp_path / "etcd.snapshot")
        b, x = sorted(n for n in (await h.partitions())[pid].replicas if n != a)
        (y,) = set(h.nodes) - {a, b, x}
        h.nodes[y].start()
        await h.wait_registered([y])

        await h.manager_command("--drain", x)
        await h.wait_for(f"{x}'s copy moved to {y} and deleted", lambda: _gone(h, x, pid), timeout=60)
        assert (h.root / x / "receipts" / str(pid)).is_file()
        assert set((await h.partitions())[pid].replicas) == {a, b, y}
        h.nodes[b].kill()
        during = [f"d{i}" for i in range(10)]
        for body in during:  # acknowledged by A and Y
            await h.send_until_ok(pid, T, "moved", body)
        h.nodes[a].kill()
        h.nodes[y].kill()

        restore(own_etcd, snapshot)
        h.nodes[b].start()
        await h.wait_for(f"{x} to publish its new copy as made again", lambda: _remade(h, x, pid), timeout=60)
        # Neither B nor X leads for a few lease TTLs, long enough for a promotion on their
        # positions: checked at every poll, so a leader made at any moment fails at once (the
        # key the snapshot holds, A's, lasts until its restored lease expires).
        await _not_led_by(h, pid, {b, x}, 4 * h.lease_ttl * _scale())
        assert await h.leader(pid) is None

        h.nodes[a].start()
        h.nodes[y].start()
        bodies = await h.wait_for(
            "every acknowledged message", lambda: _all_of(h, pid, "moved", before + during), timeout=90
        )
        assert bodies == before + during
    finally:
        await h.close()


async def _remade(h: ClusterHarness, node: str, pid: int) -> bool:
    record = (await h.node_records()).get(node)
    position = record.replicas.get(pid) if record is not None else None
    return position is not None and position.remade is not None


async def _not_led_by(h: ClusterHarness, pid: int, nodes: set[str], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        leader = await h.leader(pid)
        assert leader is None or leader[0] not in nodes, (
            f"{leader} leads without the copies holding the sends"
        )
        await asyncio.sleep(0.05)


def _served_set(h: ClusterHarness, node: str, pid: int) -> set[str] | None:
    """The voting set ``node``'s copy of ``pid`` keeps on its disk (``DATA/sets/``)."""
    path = h.root / node / "sets" / str(pid)
    return set(msgpack.unpackb(path.read_bytes())["voters"]) if path.is_file() else None


async def _publishes_earlier_set(h: ClusterHarness, node: str, pid: int, voters: set[str]) -> bool:
    record = (await h.node_records()).get(node)
    served = record.served_sets.get(pid) if record is not None else None
    return served is not None and set(served.voters) == voters


async def test_a_node_back_after_its_replacement_does_not_make_a_majority_after_a_restore(
    own_etcd: EtcdCluster, tmp_path: Path
) -> None:
    """The simulation's seed ``returns`` 255 as an operator meets it. Follower C dies; the
    operator drains it, and its replica moves to the spare Y (C, dead, deletes nothing and
    keeps no receipt). B is frozen while sends are acknowledged by the leader A and Y; A and
    Y go down, B runs again, etcd is restored from a snapshot taken before the move (its set
    is A, B, C) and C's host comes back with its old copy. B and C are a majority of the
    restored set, and either would lead without the sends. B's copy was served on A, B, Y,
    and B publishes that set: nobody leads until a majority of it is back; then every
    acknowledged message is served."""
    (tmp_path / "cluster").mkdir()
    h = ClusterHarness(own_etcd.endpoints, tmp_path / "cluster", unique_prefix("back") + "/")
    try:
        await h.start(nodes=4, managers=1, running=3)
        pid, a, before = await _queue_with_sends(h, "replaced")
        snapshot = snapshot_save(own_etcd, tmp_path / "etcd.snapshot")
        b, c = sorted(n for n in (await h.partitions())[pid].replicas if n != a)
        (y,) = set(h.nodes) - {a, b, c}
        h.nodes[c].kill()
        h.nodes[y].start()
        await h.wait_registered([y])

        await h.manager_command("--drain", c)
        newer = {a, b, y}

        async def moved() -> bool:
            record = (await h.partitions())[pid]
            return set(record.replicas) == newer and not record.learners and _served_set(h, b, pid) == newer

        await h.wait_for(f"{c}'s replica moved to {y}, and {b} served on the new set", moved, timeout=60)
        h.nodes[b].signal(signal.SIGSTOP)
        during = [f"d{i}" for i in range(10)]
        for body in during:  # acknowledged by A and Y
            await h.send_until_ok(pid, T, "replaced", body)
        h.nodes[a].kill()
        h.nodes[y].kill()
        h.nodes[b].signal(signal.SIGCONT)

        restore(own_etcd, snapshot)
        h.nodes[c].start()
        await h.wait_for(
            f"{b} to publish the set its copy was served on",
            lambda: _publishes_earlier_set(h, b, pid, newer),
            timeout=60,
        )
        # Neither B nor C leads for a few lease TTLs, long enough for a promotion on their
        # positions (checked at every poll: a leader made at any moment fails at once).
        await _not_led_by(h, pid, {b, c}, 4 * h.lease_ttl * _scale())

        h.nodes[a].start()
        h.nodes[y].start()
        bodies = await h.wait_for(
            "every acknowledged message", lambda: _all_of(h, pid, "replaced", before + during), timeout=90
        )
        assert bodies == before + during
    finally:
        await h.close()


async def test_a_restore_made_while_every_node_was_down_is_noticed_by_the_records(
    own_etcd: EtcdCluster, tmp_path: Path
) -> None:
    """Session 40's case (simulation seeds ``bumped`` 23, 25, 31): a restore nobody's
    revisions show. The leader A is killed; B is promoted and acknowledges sends with C.
    Every process stops; etcd is restored from a snapshot taken before the promotion (its
    record designates A) and written to past every revision the lost etcd had made (as a
    restore with ``--bump-revision`` is at once), so no fence and no epoch a node remembers
    is ahead of it. Then every process starts again. Judged by revisions, A's designation
    is current, and A would lead without the sends. B and C hold the partition's record
    marked at a newer mod revision than the restored one: etcd went back, the incarnation
    is raised, the manager designates anew, and every acknowledged message is served."""
    (tmp_path / "cluster").mkdir()
    h = ClusterHarness(own_etcd.endpoints, tmp_path / "cluster", unique_prefix("down") + "/")
    try:
        await h.start(nodes=3, managers=1)
        coordinator = h.coordinator
        assert coordinator is not None
        pid, a, before = await _queue_with_sends(h, "restored")
        snapshot = snapshot_save(own_etcd, tmp_path / "etcd.snapshot")

        h.nodes[a].kill()
        await h.serving_leader(pid, not_node=a)
        during = [f"d{i}" for i in range(10)]
        for body in during:  # acknowledged by B and C
            await h.send_until_ok(pid, T, "restored", body)
        last_revision = (await coordinator.read_prefix(h.layout.cluster)).revision
        for proc in [*h.managers, *h.nodes.values()]:
            if proc.running:
                proc.kill()

        await _restore_bumped(h, own_etcd, snapshot, last_revision)
        # A back first, alone (session 86, simulation seed ``down`` 38): the restored records
        # of B and C stand for one more TTL under the snapshot's leases. Counted as a majority
        # of the voters, they let A lead on its restored designation, without the sends.
        h.nodes[a].start()
        await h.wait_for("A to register", lambda: _written_since(h, h.layout.node(a), last_revision))
        waited_until = time.monotonic() + h.lease_ttl + 1.0
        while time.monotonic() < waited_until:  # the restored key (A's, from the snapshot) aside
            assert not await _written_since(h, h.layout.leader(pid), last_revision), h.nodes[a].log_tail()
            await asyncio.sleep(0.05)
        for proc in [*h.nodes.values(), *h.managers]:
            if not proc.running:
                proc.start()

        bodies = await h.wait_for(
            "every acknowledged message", lambda: _all_of(h, pid, "restored", before + during), timeout=90
        )
        assert bodies == before + during
        identity = await coordinator.get(h.layout.cluster)
        assert identity is not None and ClusterIdentity.unpack(identity.value).incarnation >= 1
        assert any(
            "older than this node saw them" in h.nodes[n].log_tail(200_000) for n in h.nodes if n != a
        ), h.logs()
    finally:
        await h.close()


async def _written_since(h: ClusterHarness, key: str, revision: int) -> bool:
    """Whether etcd holds ``key`` as written after ``revision`` (not as a restore brought it)."""
    coordinator = h.coordinator
    assert coordinator is not None
    entry = await coordinator.get(key)
    return entry is not None and entry.mod_revision > revision


async def test_a_restore_no_record_shows_is_noticed_by_the_keys_of_running_nodes(
    own_etcd: EtcdCluster, tmp_path: Path
) -> None:
    """Session 41's case (simulation mix ``late``): a restore made after the last change of
    every partition record, whose revisions are ahead of every one made before, under nodes
    that run across it. The snapshot is taken once the queue is placed and led; ten more sends
    are acknowledged, and each node writes its record again with the new positions. Every
    process is frozen; etcd is restored and written past every revision it had made (as
    ``--bump-revision`` is at once); every process thaws. Neither revisions (ahead) nor the
    records' marks (the map is unchanged) show the restore; a node's own record, back at the
    snapshot's mod revision, does: the incarnation is raised, and every message is served."""
    (tmp_path / "cluster").mkdir()
    # A TTL long enough for the sessions to outlive the freeze: the nodes run across it.
    h = ClusterHarness(own_etcd.endpoints, tmp_path / "cluster", unique_prefix("late") + "/", lease_ttl=10.0)
    try:
        await h.start(nodes=3, managers=1)
        coordinator = h.coordinator
        assert coordinator is not None
        pid, _, before = await _queue_with_sends(h, "late")
        snapshot = snapshot_save(own_etcd, tmp_path / "etcd.snapshot")
        after_snapshot = await coordinator.read_prefix(h.layout.partitions)
        marked = after_snapshot.mod_revisions()
        during = [f"d{i}" for i in range(10)]
        for body in during:
            await h.send_until_ok(pid, T, "late", body)
        await h.wait_for(
            "every node to write its record since the snapshot",
            lambda: _records_written_since(h, after_snapshot.revision),
        )
        assert (await coordinator.read_prefix(h.layout.partitions)).mod_revisions() == marked
        last_revision = (await coordinator.read_prefix(h.layout.cluster)).revision
        processes = [p for p in [*h.managers, *h.nodes.values()] if p.running]
        for proc in processes:
            proc.signal(signal.SIGSTOP)
        try:
            await _restore_bumped(h, own_etcd, snapshot, last_revision)
        finally:
            for proc in processes:
                proc.signal(signal.SIGCONT)

        async def raised() -> bool:
            identity = await coordinator.get(h.layout.cluster)
            return identity is not None and ClusterIdentity.unpack(identity.value).incarnation >= 1

        await h.wait_for("the incarnation to be raised", raised, timeout=30)
        noticed = [
            line
            for n in h.nodes
            for line in h.nodes[n].log_tail(200_000).splitlines()
            if "older than this node saw them" in line and "nodes/" in line
        ]
        assert noticed, h.logs()  # by its own record, not by a record's mark
        bodies = await h.wait_for(
            "every acknowledged message", lambda: _all_of(h, pid, "late", before + during), timeout=90
        )
        assert bodies == before + during
    finally:
        await h.close()


async def _records_written_since(h: ClusterHarness, revision: int) -> bool:
    coordinator = h.coordinator
    assert coordinator is not None
    revisions = (await coordinator.read_prefix(h.layout.nodes)).mod_revisions()
    return set(revisions) >= set(h.nodes) and all(revisions[n] > revision for n in h.nodes)


async def _restore_bumped(h: ClusterHarness, etcd: EtcdCluster, snapshot: Path, last_revision: int) -> None:
    """Restore ``snapshot`` and write past ``last_revision``, the lost etcd's last: as
    ``etcdutl snapshot restore --bump-revision`` leaves it (only etcdctl 3.4 is installed)."""
    coordinator = h.coordinator
    assert coordinator is not None
    restore(etcd, snapshot)
    restored_revision = await _revision_once_up(h)
    assert restored_revision < last_revision
    for start in range(restored_revision, last_revision + 50, 100):
        await asyncio.gather(
            *(coordinator.put(f"{h.prefix}scratch/{i}", b"x") for i in range(start, start + 100))
        )
    assert (await coordinator.read_prefix(h.layout.cluster)).revision > last_revision


async def _revision_once_up(h: ClusterHarness) -> int:
    """etcd's revision, asked again until the restored member answers (the test's client
    reconnects with a back-off: a first read right after the restore failed under load)."""
    coordinator = h.coordinator
    assert coordinator is not None

    async def revision() -> int:
        return (await coordinator.read_prefix(h.layout.cluster)).revision

    found: int = await h.wait_for("etcd to answer after the restore", revision)
    return found
