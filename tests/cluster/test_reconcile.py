"""The node's decision about its replicas (node/reconcile.py) and the identity rules
(coordination/identity.py), as pure functions: what the real-process tests of
test_etcd_loss.py and test_never_delete.py see from outside, case by case."""

from __future__ import annotations

from backend_store.cluster.coordination.identity import (
    ClusterRecord,
    NodeJudgement,
    founding_refusal,
    judge_node,
    judge_stateless,
)
from backend_store.cluster.coordination.layout import ClusterIdentity, Layout, PartitionRecord, Tombstone
from backend_store.cluster.node.node_identity import pack_label, unpack_label
from backend_store.cluster.node.reconcile import (
    Decision,
    HostedReplica,
    IdentityVerdict,
    MapView,
    ReplicaLabel,
    decide,
)
from backend_store.types import epoch_incarnation, epoch_revision, make_epoch

TRUSTED = IdentityVerdict("c1")
ON_ME = PartitionRecord("t", "q", 0, ("me", "b", "c"), "me", queue_revision=7)
ELSEWHERE = PartitionRecord("t", "q", 0, ("a", "b", "c"), "a", queue_revision=7)
LABEL = ReplicaLabel("c1", 1, "t", "q", 0, 7)


def _hosted(
    *pids: int, label: ReplicaLabel | None = None, lsn: int | None = None
) -> dict[int, HostedReplica]:
    return {p: HostedReplica(p, True, label, lsn) for p in pids}


def test_nothing_changes_before_the_map_is_read() -> None:
    assert decide("me", _hosted(1), None, {}, TRUSTED) == Decision()


def test_a_replica_the_map_names_here_is_served() -> None:
    out = decide("me", _hosted(1, label=LABEL), MapView({1: ON_ME}), {}, TRUSTED)
    assert out.serve == {1: ON_ME} and not out.delete and not out.strays


def test_a_served_record_carries_the_bytes_it_was_read_from() -> None:
    """A campaign claims its key only while etcd still holds those bytes (leadership.py);
    a record kept from before, unreadable now, has none, so no campaign runs on it."""
    read = MapView({1: ON_ME, 2: ON_ME}, values={1: ON_ME.pack()})
    out = decide("me", _hosted(1, 2, label=LABEL), read, {}, TRUSTED)
    assert set(out.serve) == {1, 2}
    assert out.serve_values == {1: ON_ME.pack()}


def test_an_empty_map_deletes_nothing() -> None:
    out = decide("me", _hosted(1, 2), MapView({}), {}, TRUSTED)
    assert not out.delete and set(out.strays) == {1, 2}


def test_a_replica_placed_elsewhere_is_a_stray_without_a_tombstone() -> None:
    out = decide("me", _hosted(1), MapView({1: ELSEWHERE}), {}, TRUSTED)
    assert not out.delete and "not here" in out.strays[1]


def test_an_unreadable_record_is_unknown_not_absent() -> None:
    out = decide("me", _hosted(1), MapView({}, frozenset({1})), {}, TRUSTED)
    assert not out.delete and "cannot be read" in out.strays[1]


def test_a_replica_named_here_that_cannot_be_opened_is_a_stray_the_others_serve() -> None:
    """tests/cluster/test_unopenable_replica.py on real processes."""
    hosted = {
        **_hosted(1, label=LABEL),
        2: HostedReplica(2, open=False, unservable="cannot be opened here: not an LMDB file"),
    }
    out = decide("me", hosted, MapView({1: ON_ME, 2: ON_ME}), {}, TRUSTED)
    assert out.serve == {1: ON_ME}
    assert out.strays == {2: "cannot be opened here: not an LMDB file"} and not out.delete


def test_a_tombstone_deletes_an_unnamed_replica() -> None:
    tomb = Tombstone(1, "me", "partition_deleted", None, "t", "q")
    out = decide("me", _hosted(1, label=LABEL), MapView({}), {1: tomb}, TRUSTED)
    assert out.delete == {1: "tombstone: partition_deleted"}


def test_the_map_wins_over_a_stale_tombstone() -> None:
    tomb = Tombstone(1, "me", "moved", 10)
    out = decide("me", _hosted(1, label=LABEL), MapView({1: ON_ME}), {1: tomb}, TRUSTED)
    assert out.serve == {1: ON_ME} and not out.delete


def test_a_tombstone_never_deletes_entries_past_its_lsn() -> None:
    tomb = Tombstone(1, "me", "moved", 10)
    out = decide("me", _hosted(1, lsn=11), MapView({1: ELSEWHERE}), {1: tomb}, TRUSTED)
    assert not out.delete and "LSN 10" in out.strays[1]
    assert decide("me", _hosted(1, lsn=10), MapView({1: ELSEWHERE}), {1: tomb}, TRUSTED).delete


def test_a_tombstone_with_a_bound_waits_until_the_replicas_last_lsn_is_read() -> None:
    """Found on disk at start, not opened yet: the bound cannot be checked, so it is not met
    (simulation seed ``all`` 291729: a restarted node deleted a copy holding LSN 153 on a
    tombstone covering LSN 1 that it had refused before the restart)."""
    tomb = Tombstone(1, "me", "moved", 10)
    on_disk = {1: HostedReplica(1, open=False)}
    out = decide("me", on_disk, MapView({1: ELSEWHERE}), {1: tomb}, TRUSTED)
    assert not out.delete and "not read yet" in out.strays[1]
    read = {1: HostedReplica(1, open=False, last_lsn=9)}
    assert decide("me", read, MapView({1: ELSEWHERE}), {1: tomb}, TRUSTED).delete
    # A tombstone without a bound (a deleted queue, an operator's) needs no LSN.
    gone = Tombstone(1, "me", "partition_deleted", None, "t", "q")
    assert decide("me", on_disk, MapView({}), {1: gone}, TRUSTED).delete


def test_a_tombstone_for_another_queue_deletes_nothing() -> None:
    tomb = Tombstone(1, "me", "partition_deleted", None, "t", "other")
    out = decide("me", _hosted(1, label=LABEL), MapView({}), {1: tomb}, TRUSTED)
    assert not out.delete and "t/other" in out.strays[1]


def test_a_reused_partition_id_never_serves_another_queues_replica() -> None:
    reused = PartitionRecord("t", "newer", 0, ("me",), "me", queue_revision=99)
    out = decide("me", _hosted(1, label=LABEL), MapView({1: reused}), {}, TRUSTED)
    assert not out.serve and "t/q" in out.strays[1]


def test_another_clusters_replica_is_never_served_nor_deleted() -> None:
    foreign = ReplicaLabel("c2", 1, "t", "q", 0, 7)
    tomb = Tombstone(1, "me", "operator")
    assert "cluster c2" in decide("me", _hosted(1, label=foreign), MapView({1: ON_ME}), {}, TRUSTED).strays[1]
    out = decide("me", _hosted(1, label=foreign), MapView({}), {1: tomb}, TRUSTED)
    assert not out.delete and "cluster c2" in out.strays[1]


def test_a_refused_identity_serves_and_deletes_nothing() -> None:
    tomb = Tombstone(1, "me", "operator")
    out = decide("me", _hosted(1, 2), MapView({1: ON_ME}), {2: tomb}, IdentityVerdict("c1", "no id"))
    assert out.refused == "no id" and not out.serve and not out.delete and set(out.strays) == {1, 2}


LAYOUT = Layout("/p/")
C1 = ClusterRecord(ClusterIdentity("c1"))


def test_identity_rules_for_a_node() -> None:
    def judge(
        record: ClusterRecord, kept: str | None, holds: bool = False, has_map: bool = False
    ) -> NodeJudgement:
        return judge_node(record, kept, holds_replicas=holds, etcd_has_map=has_map, layout=LAYOUT)

    assert judge(C1, "c1").verdict.trusted
    adopted = judge(C1, None)
    assert adopted.adopt == "c1" and adopted.verdict.trusted
    assert "holds cluster c1 but this node belongs to cluster c2" in str(judge(C1, "c2").verdict.refusal)
    assert "holds no cluster id" in str(judge(ClusterRecord(), "c1").verdict.refusal)
    assert judge(ClusterRecord(), None).create
    assert not judge(ClusterRecord(), None, holds=True).create
    assert judge(ClusterRecord(), None, holds=True, has_map=True).create
    assert ClusterRecord.parse(b"\xc1").unreadable is not None


def test_a_node_founds_a_cluster_only_where_no_other_node_refuses_etcd() -> None:
    # A first start: no other node has judged etcd and refused it.
    assert founding_refusal([], LAYOUT) is None
    # etcd wiped under a running cluster: its nodes registered, refusing, waiting for a restore.
    refusal = str(founding_refusal(["n2", "n1"], LAYOUT))
    assert (
        "nodes n1, n2 are registered refusing it" in refusal and "will not found a second cluster" in refusal
    )


def test_identity_rules_for_a_gateway() -> None:
    assert judge_stateless(C1, None, LAYOUT).trusted
    assert not judge_stateless(ClusterRecord(), "c1", LAYOUT).trusted
    assert "not c1" in str(judge_stateless(ClusterRecord(ClusterIdentity("c2")), "c1", LAYOUT).refusal)


def test_epochs_of_a_later_incarnation_are_above_every_earlier_one() -> None:
    assert make_epoch(0, 5) == 5  # a cluster that never restored etcd keeps its epochs
    assert make_epoch(1, 1) > make_epoch(0, (1 << 40) - 1)
    assert epoch_incarnation(make_epoch(3, 77)) == 3 and epoch_revision(make_epoch(3, 77)) == 77


def test_a_pool_replica_is_labelled_for_its_pool_and_slot_and_never_served_as_anything_else() -> None:
    pool = PartitionRecord("", "rf3-sync", 2, ("me", "b", "c"), "me")
    label = ReplicaLabel("c1", 1, "", "rf3-sync", 2, None)
    assert unpack_label(pack_label(label)) == label  # the empty tenant survives the label's format
    assert decide("me", _hosted(1, label=label), MapView({1: pool}), {}, TRUSTED).serve == {1: pool}
    # Another slot of the pool, another pool, a queue's own partition: a stray each time.
    for other in (
        PartitionRecord("", "rf3-sync", 3, ("me",), "me"),
        PartitionRecord("", "rf3-async", 2, ("me",), "me"),
        ON_ME,
    ):
        out = decide("me", _hosted(1, label=label), MapView({1: other}), {}, TRUSTED)
        assert not out.serve and "/rf3-sync #2" in out.strays[1]
    # And a queue's replica is never served as a pool's slot.
    out = decide("me", _hosted(1, label=LABEL), MapView({1: pool}), {}, TRUSTED)
    assert not out.serve and "t/q #0" in out.strays[1]
