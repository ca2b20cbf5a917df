"""A partition record that cannot be read is neither absent nor changed.

Found by the deterministic simulation (``etcd`` seeds 3, 8, 11 and ``all`` 10, 13, 21, 24 on
the recovered tree of session 28, fault ``corrupt-record``): the manager dropped the record
from its view and placed the queue's index anew under a new id, so the acknowledged messages
on the old replicas were no longer read, and the gateway forgot the partition. Now every
reader (node, manager, gateway) keeps what it last read of it, the manager writes that again
(which repairs the key), and a manager that never read it places nothing while it cannot.
Sans-I/O: the one decoder, the pure plan, the gateway's map.
"""

from __future__ import annotations

from backend_store.cluster.client.partition_map import PartitionMap
from backend_store.cluster.coordination.coordinator import Entry, PrefixState
from backend_store.cluster.coordination.layout import (
    NodeRecord,
    PartitionRecord,
    ReplicaPosition,
    pack,
    read_partition_map,
)
from backend_store.cluster.manager.plan import ClusterView, plan
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
