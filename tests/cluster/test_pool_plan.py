"""The manager's plan for pools of shared partitions (docs/cluster.md, "Shared partitions"),
without etcd: each pool asked for gets its slots, placed and led like any partition; a pool
grows and never shrinks; a queue placed in a pool gets no partitions of its own; a queue
made before pools keeps its own."""

from __future__ import annotations

import pytest

from backend_store.cluster.coordination import pools
from backend_store.cluster.coordination.layout import PartitionRecord
from backend_store.cluster.coordination.pools import PoolRequest
from backend_store.cluster.manager.plan import PlanSettings, plan
from gateway.cli import main

from .plan_runs import publish
from .test_manager_plan import node, view

POOL = pools.pool_name(3, "sync")


def pool_records(puts: dict[int, PartitionRecord]) -> list[PartitionRecord]:
    return sorted((r for r in puts.values() if r.pool == POOL), key=lambda r: r.index)


def test_a_pool_asked_for_gets_its_slots_placed_and_led_like_any_partition() -> None:
    v = view(
        pools={POOL: PoolRequest(3, "sync")},
        nodes={"n1": node(), "n2": node(), "n3": node()},
        counter=4,
    )
    out = plan(v, settings=PlanSettings(pool_partitions=6))
    records = pool_records(out.puts)
    assert [r.index for r in records] == list(range(6)) and out.counter == 10
    assert all(r.tenant == pools.POOL_TENANT and r.queue_revision is None for r in records)
    assert all(len(r.replicas) == 3 and r.mode == "sync" and r.leader == r.replicas[0] for r in records)
    # Leaders spread: six slots over three nodes, two each.
    leaders = [str(r.leader) for r in records]
    assert sorted(leaders) == ["n1", "n1", "n2", "n2", "n3", "n3"]


def test_by_default_a_pool_has_a_slot_per_node_and_grows_as_nodes_join() -> None:
    v = view(pools={POOL: PoolRequest(3, "sync")}, nodes={"n1": node(), "n2": node(), "n3": node()})
    out = plan(v)
    records = pool_records(out.puts)
    # Each node leads one slot's writes.
    assert [r.index for r in records] == [0, 1, 2]
    assert sorted(str(r.leader) for r in records) == ["n1", "n2", "n3"]
    v.partitions, v.counter = dict(out.puts), out.counter
    v.leaders = {pid: str(r.leader) for pid, r in out.puts.items()}
    publish(v)
    v.nodes["n4"] = node()
    grown = plan(v)
    assert [r.index for r in pool_records(grown.puts)] == [3]
    assert not set(grown.puts) & set(out.puts) and grown.deletes == []


def test_a_slot_past_a_count_that_fell_is_still_promoted() -> None:
    # Three slots, one per node; the node leading slot 2 dies (or --partitions is lowered
    # to 1): the count a plan wants falls to 2, and slot 2 still gets a new leader.
    records = {
        pid: PartitionRecord("", POOL, pid - 1, ("n1", "n2", "n3"), leader)
        for pid, leader in ((1, "n2"), (2, "n3"), (3, "n1"))
    }
    v = view(
        pools={POOL: PoolRequest(3, "sync")},
        nodes={
            "n2": node(p1=(3, 10), p2=(3, 10), p3=(3, 10)),
            "n3": node(p1=(3, 10), p2=(3, 10), p3=(3, 12)),
        },
        partitions=records,
        leaders={1: "n2", 2: "n3"},
        counter=3,
    )
    for settings in (PlanSettings(), PlanSettings(pool_partitions=1)):
        promoted = plan(v, settings=settings).puts
        assert set(promoted) == {3} and promoted[3].leader == "n3"


def test_a_queue_asking_for_more_partitions_grows_the_pool_and_raising_n_adds_slots() -> None:
    v = view(
        pools={POOL: PoolRequest(3, "sync", min_partitions=5)},
        nodes={"n1": node(), "n2": node(), "n3": node()},
    )
    out = plan(v, settings=PlanSettings(pool_partitions=2))
    assert [r.index for r in pool_records(out.puts)] == [0, 1, 2, 3, 4]
    # Made and served: raising --partitions adds slots 5..7 and touches none of 0..4.
    v.partitions, v.counter = dict(out.puts), out.counter
    v.leaders = {pid: str(r.leader) for pid, r in out.puts.items()}
    publish(v)
    grown = plan(v, settings=PlanSettings(pool_partitions=8))
    assert [r.index for r in pool_records(grown.puts)] == [5, 6, 7]
    assert not set(grown.puts) & set(out.puts) and grown.deletes == []


def test_a_pools_slots_are_never_deleted_whatever_the_queue_records_say() -> None:
    records = {pid: PartitionRecord("", POOL, pid - 1, ("n1",), "n1") for pid in (1, 2, 3)}
    v = view(
        # No pool request (etcd restored to before it, say), no queue record, a lowered N.
        nodes={"n1": node()},
        partitions=records,
        leaders={1: "n1", 2: "n1", 3: "n1"},
        counter=3,
    )
    publish(v)
    out = plan(v, settings=PlanSettings(pool_partitions=1))
    assert out.deletes == [] and out.tombstones == {} and out.puts == {}
    # Nor when a queue record names the pool's name under a tenant of its own.
    v.queues = {("t", POOL): {"replication_factor": 1}}
    out = plan(v, settings=PlanSettings(pool_partitions=1))
    assert out.deletes == [] and [(r.tenant, r.queue) for r in out.puts.values()] == [("t", POOL)]


def test_a_queue_placed_in_a_pool_gets_no_partitions_of_its_own() -> None:
    v = view(
        pools={POOL: PoolRequest(3, "sync")},
        queues={
            ("t", "placed"): {"replication_factor": 3, pools.PLACEMENT: [1, 2]},
            ("t", "leaving"): {"replication_factor": 3, pools.PLACEMENT: [2], pools.DELETING: True},
        },
        nodes={"n1": node(), "n2": node(), "n3": node()},
    )
    out = plan(v, settings=PlanSettings(pool_partitions=2))
    assert {(r.tenant, r.queue) for r in out.puts.values()} == {("", POOL)}
    # One whose placement cannot be read is no queue made before pools either.
    v.queues[("t", "garbled")] = {"replication_factor": 3, pools.PLACEMENT: ["x"]}
    out = plan(v, settings=PlanSettings(pool_partitions=2))
    assert {(r.tenant, r.queue) for r in out.puts.values()} == {("", POOL)}


def test_a_queue_made_before_pools_keeps_its_own_partitions_beside_a_pool() -> None:
    legacy = PartitionRecord("t", "old", 0, ("n1", "n2", "n3"), "n1", queue_revision=7)
    v = view(
        pools={POOL: PoolRequest(3, "sync")},
        queues={("t", "old"): {"replication_factor": 3, "partitions": 2}},
        queue_revisions={("t", "old"): 7},
        nodes={"n1": node(), "n2": node(), "n3": node()},
        partitions={5: legacy},
        leaders={5: "n1"},
        counter=5,
    )
    publish(v)
    out = plan(v, settings=PlanSettings(pool_partitions=2))
    assert 5 not in out.puts and out.deletes == []
    own = [r for r in out.puts.values() if r.tenant == "t"]
    assert [(r.queue, r.index, r.queue_revision) for r in own] == [("old", 1, 7)]
    assert len(pool_records(out.puts)) == 2


def test_a_legacy_partition_of_a_name_now_placed_in_a_pool_is_deleted() -> None:
    # The queue was deleted and made again by a gateway that places queues in pools, before
    # the manager saw it go: its old partition (made before revisions were recorded) is an
    # earlier queue's.
    v = view(
        queues={("t", "q"): {"replication_factor": 1, pools.PLACEMENT: [9]}},
        nodes={"n1": node()},
        partitions={4: PartitionRecord("t", "q", 0, ("n1",), "n1")},
        leaders={4: "n1"},
        counter=9,
    )
    publish(v)
    out = plan(v)
    assert out.deletes == [4] and [key[0] for key in out.tombstones] == [4]


def test_a_malformed_pool_request_is_ignored() -> None:
    v = view(
        pools={"rf3-sync": PoolRequest(2, "sync"), "rf0-sync": PoolRequest(0, "sync")},
        nodes={"n1": node()},
    )
    assert plan(v).puts == {}


def test_the_partitions_flag_is_documented_and_checked(capsys: pytest.CaptureFixture[str]) -> None:
    for command in ("manager", "dev-cluster"):
        with pytest.raises(SystemExit) as done:
            main([command, "--help"])
        assert done.value.code == 0
        assert "--partitions" in capsys.readouterr().out
    assert main(["manager", "--etcd", "127.0.0.1:1", "--partitions", "0"]) == 2
    assert "--partitions must be 1 or more" in capsys.readouterr().err
