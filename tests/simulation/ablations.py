"""Each fix the simulation found, taken out again: what a seed that pins the fix runs without.

A test that shows a fix matters runs its seeds with the fix taken out and needs one to fail
(``test_without_...``), and ``scripts/simulate --without NAME`` runs any seeds so: when a
later change moves those seeds' trajectories off the race, the sweep finds new ones
(docs/testing.md, "Simulation"). Both take the fix out the same way, from here. Each
ablation is applied through a ``setattr``-like callable: pytest's ``monkeypatch.setattr``
in a test (undone after it), the builtin in a sweep's worker process.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

Setter = Callable[[Any, str, Any], None]


@dataclass(frozen=True, slots=True)
class Ablation:
    name: str
    fix: str  # what is taken out, in a line
    apply: Callable[[Setter], None]


ABLATIONS: dict[str, Ablation] = {}

# Session 39's fixes (a hand-over only to a successor that answered, a term's first entry off
# the reconcile tick, a refused request woken by the breaker's verdict) changed the timing of
# nearly every leader change, and moved most pinned seeds off the race their test needs. A
# test that pins an older fix takes these out too, which puts its seed back on that race:
# it then shows the older fix is still what holds it (docs/testing.md, "Session 39").
# Session 42's ``founding`` joins them: several pinned restore seeds (``all`` 230870, 240328)
# reached their race through a node added while etcd was empty founding a cluster of its own;
# and so does its revoke of a lost lease (a node that lost its session no longer waits for
# etcd to expire the keys under it), which moves every seed where a session is lost.
# Issue 48's ``incarnation-floor`` and ``settle-before-serving`` join them: they move the
# pinned restore seeds of ``remade-copies``, ``served-sets``, ``claim-cluster-compare``,
# ``unread-bound`` and ``record-rebuild`` off their races (and guard some of them too).
# So does its ``wakes-with-entries`` (an idle link's heartbeat no longer waits again after
# each wake with nothing to ship), wherever a write that wrote nothing notified the links.
BACK_ON_THE_RACE = (
    "handover-answer",
    "first-entry-task",
    "breaker-verdict",
    "founding",
    "revoke-lost-lease",
    "incarnation-floor",
    "settle-before-serving",
    "wakes-with-entries",
)


def _ablation(name: str, fix: str) -> Callable[[Callable[[Setter], None]], Callable[[Setter], None]]:
    def register(apply: Callable[[Setter], None]) -> Callable[[Setter], None]:
        ABLATIONS[name] = Ablation(name, fix, apply)
        return apply

    return register


@_ablation("founding", "a node added while etcd is empty does not found a second cluster")
def _founding(setter: Setter) -> None:
    from backend_store.cluster.node import node_identity

    def may_found(registered: object, layout: object) -> None:
        return None

    setter(node_identity, "founding_refusal", may_found)


@_ablation("breaker-abandon", "a breaker trial that ends without a verdict is tried again")
def _breaker_abandon(setter: Setter) -> None:
    from backend_store.cluster.client.node_health import Breaker

    def kept_out(self: Breaker) -> None:
        return None

    setter(Breaker, "abandon", kept_out)


@_ablation("not-leader-wait", "the gateway's first wait after not_leader is short")
def _not_leader_wait(setter: Setter) -> None:
    from backend_store.cluster.client import partition_calls

    setter(partition_calls, "_NOT_LEADER_FIRST_WAIT_S", 0.5)


@_ablation("claim-compares", "a leader-key claim compares the records it acted on")
def _claim_compares(setter: Setter) -> None:
    from backend_store.cluster.coordination.coordinator import Claim

    from .sim_coordinator import SimCoordinator

    campaign = SimCoordinator.campaign

    async def blind(self: SimCoordinator, session: Any, key: str, value: bytes, **_: Any) -> Claim:
        return await campaign(self, session, key, value)

    setter(SimCoordinator, "campaign", blind)


@_ablation("claim-cluster-compare", "the claim compares the cluster record too")
def _claim_cluster_compare(setter: Setter) -> None:
    from backend_store.cluster.coordination.coordinator import Claim

    from .sim_coordinator import SimCoordinator

    campaign = SimCoordinator.campaign

    async def partition_only(
        self: SimCoordinator,
        session: Any,
        key: str,
        value: bytes,
        *,
        unchanged: Mapping[str, bytes] | None = None,
    ) -> Claim:
        kept = {name: held for name, held in (unchanged or {}).items() if not name.endswith("/cluster")}
        return await campaign(self, session, key, value, unchanged=kept)

    setter(SimCoordinator, "campaign", partition_only)


@_ablation("own-key-compares", "a key of one's own lease wins only on unchanged records")
def _own_key_compares(setter: Setter) -> None:
    from backend_store.cluster.coordination.coordinator import Claim
    from backend_store.types import Epoch

    from .etcd_model import Compare, Get, Put, Txn
    from .sim_coordinator import SimCoordinator

    async def own_key_wins(
        self: SimCoordinator,
        session: Any,
        key: str,
        value: bytes,
        *,
        unchanged: Mapping[str, bytes] | None = None,
    ) -> Claim:
        # Session 35's campaign, one etcd transaction as now, the holder checked first.
        kept = tuple((unchanged or {}).items())
        compares = (Compare(key, "create", 0), *(Compare(name, "value", held) for name, held in kept))
        reads = (Get(key), *(Get(name) for name, _ in kept))
        result = await self._txn(Txn(compares, (Put(key, value, session.lease_id),), reads))
        if result.succeeded:
            return Claim(True, Epoch(result.revision), value)
        _, holder = result.results[0]
        if holder is not None:
            return Claim(holder.lease == session.lease_id, Epoch(holder.create_revision), holder.value)
        return Claim(False, Epoch(0), b"")

    setter(SimCoordinator, "campaign", own_key_wins)


@_ablation("leader-sightings", "a position counts only if written after the key was seen")
def _leader_sightings(setter: Setter) -> None:
    from backend_store.cluster.coordination.coordinator import PrefixState
    from backend_store.cluster.manager.manager import Manager

    on_leaders = Manager._on_leaders

    def forgetful(self: Manager, state: PrefixState) -> None:
        on_leaders(self, state)
        self.view.leader_seen.clear()

    setter(Manager, "_on_leaders", forgetful)


@_ablation("fresh-read", "a manager reads every prefix afresh when it wins")
def _fresh_read(setter: Setter) -> None:
    from backend_store.cluster.manager.manager import Manager

    async def watches_only(self: Manager) -> None:
        return None

    setter(Manager, "_read_everything", watches_only)


@_ablation("direct-reads", "manager and node read the cluster record before deleting")
def _direct_reads(setter: Setter) -> None:
    from backend_store.cluster.manager.manager import Manager
    from backend_store.cluster.node.node_identity import NodeIdentity

    async def trusting(self: Manager) -> dict[str, bytes | None]:
        return {}  # confirmed, and nothing expected of the commit

    async def no_refusal(self: NodeIdentity) -> str | None:
        return None

    setter(Manager, "_cluster_confirmed", trusting)
    setter(NodeIdentity, "refusal_now", no_refusal)


@_ablation("refresh-back-in-time", "a fresh read older than the held state is taken")
def _refresh_back_in_time(setter: Setter) -> None:
    from backend_store.cluster.coordination.watched_prefix import WatchedPrefix

    async def deferred_refresh(self: WatchedPrefix) -> None:
        self.apply(await self._coordinator.read_prefix(self.prefix))

    setter(WatchedPrefix, "refresh", deferred_refresh)


@_ablation("tombstone-read", "a node reads each tombstone directly before deleting")
def _tombstone_read(setter: Setter) -> None:
    from backend_store.cluster.coordination.layout import Tombstone
    from backend_store.cluster.node import replica_rounds

    async def watched_only(
        _coordinator: object, _layout: object, _node_id: str, _pid: int, watched: Tombstone | None
    ) -> bool:
        return watched is not None

    setter(replica_rounds, "tombstone_stands", watched_only)


@_ablation("fence-holder", "a manager's fenced commit compares the holder too")
def _fence_holder(setter: Setter) -> None:
    from .etcd_model import Compare, Delete, Put, Txn
    from .sim_coordinator import SimCoordinator

    async def epoch_only(
        self: SimCoordinator,
        fence_key: str,
        epoch: int,
        puts: dict[str, bytes],
        deletes: tuple[str, ...] = (),
        *,
        holder: bytes,
        expect: dict[str, bytes | None] | None = None,
    ) -> bool:
        ops = tuple(Put(k, v) for k, v in puts.items()) + tuple(Delete(k) for k in deletes)
        expected = tuple(
            Compare(k, "create", 0) if v is None else Compare(k, "value", v)
            for k, v in (expect or {}).items()
        )
        return (await self._txn(Txn((Compare(fence_key, "create", epoch), *expected), ops))).succeeded

    setter(SimCoordinator, "fenced_commit", epoch_only)


@_ablation("record-expectations", "a manager's commit expects the partition records its plan was made on")
def _record_expectations(setter: Setter) -> None:
    from backend_store.cluster.manager.manager import Manager

    def nothing_expected(self: Manager, change: object) -> dict[str, bytes | None]:
        return {}

    setter(Manager, "_records_expected", nothing_expected)


@_ablation("record-rebuild", "an unreadable record never read is rebuilt from the nodes")
def _record_rebuild(setter: Setter) -> None:
    from backend_store.cluster.manager import recovery

    setter(recovery, "rebuilt_records", lambda *_: {})


@_ablation("term-fence", "a store logs its own writes only in the term it started last")
def _term_fence(setter: Setter) -> None:
    from backend_store.lmdb_store.replication_log import ReplicationLog

    from . import sim_store

    def always(_staged: sim_store._Batch) -> bool:
        return True  # each commit logs its own writes at whatever the fence is

    append = ReplicationLog.append

    def at_the_fence(self: ReplicationLog, writes: Any) -> Any:
        self._staged_term = self._current()[1]  # the term follows the fence, as before session 36
        return append(self, writes)

    setter(sim_store.SimReplicaStore, "_logs_own_writes", staticmethod(always))
    setter(ReplicationLog, "append", at_the_fence)


@_ablation("remade-copies", "an empty copy made again after a move deleted it counts for nothing")
def _remade_copies(setter: Setter) -> None:
    from backend_store.cluster.coordination.layout import ReplicaPosition
    from backend_store.cluster.node import node, receipts

    def as_any_copy(_kept: Any, _label: Any, position: ReplicaPosition) -> ReplicaPosition:
        return position  # published as any empty copy: it counts toward a majority

    setter(node, "remade", as_any_copy)  # the name the node publishes through
    setter(receipts, "remade", as_any_copy)  # the rule, as its unit test calls it


@_ablation("receipt-majority", "without a majority of a set, a remade copy's receipt's set decides")
def _receipt_majority(setter: Setter) -> None:
    from backend_store.cluster.manager import election

    setter(election, "newest_receipt", lambda *_: None)


@_ablation("receipt-chain", "a receipt's set is followed to the newer receipt of a member moved away")
def _receipt_chain(setter: Setter) -> None:
    from backend_store.cluster.coordination.layout import MoveReceipt
    from backend_store.cluster.manager import election

    def remade_only(nodes: Any, pid: int, record: Any) -> MoveReceipt | None:
        receipts = [
            p.remade
            for n in record.replicas
            if (p := election.position_of(nodes, n, pid)) is not None and p.remade
        ]
        return max(receipts, key=MoveReceipt.order, default=None)

    setter(election, "newest_receipt", remade_only)


@_ablation("moved-away-members", "a member that moved its copy away is accounted for by its receipt")
def _moved_away_members(setter: Setter) -> None:
    from backend_store.cluster.manager import election

    def heard_only(nodes: Any, pid: int, among: Any, unheard: Any, outdated: Any, **_: Any) -> set[str]:
        return election.heard(nodes, pid, among, unheard, outdated)

    setter(election, "accounted_for", heard_only)


@_ablation("served-sets", "after a restore, a majority of each set a live copy was served on is heard first")
def _served_sets(setter: Setter) -> None:
    from backend_store.cluster.manager import election

    setter(election, "earlier_sets_heard", lambda *_: True)


@_ablation("resignation-ends", "a resignation ends on entries of a newer term, and while holding off")
def _resignation_ends(setter: Setter) -> None:
    from dataclasses import replace

    from backend_store.cluster.node import leadership

    decide = leadership._decide

    def as_before(s: Any) -> Any:
        decision = decide(replace(s, last_epoch=0))
        if decision.action == leadership.Action.HOLD_OFF:
            return replace(decision, end_resignation=False)
        return decision

    setter(leadership, "_decide", as_before)


@_ablation("remembered-records", "a node publishes the record its disk kept for one never read")
def _remembered_records(setter: Setter) -> None:
    from backend_store.cluster.node.reconcile import MapView

    kept = MapView.kept

    def from_memory_only(self: MapView, served: Any, remembered: Any = None) -> Any:
        return kept(self, served)

    setter(MapView, "kept", from_memory_only)


@_ablation("unread-bound", "a tombstone's LSN bound is not met by a replica whose last LSN is unread")
def _unread_bound(setter: Setter) -> None:
    from backend_store.cluster.node import reconcile

    refused = reconcile._tombstone_refused

    def unread_passes(replica: reconcile.HostedReplica, tombstone: Any) -> str | None:
        if replica.last_lsn is None:
            return None  # as before session 37: an unread replica met any bound
        return refused(replica, tombstone)

    setter(reconcile, "_tombstone_refused", unread_passes)


@_ablation("repair-marks", "a commit the watch spoke during leaves the watch's garbled-record marks")
def _repair_marks(setter: Setter) -> None:
    from collections.abc import Collection

    from backend_store.cluster.manager import manager

    def every_write(written: Collection[int], _at_plan: int, _now: int) -> set[int]:
        return set(written)  # as before session 37: the commit clears every mark it wrote

    setter(manager, "cleared_marks", every_write)


@_ablation("handover-answer", "a hand-over begins only once the successor answered after it was asked")
def _handover_answer(setter: Setter) -> None:
    from backend_store.cluster.node.term import LeaderTerm

    def heard_within_a_heartbeat(self: LeaderTerm, successor: str, now: float) -> bool:
        return self._in_contact(successor, now)  # as before session 39

    setter(LeaderTerm, "_answered_since_asked", heard_within_a_heartbeat)


@_ablation("first-entry-task", "a new term's first entry is written off the reconcile tick")
def _first_entry_task(setter: Setter) -> None:
    import asyncio

    from backend_store.cluster.node.partition_host import PartitionHost

    lead = PartitionHost.lead

    async def lead_and_wait(self: PartitionHost, *args: Any, **kwargs: Any) -> None:
        await lead(self, *args, **kwargs)
        if self._upkeep is not None:  # as before session 39: the tick waited for it
            await asyncio.wait([self._upkeep])

    setter(PartitionHost, "lead", lead_and_wait)


@_ablation("breaker-verdict", "a request the breaker refused wakes at the node's next verdict")
def _breaker_verdict(setter: Setter) -> None:
    import asyncio

    from backend_store.cluster.client.partition_calls import PartitionCalls

    wait = PartitionCalls._until_moved_or_verdict

    async def cool_down_only(self: PartitionCalls, part: Any, _verdict: Any, timeout_s: float) -> None:
        await wait(self, part, asyncio.Event(), timeout_s)  # as before session 39: never set

    setter(PartitionCalls, "_until_moved_or_verdict", cool_down_only)


@_ablation("record-marks", "a record etcd holds older than a node marked it shows etcd went back")
def _record_marks(setter: Setter) -> None:
    from backend_store.cluster.coordination.timeline import Timeline

    def revisions_only(self: Timeline, marks: Any, mod_revisions: Any, incarnation: int) -> list[int]:
        return []  # as before session 40: only etcd's revision counter speaks

    setter(Timeline, "check_marks", revisions_only)


@_ablation("key-revisions", "a leader key or own node record held older than seen shows etcd went back")
def _key_revisions(setter: Setter) -> None:
    from backend_store.cluster.coordination.timeline import Timeline

    def records_only(self: Timeline, seen: Any, mod_revisions: Any, incarnation: int) -> list[str]:
        return []  # as before session 41: only revisions and the records' marks speak

    setter(Timeline, "check_keys", records_only)


@_ablation("revoke-lost-lease", "a node revokes the lease of a session it lost, once registered again")
def _revoke_lost_lease(setter: Setter) -> None:
    from backend_store.cluster.node import node

    async def left_to_expire(session: Any) -> None:
        return None  # as before session 42: etcd expires the lease when it will

    setter(node, "revoke_lost", left_to_expire)


@_ablation("publish-check", "a node checks what etcd held before each write of its record")
def _publish_check(setter: Setter) -> None:
    from backend_store.cluster.coordination.coordinator import Registered

    from . import sim_coordinator

    register = sim_coordinator.SimCoordinator.register

    async def blind(self: Any, session: Any, key: str, value: bytes) -> Registered:
        written = await register(self, session, key, value)
        return Registered(None, written.revision)  # as before session 42: nothing of what it replaced

    setter(sim_coordinator.SimCoordinator, "register", blind)


@_ablation("settle-before-serving", "a node settles etcd's timeline before serving a replica it just opened")
def _settle_before_serving(setter: Setter) -> None:
    from backend_store.cluster.node.replica_rounds import ReplicaRounds

    settle = ReplicaRounds._settle_timeline

    async def after_serving(self: ReplicaRounds, opened: Any) -> None:
        # As before issue 48: a replica opened in this round is served before the timeline
        # is settled (here, at the next round's settling, which sees it among those served).
        if not list(opened):
            await settle(self, ())

    setter(ReplicaRounds, "_settle_timeline", after_serving)


@_ablation("incarnation-floor", "a raised incarnation ends every term of the earlier one")
def _incarnation_floor(setter: Setter) -> None:
    from backend_store.cluster.node import leadership, replica_rounds

    def no_floor(incarnation: int) -> int:
        return 0  # as before issue 48: a term of an earlier incarnation goes on, and is followed

    setter(leadership, "incarnation_floor", no_floor)
    setter(replica_rounds, "incarnation_floor", no_floor)  # the replicas' followers' floor


@_ablation("wakes-with-entries", "a link's sender is woken only when it has entries to ship")
def _wakes_with_entries(setter: Setter) -> None:
    from backend_store.cluster.replication.log_shipping import ReplicationLeader

    def wake_every_link(self: ReplicationLeader) -> None:
        for progress in self.followers.values():
            progress.wake.set()  # as before issue 48: an idle link's heartbeat wait starts over

    setter(ReplicationLeader, "notify", wake_every_link)


@_ablation("reread-written", "a manager whose commit etcd refused reads what it writes again")
def _reread_written(setter: Setter) -> None:
    from backend_store.cluster.manager.manager import Manager

    async def wait_for_the_watch(self: Manager) -> None:
        return None  # as before session 86: plan again on the view, until a watch brings news

    setter(Manager, "_read_written", wait_for_the_watch)


@_ablation("hold-written", "a manager's watches compare etcd with its own commits, as its view holds them")
def _hold_written(setter: Setter) -> None:
    from backend_store.cluster.manager.manager import Manager

    def compare_with_the_last_state(self: Manager, *_: Any) -> None:
        return None  # as before session 87: a restore that lost the commit looks unchanged

    setter(Manager, "_hold_written", compare_with_the_last_state)


@_ablation(
    "heard-voters",
    "a node campaigns only on a majority of voters that told it their copies since it registered",
)
def _heard_voters(setter: Setter) -> None:
    from backend_store.cluster.coordination.layout import NodeRecord
    from backend_store.cluster.node import leadership
    from backend_store.cluster.node.registrations import Registrations

    observe = Registrations.observe

    def no_new_writes(self: Registrations, state: Any) -> bool:
        observe(self, state)
        return False  # as before session 86: nobody writes its record for a newcomer

    def every_registration(
        nodes: Mapping[str, NodeRecord], pid: int, voters: Iterable[str], heard: Any, node_id: str
    ) -> dict[str, int]:
        return {n: 0 for n in voters if n != node_id and n in nodes}  # a relic, a silent copy count

    setter(Registrations, "observe", no_new_writes)
    setter(leadership, "heard_copies", every_registration)


@_ablation("published-copies", "a heard voter counts towards a campaign only once it published its copy")
def _published_copies(setter: Setter) -> None:
    from backend_store.cluster.coordination.layout import NodeRecord
    from backend_store.cluster.node import leadership

    heard_copies = leadership.heard_copies

    def silent_too(
        nodes: Mapping[str, NodeRecord], pid: int, voters: Iterable[str], heard: Any, node_id: str
    ) -> dict[str, int]:
        # As session 86 first had it: a heard voter counts before it said what it holds.
        said = heard_copies(nodes, pid, list(voters), heard, node_id)
        return {n: said.get(n, 0) for n in voters if n != node_id and n in nodes and n in heard}

    setter(leadership, "heard_copies", silent_too)


@_ablation("remade-receipt", "an empty copy made again counts where its receipt's set includes the node")
def _remade_receipt(setter: Setter) -> None:
    from backend_store.cluster.coordination.layout import NodeRecord
    from backend_store.cluster.node import leadership

    heard_copies = leadership.heard_copies

    def no_remade(
        nodes: Mapping[str, NodeRecord], pid: int, voters: Iterable[str], heard: Any, node_id: str
    ) -> dict[str, int]:
        # As session 86 had it: a copy made again never counts.
        said = heard_copies(nodes, pid, list(voters), heard, node_id)
        return {
            n: e for n, e in said.items() if (p := nodes[n].replicas.get(pid)) is None or p.remade is None
        }

    setter(leadership, "heard_copies", no_remade)


@_ablation("voter-ahead", "a designated node whose heard voter holds a later term resigns, not campaigns")
def _voter_ahead(setter: Setter) -> None:
    from backend_store.cluster.node import leadership

    def nobody_ahead(*_: Any) -> str | None:
        return None  # as before session 86: the designation is trusted

    setter(leadership, "voter_ahead", nobody_ahead)


@_ablation("behind-own-key", "a node resigning for a voter ahead deletes its own standing key first")
def _behind_own_key(setter: Setter) -> None:
    from backend_store.cluster.node import leadership
    from backend_store.cluster.node.leadership import Action

    # As session 86 had the rule: only following and holding off deleted a key of ours.
    setter(leadership, "NOT_CAMPAIGNING", frozenset({Action.FOLLOW, Action.HOLD_OFF}))


@_ablation("wait-voter-ahead", "a manager waits for a voter ahead of a leader that resigned")
def _wait_voter_ahead(setter: Setter) -> None:
    from backend_store.cluster.manager import election

    def nobody(*_: Any) -> dict[str, tuple[int, int]]:
        return {}  # as before session 87: the best fresh position is designated

    setter(election, "voters_ahead", nobody)


@_ablation("designate-once", "a manager designates a resigned leader anew once per resignation")
def _designate_once(setter: Setter) -> None:
    from backend_store.cluster.manager import election

    def never(*_: Any) -> bool:
        return False  # as before session 88: designated anew at every plan

    setter(election, "designated_since_resigning", never)


def take_out(names: Iterable[str], setter: Setter = setattr) -> None:
    """Apply the named ablations, in order (``KeyError`` names an unknown one)."""
    for name in names:
        ABLATIONS[name].apply(setter)
