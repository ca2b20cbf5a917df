"""What the manager takes from etcd into its view (``manager/manager.py``), without etcd: the
handlers that turn a watched prefix's state into the view, the fresh read after winning, and
which garbled-record marks a commit clears, and what a commit expects etcd to hold (the
records its plan was made on). The plan on the view: test_manager_plan.py."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from backend_store.cluster.coordination.coordinator import Coordinator, Entry, PrefixState, Session
from backend_store.cluster.coordination.etcd_coordinator import changed_in_pages
from backend_store.cluster.coordination.layout import (
    ClusterIdentity,
    LeaderRecord,
    NodeRecord,
    PartitionRecord,
    ReplicaPosition,
    pack,
)
from backend_store.cluster.manager import manager as manager_module
from backend_store.cluster.manager.manager import Manager
from backend_store.cluster.manager.plan import plan
from backend_store.types import Epoch


class ReadOnly:
    """A coordinator that only answers ``read_prefix``, from a dict of key to value."""

    def __init__(self, revision: int, kv: dict[str, bytes]) -> None:
        self.revision = revision
        self.kv = kv

    async def read_prefix(self, prefix: str) -> PrefixState:
        entries = {k: Entry(k, v, 1, self.revision) for k, v in self.kv.items() if k.startswith(prefix)}
        return PrefixState(prefix, self.revision, entries)


def manager(coordinator: Any = None) -> Manager:
    return Manager(cast(Coordinator, coordinator), manager_id="m1")


def state(prefix: str, revision: int, kv: dict[str, bytes]) -> PrefixState:
    return PrefixState(prefix, revision, {k: Entry(k, v, 1, revision) for k, v in kv.items()})


def position(last_epoch: int, lsn: int) -> ReplicaPosition:
    return ReplicaPosition("follower", last_epoch, lsn, last_epoch, 0)


def test_a_leader_key_seen_is_remembered_after_it_vanishes_and_older_positions_do_not_count() -> None:
    # Simulation seed ``all`` 130837 (test_manager_plan.py's
    # test_a_position_published_before_the_last_term_is_not_fresh), through the watch: n3's
    # key was seen at revision 60 and then vanished; n1's record (revision 50) predates it,
    # so only n2's counts, no majority of n1, n2, n3: nobody is promoted yet.
    m = manager()
    layout = m.layout
    key = layout.leader(5)
    m._on_leaders(state(layout.leaders, 60, {key: LeaderRecord("n3", "127.0.0.1:1").pack()}))
    m._on_leaders(state(layout.leaders, 85, {}))  # n3's key is gone
    assert m.view.leaders == {}
    assert m.view.leader_seen == {5: 60}  # what the plan judges the positions by
    v = m.view
    v.queues = {("t", "q"): {"replication_factor": 3}}
    v.nodes = {
        "n1": NodeRecord("127.0.0.1:1", "up", {5: position(129, 23)}),
        "n2": NodeRecord("127.0.0.1:1", "up", {5: position(129, 23)}),
    }
    v.partitions = {5: PartitionRecord("t", "q", 0, ("n1", "n2", "n3"), "n3")}
    v.node_revisions = {"n1": 50, "n2": 80}
    assert plan(v).puts == {}


async def test_a_manager_that_wins_reads_every_prefix_afresh_over_its_watches_older_states() -> None:
    # Simulation seed ``all`` 101788 (session 35): the watch of nodes/ was behind etcd (the
    # manager was cut off); what the manager plans on once it leads is etcd's state now.
    layout = manager().layout
    now = NodeRecord("127.0.0.1:2", "up", {5: position(7, 40)}).pack()
    m = manager(ReadOnly(200, {layout.node("n3"): now}))
    old = NodeRecord("127.0.0.1:1", "up", {5: position(3, 12)}).pack()
    m._on_nodes(state(layout.nodes, 90, {layout.node("n3"): old}))
    assert m.view.nodes["n3"].replicas[5].lsn == 12
    await m._read_everything()
    assert m.view.nodes["n3"].replicas[5].lsn == 40
    assert m.view.nodes["n3"].address == "127.0.0.1:2"


def test_a_commit_the_watch_spoke_during_leaves_the_watchs_marks() -> None:
    # Simulation seeds ``all`` 303592 and 421472: a record garbled again while the commit that
    # wrote it was under way keeps its mark, and is written once more.
    assert manager_module.cleared_marks({5, 6}, 3, 3) == {5, 6}  # no state came: the write stands
    assert manager_module.cleared_marks({5, 6}, 3, 4) == set()  # one came: its marks stand


class Gets(ReadOnly):
    """A coordinator that also answers ``get`` from the same dict."""

    async def get(self, key: str) -> Entry | None:
        value = self.kv.get(key)
        return None if value is None else Entry(key, value, 1, self.revision)


def test_a_commit_expects_the_partition_records_its_plan_was_made_on() -> None:
    # CI runs of session 62 (test_etcd_loss.py, a restore from an older snapshot): the
    # partitions' watch still showed a partition made after the snapshot, whose queue the
    # snapshot does not hold either. A plan on that view wrote the record back into the
    # restored etcd, or deleted it and tombstoned its copies, and every node deleted the
    # queue's acknowledged messages. The commit now expects the bytes the view was made from:
    # the restored etcd holds none, so it changes nothing.
    m = manager()
    layout = m.layout
    late = PartitionRecord("t", "late", 0, ("n1", "n2", "n3"), "n1")
    m._on_partitions(state(layout.partitions, 3020, {layout.partition(2): late.pack()}))
    change = plan(m.view)  # the queues' watch shows the restored etcd: no queue "late"
    assert change.deletes == [2] and change.tombstones
    assert m._records_expected(change) == {layout.partition(2): late.pack()}
    # A creation expects no record under its id.
    m.view.queues = {("t", "new"): {"replication_factor": 1}}
    m.view.nodes = {"n1": NodeRecord("127.0.0.1:1", "up", {})}
    created = plan(m.view)
    new = [pid for pid in created.puts if pid != 2]
    assert new and all(m._records_expected(created)[layout.partition(pid)] is None for pid in new)


async def test_a_deletion_expects_the_queue_records_it_was_confirmed_on() -> None:
    layout = manager().layout
    m = manager(Gets(15, {}))
    m.view.partitions = {2: PartitionRecord("t", "late", 0, ("n1",), "n1")}
    assert await m._deletions_confirmed([2]) == {layout.queue("t", "late"): None}
    m = manager(Gets(15, {layout.queue("t", "late"): b"{}"}))
    m.view.partitions = {2: PartitionRecord("t", "late", 0, ("n1",), "n1")}
    assert await m._deletions_confirmed([2]) is None  # the queue is there: a watch is behind


class Refusing(Gets):
    """``Gets`` whose fenced commits fail on their expectations: etcd holds something else
    under a record the plan expects, while the manager's claim still stands."""

    def __init__(self, revision: int, kv: dict[str, bytes], session: Any) -> None:
        super().__init__(revision, kv)
        self.session = session
        self.commits: list[dict[str, bytes | None]] = []

    async def fenced_commit(self, *_: Any, holder: bytes, expect: dict[str, bytes | None]) -> bool:
        self.commits.append(expect)
        if len(self.commits) == 3:
            self.session.lost.set()  # ends the term: the test is over
        return False


class Lease:
    def __init__(self) -> None:
        self.lost = asyncio.Event()

    def valid(self) -> bool:
        return not self.lost.is_set()


async def test_a_commit_refused_on_its_expectations_plans_again_and_keeps_the_lead() -> None:
    # Refused on what it expected (a watch behind, etcd restored), the commit is not a fence
    # lost: the manager plans again at its next tick, still leading, instead of giving up a
    # lead nobody else took.
    layout = manager().layout
    session = Lease()
    kv = {
        layout.manager: b"m1",
        layout.node("n1"): NodeRecord("127.0.0.1:1", "up", {}).pack(),
        layout.queue("t", "q"): pack({"replication_factor": 1}),
        layout.cluster: ClusterIdentity("c1").pack(),
    }
    refusing = Refusing(40, kv, session)
    m = Manager(cast(Coordinator, refusing), manager_id="m1", tick_s=0.01)
    m._held[layout.queues] = PrefixState(layout.queues, 0)  # as _lead's watch gives it
    m._on_queues(await refusing.read_prefix(layout.queues))
    await asyncio.wait_for(m._term(cast(Session, session), Epoch(1)), 10)
    assert len(refusing.commits) == 3  # fenced out, it would have stopped after the first
    assert all(
        layout.partition(1) in expect and expect[layout.partition(1)] is None for expect in refusing.commits
    )


async def test_a_refused_commit_takes_what_etcd_holds_over_the_managers_own_lost_write() -> None:
    # Simulation seed ``restore`` 1758509 (session 86): the manager put its own write of
    # partition 1 (n3 named successor) into its view; etcd, restored from a snapshot taken
    # before it, held the record as the watch last brought it, so the watch brought nothing
    # and every later plan expected the lost write. A refused commit now reads what the
    # manager writes afresh, and the next plan expects what etcd holds.
    layout = manager().layout
    before = PartitionRecord("t", "q0", 0, ("n1", "n2", "n3"), "n2")
    lost = PartitionRecord("t", "q0", 0, ("n1", "n2", "n3"), "n2", successor="n3")
    m = manager(Gets(135, {layout.partition(1): before.pack()}))
    m._on_partitions(state(layout.partitions, 103, {layout.partition(1): before.pack()}))
    m.view.partitions[1] = lost  # the commit path's own write, ahead of the watch
    m._partition_values[1] = lost.pack()
    await m._read_written()
    assert m.view.partitions[1] == before
    assert m._partition_values[1] == before.pack()  # what the next commit expects
    assert m._held[layout.partitions].revision == 135  # what the watch compares with


class Accepting(Gets):
    """``Gets`` whose fenced commits succeed, without changing what it answers: what an etcd
    restored from a snapshot taken before each commit holds."""

    def __init__(self, revision: int, kv: dict[str, bytes], session: Any) -> None:
        super().__init__(revision, kv)
        self.session = session
        self.commits: list[tuple[dict[str, bytes], list[str]]] = []

    async def fenced_commit(
        self, _key: str, _epoch: Epoch, puts: dict[str, bytes], deletes: list[str], **_: Any
    ) -> bool:
        self.commits.append((puts, deletes))
        self.session.lost.set()  # one commit: the test is over
        return True


async def test_a_commit_the_restore_lost_is_taken_back_from_etcd_by_the_watches() -> None:
    # Noticed in session 86: the manager puts its own commit into its view, ahead of its
    # watches, which compare what etcd holds with the state the view was last given. An
    # etcd restored from before the commit held exactly that state, so nothing came: a
    # deleted partition stayed deleted in the view only, and a tombstone written for a copy
    # stayed in it while etcd had none, so nothing wrote it again and the copy was kept as
    # a stray for good. The states the watches compare with now hold the commit too.
    layout = manager().layout
    session = Lease()
    late = PartitionRecord("t", "late", 0, ("n1",), "n1")
    kv = {
        layout.manager: b"m1",
        layout.cluster: ClusterIdentity("c1").pack(),
        layout.node("n1"): NodeRecord("127.0.0.1:1", "up", {2: position(3, 9)}).pack(),
        layout.partition(2): late.pack(),  # its queue is gone: deleted, its copy tombstoned
    }
    etcd = Accepting(40, kv, session)
    m = Manager(cast(Coordinator, etcd), manager_id="m1", tick_s=0.01)
    m._held[layout.queues] = PrefixState(layout.queues, 0)  # as _lead's watch gives it
    m._on_queues(await etcd.read_prefix(layout.queues))
    await asyncio.wait_for(m._term(cast(Session, session), Epoch(1)), 10)
    [(puts, deletes)] = etcd.commits
    assert deletes == [layout.partition(2)] and layout.tombstone(2, "n1") in puts
    # The restored etcd, as a watch's next read gives it, differs from what each holds:
    for prefix, lost in (
        (layout.partitions, layout.partition(2)),
        (layout.tombstones, layout.tombstone(2, "n1")),
    ):
        assert await changed_in_pages(m._held[prefix], await etcd.read_prefix(prefix)) == {lost}


async def test_a_commit_the_watch_brought_already_is_held_as_the_watch_gave_it() -> None:
    # Each commit would otherwise cost the watches a whole read and the view a pass more.
    m = manager()
    layout = m.layout
    record = PartitionRecord("t", "q", 0, ("n1",), "n1").pack()
    brought = state(layout.partitions, 51, {layout.partition(1): record})
    m._held[layout.partitions] = brought
    m._hold_written({layout.partition(1): record}, [])
    assert m._held[layout.partitions] is brought
