"""A node's side of leader election: when a replica campaigns, serves, hands over, resigns.

Who may lead is the manager's decision (:mod:`backend_store.cluster.manager.election`,
published as the partition record's ``leader`` and ``successor``); a node acts on it here.
The decision is :func:`decide`, sans-I/O: a :class:`Situation` in (the record, what this
replica is doing, the leader key as the node sees it, the time), a :class:`Decision` out;
:class:`NodeLeadership` carries it out with the coordinator and the replica's
:class:`LeadingReplica` (production's :class:`~.partition_host.PartitionHost`; the
deterministic simulation drives this same class with its own replicas, clock and etcd). The rules, in order:

Leading (this replica holds the key at epoch ``term``):

1. A newer term shows (a follower's fence, a newer key, its own store's fence, or an
   incarnation raised past the term's, ``timeline.incarnation_floor``): step down,
   publishing as resigned the position this term vouches for, and hold off campaigning
   until the manager designates anew (the record's ``designation`` moves):
   a newer term means this replica's designation may be stale (an etcd restored from an
   older snapshot designates whoever led then), and the manager designates on fresh
   positions, this replica again if it is still the most up to date (the simulation,
   ``all`` seeds 27 and 13).
2. The leader key, as the node's watch shows it, is absent or another node's: read it from
   etcd (the watch may lag behind our own campaign). If it really is not ours (etcd was
   restored from a snapshot taken before our campaign, and the restored key, or none, stands
   in its place), step down: a term without its key is invisible to gateways and to the
   manager, which would wait on a live designated leader for ever (the simulation, ``all``
   seed 13). Designated still, the replica campaigns again for a key of the etcd as it is.
3. Check-quorum (:mod:`..replication.quorum`): no majority heard from for the window while
   the others could lead without it: resign (publish the position it vouches for, delete
   the key, hold off campaigning for a window).
4. The record names a ``successor`` (or, after a race, designates another voter): hand
   over. Refuse new requests until every write begun has finished and the successor holds
   the whole log, then give the key up, publishing exactly that position, and the manager
   designates the successor. Bounded by ``handover_timeout_s``: past it the leader serves
   again and does not try that successor again until the record names another.
5. Otherwise serve.

Not leading:

6. After a resignation (deposed, check-quorum, a hand-over, or a campaign refused by this
   replica's own newer fence): a newer key ends it; our own key still standing is deleted
   again; while still designated, do not campaign for one window (the manager may designate
   another on fresh positions meanwhile), or, after rule 1, until it designates anew.
7. etcd seems to have gone back in time (a watch showed it behind what this node remembers,
   :mod:`..coordination.timeline`) and no fresh read settled it yet: hold off; the epoch a
   campaign would win may repeat one already used.
8. Designated in an earlier incarnation of the cluster (before etcd was found to have gone
   back in time, which raises it): hold off until the manager designates anew on fresh
   positions; whoever led before the restore may not be the most up to date now.
9. Designated, the session valid and a majority of the voters heard, each having told
   what its copy holds (records written since this node registered: a registration etcd
   restored from a backup is no sign of life, :mod:`.registrations`): campaign (a key held
   by another stays theirs until their lease ends; etcd refuses the campaign until then).
   Unless a heard voter's copy ends in a later term than this replica's: the designation
   is older than that term (etcd restored while the nodes were down, and nothing showed
   the restore: simulation seed ``down`` 398, session 87), and a term begun now would
   lack what the later one acknowledged. Resign as rule 1 does (published as resigned,
   holding off until the manager designates anew on those positions; the manager waits
   for that voter's fresh position, :func:`~..manager.election.promote`).
10. Not campaigning (rules 6-9, or not designated) while the leader key is this node's:
    delete it. Such a key is a relic (etcd restored from a snapshot taken while this node
    led, under a lease the node still keeps alive, or a resignation whose delete failed):
    while it stands nobody else can campaign and the manager promotes nobody
    (the simulation, ``restore`` seed 14).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from ...errors import PushgateError, StaleEpoch
from ...types import Epoch, Lsn, epoch_revision
from ..coordination.coordinator import Coordinator, CoordinatorUnavailable, Session
from ..coordination.layout import Layout, LeaderRecord, NodeRecord, PartitionRecord
from ..coordination.timeline import Timeline, incarnation_floor
from ..replication.log_shipping import ReplicationLeader
from ..replication.quorum import Resignation

log = logging.getLogger("pushgate.cluster")

# Check-quorum is confirmed after this pause, so that answers already received are read first.
_QUORUM_CONFIRM_S = 0.05


class Action(StrEnum):
    SERVE = "serve"
    STEP_DOWN = "step_down"
    RESIGN_DEPOSED = "resign_deposed"
    CHECK_KEY = "check_key"  # read the leader key from etcd; step down if it is not ours
    RESIGN_FOR_QUORUM = "resign_for_quorum"
    HAND_OVER = "hand_over"  # begin or go on waiting (requests refused)
    ABANDON_HAND_OVER = "abandon_hand_over"
    FOLLOW = "follow"
    HOLD_OFF = "hold_off"
    RESIGN_BEHIND = "resign_behind"  # a voter holds a later term: let the manager designate anew
    DELETE_OWN_KEY = "delete_own_key"
    CAMPAIGN = "campaign"


@dataclass(frozen=True, slots=True)
class Situation:
    """What :func:`decide` looks at for one replica (monotonic seconds throughout)."""

    node_id: str
    record: PartitionRecord
    now: float
    session_valid: bool
    # The leader key as the node sees it: (holder node id, epoch), None when absent.
    key: tuple[str, int] | None
    window_s: float  # check-quorum's window: also the hold-off after a resignation
    handover_timeout_s: float
    # Leading (term None: not leading).
    term: int | None = None
    deposed: bool = False
    lacks_quorum: bool = False
    handing_over_to: str | None = None
    handover_started: float = 0.0
    abandoned: str | None = None  # a successor given up on
    # Not leading: a resignation not yet ended by a newer leader.
    resigned: Resignation | None = None
    incarnation: int = 0  # the cluster's, as this node last read it
    etcd_behind: bool = False  # etcd seems behind what this node remembers (rule 7)
    # The voters heard from since this node registered that said what their copies hold
    # (itself included): a term needs links to a majority to commit anything.
    registered_voters: int = 0
    # A heard voter whose published copy ends in a later term than this replica's last
    # entry (None: none): this replica's designation predates that term.
    voter_ahead: str | None = None
    # The epoch of this replica's last entry: past a resignation's term, a newer leader has
    # written here even if its key was never seen (this node's loop was held meanwhile).
    last_epoch: int = 0


@dataclass(frozen=True, slots=True)
class Decision:
    action: Action
    why: str = ""
    successor: str | None = None  # HAND_OVER: to whom
    end_resignation: bool = False  # a newer leader exists: an ordinary follower again


# Rule 10 applies to each. A resignation for a voter ahead too: its own key standing (a
# campaign won just before that voter published; simulation seed ``all`` 1761143, session
# 87) ended each resignation as a newer term's key, and nothing deleted the key, so the
# manager, which promotes nobody while a key stands, waited for good.
NOT_CAMPAIGNING = frozenset({Action.FOLLOW, Action.HOLD_OFF, Action.RESIGN_BEHIND})


def decide(s: Situation) -> Decision:
    """What the replica does now (see the module's rules)."""
    decision = _decide(s)
    if decision.action in NOT_CAMPAIGNING and s.key is not None and s.key[0] == s.node_id:
        # Rule 10: a key of ours that this replica does not serve (restored with etcd from
        # a snapshot under a lease this node still keeps alive): nobody else can campaign
        # while it stands, and the manager promotes nobody while a key exists.
        why = f"a leader key of ours this replica does not serve ({decision.why or 'not designated'})"
        return Decision(Action.DELETE_OWN_KEY, why, end_resignation=decision.end_resignation)
    return decision


def _decide(s: Situation) -> Decision:
    record = s.record
    designated = record.leader == s.node_id
    if s.term is not None:
        if s.deposed:
            return Decision(Action.RESIGN_DEPOSED, "a newer term exists")
        if s.key is None or s.key != (s.node_id, s.term):
            return Decision(Action.CHECK_KEY, "the map shows no leader key of this term")
        if s.lacks_quorum:
            return Decision(Action.RESIGN_FOR_QUORUM, "no majority heard from")
        target = record.successor if designated else record.leader
        if target is None or target == s.node_id or target not in record.replicas:
            if designated:
                return Decision(Action.SERVE)
            return Decision(Action.STEP_DOWN, "no longer designated")
        if target == s.abandoned and s.handing_over_to is None:
            return Decision(Action.SERVE)  # given up on it: the manager picks again
        if s.handing_over_to == target and s.now - s.handover_started > s.handover_timeout_s:
            return Decision(Action.ABANDON_HAND_OVER, f"{target} did not catch up", target)
        return Decision(Action.HAND_OVER, successor=target)
    end = False
    resigned = s.resigned
    if resigned is not None:
        # Ended by a newer term's key, or by entries of a newer term: this replica has
        # acknowledged past what it vouched for, and its position must say so (simulation
        # seed ``returns`` 2652, session 38: n2 resigned p4 at epoch 12 vouching for LSN 10,
        # then acknowledged LSN 16 under n3's term while it held off on a stale
        # designation; it kept publishing LSN 10, and n4 was promoted without LSN 16).
        newer_entries = s.last_epoch > max(resigned.epoch, resigned.last_epoch)
        if (s.key is not None and s.key[1] > resigned.epoch) or newer_entries:
            end = True
        elif s.key is not None and s.key == (s.node_id, resigned.epoch):
            return Decision(Action.DELETE_OWN_KEY, "our resigned key still stands")
        elif designated and resigned.stale and resigned.designation == record.designation:
            return Decision(Action.HOLD_OFF, "designation may be stale: waiting for the manager")
        elif designated and not resigned.stale and s.now - resigned.at < s.window_s:
            return Decision(Action.HOLD_OFF, "resigned lately")
    if not designated or not s.session_valid:
        return Decision(Action.FOLLOW, end_resignation=end)
    if s.etcd_behind:
        return Decision(
            Action.HOLD_OFF, "etcd may have gone back in time: not settled yet", end_resignation=end
        )
    if record.designated_in < s.incarnation:
        why = "designated before etcd went back in time: waiting for the manager"
        return Decision(Action.HOLD_OFF, why, end_resignation=end)
    if s.registered_voters < len(record.replicas) // 2 + 1:
        # Not yet heard of a majority's registrations (a node just started): a term begun
        # now would have no links, and its first commit would wait with the node's loop.
        why = "a majority of the voters is not registered yet"
        return Decision(Action.HOLD_OFF, why, end_resignation=end)
    if s.voter_ahead is not None:
        why = f"{s.voter_ahead} holds entries of a later term than this replica's last"
        return Decision(Action.RESIGN_BEHIND, why, end_resignation=end)
    return Decision(Action.CAMPAIGN, end_resignation=end)


def heard_copies(
    nodes: Mapping[str, NodeRecord],
    pid: int,
    voters: Collection[str],
    heard: Collection[str],
    node_id: str,
) -> dict[str, int]:
    """The other voters heard from since this node registered that publish what their copy
    of ``pid`` holds (served or stray), with the epoch of its last entry. A voter that has
    not said yet (a copy found on disk, not examined) may hold the newest entries: it does
    not count (simulation seed ``down`` 46, session 86: n3 registered 3 ms before n1
    campaigned, its copy holding LSN 23 unpublished, and n1 led from LSN 21). Once it has,
    it has settled etcd's timeline (``replica_rounds.py``) and raised the incarnation if its
    copy knows etcd went back, so a campaign on a designation the restore brought back is
    refused (it compares the cluster record); if its copy ends in a later term, this node
    resigns (rule 9). A copy made again empty (its node deleted the earlier one on a move,
    and etcd, restored, named it again) says what became of its writes: its receipt names
    the set that took them over. It counts, as holding nothing, where that set includes
    this node, and not elsewhere (the writes went to nodes this one does not know of).
    Counting none held a partition for good (simulation seeds ``pools`` 1732521 and
    1732544, session 87): a restore undid a move of p1 from n1, n2, n3 to n3, n4, n5; n1
    and n2 made their copies again, the manager designated n3 on the receipt's set, and n3,
    hearing only itself of n1, n2, n3, held off, while the manager designated it anew."""
    out: dict[str, int] = {}
    for n in voters:
        record = nodes.get(n)
        if n == node_id or n not in heard or record is None:
            continue
        position = record.replicas.get(pid)
        if position is not None and position.remade is None:
            out[n] = position.last_epoch
        elif position is not None and position.remade is not None and node_id in position.remade.voters:
            out[n] = 0  # empty: ahead of nobody
        elif position is None and pid in record.stray_ranks:
            out[n] = record.stray_ranks[pid][0]
    return out


def voter_ahead(copies: Mapping[str, int], last_epoch: int) -> str | None:
    """A voter whose copy's last entry is of a later term than ``last_epoch`` (None: none)."""
    return next((n for n in sorted(copies) if copies[n] > last_epoch), None)


class Incarnations(Protocol):
    """What leadership needs of the node's identity (:class:`~.node_identity.NodeIdentity`)."""

    @property
    def incarnation(self) -> int: ...

    @property
    def cluster_value(self) -> bytes | None:
        """The cluster record's bytes that ``incarnation`` was read from (None: none read)."""
        ...

    @property
    def timeline(self) -> Timeline: ...

    async def raise_incarnation_past(self, epoch: int) -> bool: ...


class ReplicaFence(Protocol):
    @property
    def epoch(self) -> Epoch: ...


class LeadingReplica(Protocol):
    """What leadership needs of a hosted replica (:class:`~.partition_host.PartitionHost`)."""

    partition: int
    record: PartitionRecord | None
    leader: ReplicationLeader | None
    resigned: Resignation | None
    abandoned_successor: str | None
    handing_over_to: str | None
    handover_started: float

    @property
    def store(self) -> ReplicaFence: ...

    async def lead(
        self,
        epoch: Epoch,
        record: PartitionRecord,
        addresses: Mapping[str, str],
        queues: Mapping[tuple[str, str], Mapping[str, Any]],
        *,
        quorum_window_s: float,
    ) -> None: ...

    def update_links(self, record: PartitionRecord, addresses: Mapping[str, str]) -> None: ...

    def apply_queue_attributes_soon(
        self, queues: Mapping[tuple[str, str], Mapping[str, Any]], *, after_s: float = 0.0
    ) -> None: ...

    def keep_leading(self, successor: str | None) -> None: ...

    def hand_over(self, successor: str, now: float, designation: int) -> Resignation | None: ...

    def abandon_hand_over(self) -> None: ...

    def last_entry(self) -> tuple[Epoch, Lsn]:
        """(epoch of the last entry, last LSN)."""
        ...

    def lacks_quorum(self, now: float, live: Collection[str]) -> bool: ...

    async def resign_for_quorum(self, now: float, designation: int) -> Resignation: ...

    async def resign_deposed(self, now: float, designation: int) -> Resignation: ...

    def resign_stale(self, epoch: int, now: float, designation: int) -> None: ...

    async def step_down(self, why: str) -> None: ...


class NodeLeadership:
    """Carries out :func:`decide` for a node's replicas: campaigns, hand-overs, resignations."""

    def __init__(
        self,
        coordinator: Coordinator,
        layout: Layout,
        node_id: str,
        address: Callable[[], str],
        *,
        quorum_window_s: float,
        handover_timeout_s: float,
        publish_soon: Callable[[], None],
        identity: Incarnations,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.coordinator = coordinator
        self.layout = layout
        self.node_id = node_id
        self.address = address
        self.quorum_window_s = quorum_window_s
        self.handover_timeout_s = handover_timeout_s
        self.publish_soon = publish_soon
        # The cluster's incarnation, which epochs carry (raised when etcd went back in time).
        self.identity = identity
        self.clock = clock  # the node's monotonic clock (the simulation's, skewed, in it)
        # The epoch and value of each leader key this node holds (cleared with a new session).
        self.claims: dict[int, tuple[Epoch, bytes]] = {}

    def situation(
        self,
        host: LeadingReplica,
        record: PartitionRecord,
        session: Session,
        key: tuple[str, int] | None,
        nodes: Mapping[str, NodeRecord],
        now: float,
        heard: Collection[str],
    ) -> Situation:
        leader = host.leader
        last_epoch = host.last_entry()[0]
        copies = heard_copies(nodes, host.partition, record.replicas, heard, self.node_id)
        common: dict[str, Any] = {
            "node_id": self.node_id,
            "record": record,
            "now": now,
            "session_valid": session.valid(),
            "key": key,
            "window_s": self.quorum_window_s,
            "handover_timeout_s": self.handover_timeout_s,
            "abandoned": host.abandoned_successor,
            "resigned": host.resigned,
            "incarnation": self.identity.incarnation,
            "etcd_behind": self.identity.timeline.suspect,
            "registered_voters": 1 + len(copies),
            "voter_ahead": voter_ahead(copies, last_epoch),
            "last_epoch": last_epoch,
        }
        if leader is None:
            return Situation(**common)
        lost_claim = key is not None and key[1] > leader.epoch
        # A term of an earlier incarnation is over: its designation may be one a restore
        # brought back, and its replicas follow it no more (timeline.incarnation_floor).
        fence = max(host.store.epoch, incarnation_floor(self.identity.incarnation))
        return Situation(
            **common,
            term=leader.epoch,
            deposed=leader.deposed.is_set() or lost_claim or fence > leader.epoch,
            lacks_quorum=host.lacks_quorum(now, nodes),
            handing_over_to=host.handing_over_to,
            handover_started=host.handover_started,
        )

    async def reconcile(
        self,
        session: Session,
        host: LeadingReplica,
        record: PartitionRecord,
        addresses: Mapping[str, str],
        leaders: Mapping[int, tuple[LeaderRecord, Epoch]],
        nodes: Mapping[str, NodeRecord],
        queues: Mapping[tuple[str, str], Mapping[str, Any]],
        record_value: bytes | None,
        *,
        heard: Collection[str],
    ) -> None:
        """Decide for one replica and act (the node's reconcile tick). ``record_value``: the
        bytes ``record`` was read from (None: it is unreadable now, kept from before);
        ``heard``: the nodes whose records were written since this node registered."""
        claim = leaders.get(host.partition)
        key = (claim[0].node, int(claim[1])) if claim is not None else None
        now = self.clock()
        decision = decide(self.situation(host, record, session, key, nodes, now, heard))
        if decision.end_resignation:
            host.resigned = None  # a newer term: an ordinary follower again
            self.publish_soon()
        match decision.action:
            case Action.SERVE:
                host.keep_leading(record.successor)
                host.update_links(record, addresses)
                host.apply_queue_attributes_soon(queues)
            case Action.STEP_DOWN:
                await self.resign_key(host.partition)
                await host.step_down(decision.why)
            case Action.RESIGN_DEPOSED:
                await self.resign_key(host.partition)
                await host.resign_deposed(now, record.designation)
                self.publish_soon()
            case Action.CHECK_KEY:
                leader = host.leader
                assert leader is not None
                if await self._holds_key(host.partition, leader.epoch):
                    # Ours (the watch lags behind our campaign): serve as SERVE does.
                    host.keep_leading(record.successor)
                    host.update_links(record, addresses)
                    host.apply_queue_attributes_soon(queues)
                else:
                    await self.resign_key(host.partition)
                    await host.step_down("its leader key is gone from etcd (restored from a snapshot?)")
            case Action.RESIGN_FOR_QUORUM:
                # Confirm after a short pause: after this process stalled (a loaded machine),
                # this tick's timer runs before the tasks that read the followers' answers
                # already in the sockets, and a majority that answered all along looks
                # silent (a fresh leader resigned mid-send in CI, test_node_storage.py).
                await asyncio.sleep(_QUORUM_CONFIRM_S)
                if host.lacks_quorum(self.clock(), nodes):
                    await self._resign_for_quorum(host, self.clock(), record.designation)
            case Action.HAND_OVER:
                assert decision.successor is not None
                host.update_links(record, addresses)
                resignation = host.hand_over(decision.successor, now, record.designation)
                if resignation is not None:
                    log.warning(
                        "partition %d: handed over to %s at LSN %d (epoch %d)",
                        host.partition,
                        decision.successor,
                        resignation.lsn,
                        resignation.last_epoch,
                    )
                    await self.resign_key(host.partition)
                    await host.step_down(f"handed over to {decision.successor}")
                    self.publish_soon()
            case Action.ABANDON_HAND_OVER:
                host.abandon_hand_over()
            case Action.DELETE_OWN_KEY:
                assert claim is not None
                # Packed again: this node wrote it with the same code (LeaderRecord.pack).
                with contextlib.suppress(CoordinatorUnavailable):
                    await self.coordinator.resign(
                        self.layout.leader(host.partition), Epoch(epoch_revision(claim[1])), claim[0].pack()
                    )
                host.record = record
            case Action.RESIGN_BEHIND:
                log.warning("partition %d: not campaigning: %s", host.partition, decision.why)
                host.record = record
                host.resign_stale(host.store.epoch, now, record.designation)
                self.publish_soon()
            case Action.FOLLOW | Action.HOLD_OFF:
                host.record = record
            case Action.CAMPAIGN:
                if record_value is not None:  # else the manager writes the record again first
                    await self._campaign(session, host, record, record_value, addresses, queues)

    async def _campaign(
        self,
        session: Session,
        host: LeadingReplica,
        record: PartitionRecord,
        record_value: bytes,
        addresses: Mapping[str, str],
        queues: Mapping[tuple[str, str], Mapping[str, Any]],
    ) -> None:
        claim_value = LeaderRecord(self.node_id, self.address(), self.identity.incarnation).pack()
        key = self.layout.leader(host.partition)
        # Claimed only while etcd still holds the record that designates this node, and the
        # cluster record this node judged it by: a map watch behind etcd (the node was cut
        # off, etcd was down) must not lead on a designation the manager has replaced
        # (simulation seed ``all`` 100074), nor a cluster watch behind it on a designation
        # from before etcd was restored (``all`` 50473: its map watch showed the restored
        # record, its cluster watch not yet the raised incarnation that makes it stale).
        cluster_value = self.identity.cluster_value
        if cluster_value is None:
            return  # no cluster record read: nothing to judge the designation by
        unchanged = {self.layout.partition(host.partition): record_value, self.layout.cluster: cluster_value}
        result = await self.coordinator.campaign(session, key, claim_value, unchanged=unchanged)
        if not result.won or not session.valid():
            return  # someone else holds the key (it vanishes with their lease), or the map moved
        # Our claim (perhaps an earlier one of this session): its epoch is the one it records.
        epoch = LeaderRecord.unpack(result.holder).epoch(result.epoch)
        try:
            await host.lead(epoch, record, addresses, queues, quorum_window_s=self.quorum_window_s)
        except StaleEpoch as exc:
            # This replica has seen a newer term than the key's: give the key back. If etcd
            # went back in time (restored), raise the incarnation past the fence first.
            log.warning("partition %d: cannot lead at epoch %d: %s", host.partition, epoch, exc)
            await self.identity.raise_incarnation_past(host.store.epoch)
            await self.coordinator.resign(key, Epoch(epoch_revision(epoch)), result.holder)
            await host.step_down("stale")
            # Designated by a map older than this replica's fence: vouch for what it holds
            # and let the manager designate again on fresh positions (rule 1).
            host.resign_stale(epoch, self.clock(), record.designation)
            self.publish_soon()
            return
        self.claims[host.partition] = (epoch, result.holder)

    async def _holds_key(self, partition: int, epoch: int) -> bool:
        """Whether etcd holds this node's leader key of ``epoch`` (a linearizable read; an
        etcd that cannot be read says nothing: keep serving until the session decides)."""
        try:
            found = await self.coordinator.get(self.layout.leader(partition))
        except CoordinatorUnavailable:
            return True
        if found is None:
            return False
        try:
            claim = LeaderRecord.unpack(found.value)
        except PushgateError:
            return False
        return claim.node == self.node_id and claim.epoch(found.create_revision) == epoch

    async def _resign_for_quorum(self, host: LeadingReplica, now: float, designation: int) -> None:
        resignation = await host.resign_for_quorum(now, designation)
        log.warning(
            "partition %d: resigned leadership of epoch %d for lack of a quorum; vouching for LSN %d"
            " (epoch %d); not campaigning for %gs",
            host.partition,
            resignation.epoch,
            resignation.lsn,
            resignation.last_epoch,
            self.quorum_window_s,
        )
        await self.resign_key(host.partition)
        self.publish_soon()

    async def resign_key(self, partition: int) -> None:
        """Delete the leader key this node holds for ``partition`` (if it does)."""
        claim = self.claims.pop(partition, None)
        if claim is not None:
            epoch, holder = claim
            with contextlib.suppress(CoordinatorUnavailable):
                await self.coordinator.resign(
                    self.layout.leader(partition), Epoch(epoch_revision(epoch)), holder
                )
