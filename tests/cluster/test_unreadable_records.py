"""A partition record that cannot be read is neither absent nor changed.

Found by the deterministic simulation (``etcd`` seeds 3, 8, 11 and ``all`` 10, 13, 21, 24 on
the recovered tree of session 28, fault ``corrupt-record``): the manager dropped the record
from its view and placed the queue's index anew under a new id, so the acknowledged messages
on the old replicas were no longer read, and the gateway forgot the partition. Now every
reader (node, manager, gateway) keeps what it last read of it, the manager writes that again
(which repairs the key), and a manager that never read it places nothing while it cannot.
Since session 36 such a manager rebuilds it from the records the nodes serving it kept
(``NodeRecord.kept``, manager/recovery.py): before, the partition stayed unserved for good
once its leader's key went (simulation seeds ``all`` 130473, 131005, 203853).
Sans-I/O: the one decoder, the pure plan, the gateway's map.
"""

from __future__ import annotations

from dataclasses import replace

from backend_store.cluster.client.partition_map import PartitionMap
from backend_store.cluster.coordination.coordinator import Entry, PrefixState
from backend_store.cluster.coordination.layout import (
    NodeRecord,
    PartitionRecord,
    ReplicaPosition,
    pack,
    read_partition_map,
    unpack,
)
from backend_store.cluster.manager.election import promote
from backend_store.cluster.manager.plan import ClusterView, plan
from backend_store.cluster.manager.recovery import NEVER_DESIGNATED
from backend_store.cluster.node.reconcile import MapView
from backend_store.types import QueueName, TenantId

GARBAGE = b"\xc1not msgpack"
RECORD = PartitionRecord("t", "q", 0, ("n1", "n2", "n3"), "n1", queue_revision=None)


def test_the_one_decoder_keeps_the_last_readable_record_and_names_what_it_never_read() -> None:
    first = read_partition_map({"5": RECORD.pack()}, {})
    assert first.records == {5: RECORD} and not first.stale and not first.unknown
    broken = read_partition_map({"5": GARBAGE, "6": GARBAGE, "x": b""}, first.records)
    assert broken.records == {5: RECORD}
    assert broken.stale == {5} and broken.unknown == {6}
    # Readable again: read as it is now.
    moved = PartitionRecord("t", "q", 0, ("n1", "n2", "n4"), "n2")
    assert read_partition_map({"5": moved.pack()}, broken.records).records == {5: moved}


def _nodes() -> dict[str, NodeRecord]:
    lead = ReplicaPosition("leader", 7, 10, 7, 7, ("n1", "n2", "n3"), 10, ("n2", "n3"))
    follow = ReplicaPosition("follower", 7, 10, 7, 7)
    return {
        "n1": NodeRecord("a:1", replicas={5: lead}),
        "n2": NodeRecord("a:2", replicas={5: follow}),
        "n3": NodeRecord("a:3", replicas={5: follow}),
        "n4": NodeRecord("a:4"),
    }


def test_the_manager_writes_a_stale_record_again_and_places_nothing_anew() -> None:
    view = ClusterView(
        queues={("t", "q"): {"replication_factor": 3}},
        nodes=_nodes(),
        partitions={5: RECORD},
        leaders={5: "n1"},
        stale=frozenset({5}),
        counter=5,
        distrust=None,
    )
    out = plan(view)
    assert out.puts == {5: RECORD} and out.deletes == [] and out.counter == 5


def test_a_manager_that_never_read_a_record_takes_no_slot_for_missing() -> None:
    view = ClusterView(
        queues={("t", "q"): {"replication_factor": 3}},
        nodes=_nodes(),
        unknown=frozenset({5}),
        counter=5,
        distrust=None,
    )
    out = plan(view)
    assert out.empty and out.counter == 5
    # Once it can be read (or is gone), placement goes on as before.
    assert plan(ClusterView(queues=view.queues, nodes=view.nodes, counter=5, distrust=None)).puts


def test_a_node_publishes_the_record_it_serves_while_etcd_holds_it_unreadable() -> None:
    first = read_partition_map({"5": RECORD.pack(), "6": RECORD.pack()}, {})
    broken = read_partition_map({"5": GARBAGE, "6": RECORD.pack()}, first.records)
    view = MapView(broken.records, broken.unknown, broken.values)
    assert view.kept([5, 6, 7]) == {5: RECORD}
    # Carried in its node record; a kept record that cannot be read costs only itself.
    record = NodeRecord("a:1", kept={5: RECORD})
    assert NodeRecord.unpack(record.pack()) == record
    doc = unpack(record.pack())
    doc["kept"]["6"] = GARBAGE
    assert NodeRecord.unpack(pack(doc)).kept == {5: RECORD}


def _unknown_view(nodes: dict[str, NodeRecord], leaders: dict[int, str]) -> ClusterView:
    return ClusterView(
        queues={("t", "q"): {"replication_factor": 3}},
        nodes=nodes,
        unknown=frozenset({5}),
        leaders=leaders,
        counter=5,
        distrust=None,
    )


def test_a_manager_that_never_read_a_record_writes_back_what_its_leader_serves_on() -> None:
    """Corrupted while n1 leads (simulation seeds ``all`` 130473, 131005, 203853): the
    leader's own kept record, as it is; nothing else changes."""
    older = replace(RECORD, replicas=("n1", "n2", "n4"), designation=9)
    nodes = _nodes()
    nodes["n1"] = replace(nodes["n1"], kept={5: RECORD})
    nodes["n2"] = replace(nodes["n2"], kept={5: older})  # a newer designation, not the leader's
    out = plan(_unknown_view(nodes, {5: "n1"}))
    assert out.puts == {5: RECORD} and not out.deletes and not out.tombstones
    # A key held by a node that keeps no record for it (it just gave it up): wait.
    assert plan(_unknown_view(_nodes(), {5: "n1"})).empty


def test_without_a_leader_the_rebuilt_record_designates_nobody_until_every_copy_counts() -> None:
    """No key: the newest kept record, no leader, a designation older than every incarnation,
    so the promotion that follows takes the best copy any live node reports, stray or not."""
    newer = replace(RECORD, replicas=("n1", "n2", "n4"), designation=3, successor="n2")
    nodes = {n: replace(r, kept={5: RECORD}) for n, r in _nodes().items() if n != "n4"}
    nodes["n4"] = NodeRecord("a:4", kept={5: newer})
    nodes["n5"] = NodeRecord("a:5", state="refused", kept={5: replace(RECORD, designation=7)})
    out = plan(_unknown_view(nodes, {}))
    rebuilt = replace(newer, leader=None, successor=None, designated_in=NEVER_DESIGNATED)
    assert out.puts == {5: rebuilt}
    assert PartitionRecord.unpack(rebuilt.pack()) == rebuilt
    # The promotion: n3 keeps a stray ahead of every voter (it was in an older set); it leads.
    fresh = ReplicaPosition("follower", 7, 10, 7, 0)
    positions = {
        "n1": NodeRecord("a:1", replicas={5: fresh}),
        "n2": NodeRecord("a:2", replicas={5: fresh}),
        "n3": NodeRecord("a:3", strays={5: "kept"}, stray_ranks={5: (7, 12)}),
        "n4": NodeRecord("a:4", replicas={5: fresh}),
    }
    promoted = promote(positions, 5, rebuilt)
    assert promoted.leader == "n3" and "n3" in promoted.replicas and promoted.designated_in == 0
    # Nothing is kept anywhere: it stays unknown, and nothing is placed.
    assert plan(_unknown_view(_nodes(), {})).empty


def _state(prefix: str, revision: int, values: dict[str, bytes]) -> PrefixState:
    return PrefixState(
        prefix, revision, {prefix + k: Entry(prefix + k, v, 1, revision) for k, v in values.items()}
    )


def test_the_gateway_keeps_routing_to_a_partition_whose_record_broke() -> None:
    nodes = _state("/n/", 1, {"n1": pack({"address": "a:1"})})
    leaders = _state("/l/", 1, {"5": pack({"node": "n1", "address": "a:1"})})
    before = PartitionMap.build(nodes, _state("/p/", 1, {"5": RECORD.pack()}), leaders)
    after = PartitionMap.build(nodes, _state("/p/", 2, {"5": GARBAGE}), leaders, before)
    assert after.partitions[5] == before.partitions[5]
    assert [p.id for p in after.of_queue(TenantId(RECORD.tenant), QueueName(RECORD.queue))] == [5]
    # Without an earlier map it is unknown: not routed to (and not taken for absent by anyone else).
    assert 5 not in PartitionMap.build(nodes, _state("/p/", 2, {"5": GARBAGE}), leaders).partitions
