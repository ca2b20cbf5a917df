"""Who may lead a partition: the manager's side of leader election (pure, no I/O).

The manager is the cluster's elector: a node campaigns for ``leaders/{id}`` only where the
partition record designates it (the node's side, when it campaigns, hands over and resigns,
is :mod:`backend_store.cluster.node.leadership`). These rules decide the designation, on
what the replicas publish in etcd (:class:`~..coordination.layout.ReplicaPosition`):

- **Promotion** (:func:`promote`): the leader key is gone and the designated leader is dead,
  gave the key up (it resigned for lack of a quorum, or handed over) or reports its copy as
  a stray (it cannot open it, or keep on disk what serving it needs). Only a replica
  whose position shows everything a majority acknowledged may lead: the manager waits for
  positions published *after* each replica saw the key vanish (``leader_epoch == 0``) from
  a majority of the voters, and designates the best of them by ``(last_epoch, lsn)``
  (Raft's "at least as up to date"). An acknowledged write is on a majority, any two
  majorities share a replica, so the best of a majority holds it. Ties go to the requested
  successor (a finished hand-over), then to a replica that did not resign, then to one the
  last leader had in sync (it was in contact with the others), then to the node id.
  **After etcd went back in time** (the designation is of an earlier incarnation), the
  restored replica set may predate a membership change: a node it no longer names may keep
  a stray copy holding writes a majority of the *newer* set acknowledged, and a replica it
  names may have deleted its copy since. Such a node's new, empty copy is published as
  ``remade`` with the receipt its deletion left (node/receipts.py) and counts for nothing;
  without a majority of the set, a majority of the newest receipt's set heard (the set
  that replaced the copy, whose members keep what it acknowledged) will do (simulation
  seeds ``all`` 234061 and 230870, session 37), following members that moved their copies
  away in turn to their newer receipts (:func:`newest_receipt`), and counting a member
  whose receipt the best live copy covers (:func:`accounted_for`). A set that deleted
  nothing (a dead replica replaced) leaves no receipt, but its members remember it: a
  majority of every earlier set a live copy was served on must be accounted for too
  (:func:`earlier_sets_heard`, node/served_sets.py; session 38). Then the best copy anywhere leads
  (:func:`copies_ahead`: every copy a live node reports, served or stray, fresh or not, in
  the map's set or not). A voter ahead of the best fresh
  position is waited for; a node the map does not name (a stray, or one still serving what
  the newer set gave it) is designated and becomes a voter again (its copy holds everything
  acknowledged: the best of all copies holds the best of every majority's), and a member
  that is gone leaves. Found by the simulation, session 33: ``all`` 21263 (a drain moved p3
  from n3 to n1, etcd was restored to before it, and n4, cut off before, was promoted
  without 11 acknowledged entries n1 kept as a stray) and ``all`` 51423 (the restored set
  named n1, n2, n4; n1's old position and n4's, both behind, were fresh, n2's was not yet,
  and n3, a voter of the newer set, still served the newest copy).
- **Hand-over** (:func:`choose_successor`, :func:`review_handover`): leadership of a live
  leader moves only to a voter it publishes as in sync (it acknowledged the leader's whole
  log lately, so it is in contact with the leader and its majority) and has for
  ``settle_s`` (never to a node that just came back, or that just resigned for lack of a
  quorum). The record names it ``successor``; the leader stops taking writes, waits (bounded)
  until the successor holds its whole log and gives its key up, publishing what it vouches
  for; promotion then designates the successor on fresh positions like any other, waiting
  for the successor's own while it is alive (another replica as up to date may be cut off). A
  request not done within ``handover_timeout_s``, or whose successor fell out of sync or
  died, is withdrawn, that successor passed over for ``settle_s``, and another picked.

What the manager remembers between plans (since when a replica has been in sync, when a
hand-over was asked for) is :class:`~.plan.Memory`, fed the clock by the caller.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from dataclasses import replace

from ...types import epoch_incarnation
from ..coordination.layout import MoveReceipt, NodeRecord, PartitionRecord, ReplicaPosition

log = logging.getLogger("pushgate.cluster")


def majority(voters: Collection[str]) -> int:
    return len(voters) // 2 + 1


def position_of(nodes: Mapping[str, NodeRecord], node_id: str, pid: int) -> ReplicaPosition | None:
    """What ``node_id`` last published of its replica of ``pid`` (None: dead, or no copy)."""
    record = nodes.get(node_id)
    return record.replicas.get(pid) if record is not None else None


def rank(position: ReplicaPosition) -> tuple[int, int]:
    """How up to date a replica is: the epoch of its last entry first, then its last LSN."""
    return position.last_epoch, position.lsn


def promote(
    nodes: Mapping[str, NodeRecord],
    pid: int,
    record: PartitionRecord,
    *,
    last_in_sync: Collection[str] = (),
    draining: Collection[str] = (),
    incarnation: int = 0,
    unheard: Collection[str] = (),
    outdated: Collection[str] = (),
) -> PartitionRecord:
    """The record with a new designated leader if the key is gone and one is due (the
    caller checked that no node holds ``leaders/{pid}``); else ``record`` unchanged.

    ``last_in_sync``: the replicas the last leader published as in sync (a tie-break);
    ``draining``: nodes being drained (they lose ties too); ``incarnation``: the cluster's
    (a designation made in an earlier one, before etcd went back in time, is stale: nobody
    campaigns on it, and it is made anew on fresh positions, compared with every copy a
    live node reports: the module's docstring); ``unheard``: live nodes that have not
    published since the incarnation was raised (their copies are not known yet);
    ``outdated``: nodes whose record was written before the partition's leader key was last
    seen (their position, whatever it says, predates the term that ended)."""
    leader = record.leader
    current = position_of(nodes, leader, pid) if leader is not None else None
    gave_up = current is not None and current.role == "resigned"
    stale = record.designated_in < incarnation
    # A key lost during a hand-over (the leader died or was cut off after it was asked): the
    # leader, back, would lead only to hand over at once, a second election's worth of
    # unavailability (found by the random-fault test, seed 7: a leader killed just after a
    # rebalancing asked it to hand over cost 3.8-3.9 s of sends). Promote on fresh positions
    # instead; the successor wins ties, and a leader holding more than the others stays.
    handing_over = record.successor is not None
    # A leader that reports its copy as a stray does not campaign while it does (it cannot
    # open it, or keep on disk what serving it needs: a damaged file, a full disk): promoted
    # over on fresh positions, as a dead one is (session 46: a new queue designated to a node that could open no replica was never
    # served, though two of its three replicas were fine; test_unopenable_replica.py).
    leaders_record = nodes.get(leader) if leader is not None else None
    stray = leaders_record is not None and current is None and pid in leaders_record.strays
    if (
        leader is not None
        and leader in nodes
        and leader in record.replicas
        and not gave_up
        and not stale
        and not handing_over
        and not stray
    ):
        return record  # alive and not resigned: it campaigns again itself
    # A position counts only if published after the key vanished: it says so (no key seen)
    # and its record was written after the key was last seen. The second half because a node
    # may go on acknowledging a new leader's entries while its record stands still (its loop
    # held in another partition's first commit, in the simulation seed ``all`` 130837,
    # session 34): its record from before that leader's term said "no key", and the manager
    # promoted a replica without the entries that node and the dead leader had acknowledged.
    # A copy made again after its node deleted the earlier one on a move's tombstone (etcd,
    # restored, named it again) knows nothing, and does not count (simulation seeds ``all``
    # 222767, 234061, 240328, session 37: n3's copy of p3 was deleted on a move at 5.3 s, n4
    # and n1 acknowledged LSN 22, etcd was restored to before the move at 15.9 s, and n3's
    # new, empty copy made a majority with n2's, which led from LSN 21).
    fresh = {
        n: p
        for n in record.replicas
        if (p := position_of(nodes, n, pid)) is not None
        and p.leader_epoch == 0
        and n not in outdated
        and p.remade is None
    }
    # Without a majority of the set, the receipt of such a copy says where the writes went:
    # a majority of the set that replaced it held everything when the copy was deleted.
    receipt = newest_receipt(nodes, pid, record)
    by_receipt = (
        len(fresh) < majority(record.replicas)
        and bool(fresh)
        and receipt is not None
        and len(accounted_for(nodes, pid, receipt.voters, unheard, outdated, since=receipt.order()))
        >= majority(receipt.voters)
    )
    if len(fresh) < majority(record.replicas) and not by_receipt:
        return record  # a minority could lack an acknowledged write: wait
    successor = record.successor
    if (
        successor is not None
        and successor in record.replicas
        and successor not in fresh
        and position_of(nodes, successor, pid) is not None
    ):
        # The successor a hand-over chose (in sync, so in contact with a majority), alive
        # and yet to publish after the key vanished: wait for it rather than pick whoever
        # published first. Another replica as good may be cut off from its peers (simulation
        # seed ``minority`` 40624, session 33: n2, cut from its peers 1.2 s before, won the
        # tie 8 ms after the hand-over, and the partition waited 4.2 s for the heal).
        return record

    def order(n: str) -> tuple[tuple[int, int], bool, bool, bool, bool, str]:
        p = fresh[n]
        return (
            rank(p),
            n == record.successor,
            p.role != "resigned",
            n not in draining,
            n in last_in_sync,
            n,
        )

    best = max(fresh, key=order)
    designated = record.designation + 1
    # The voters the map names are trusted again only once a term of this incarnation has
    # written an entry: until then the best of a majority may still lack what a newer set
    # acknowledged, designated again or not (simulation seed ``all`` 100400, session 34: a
    # restore undid a move of p2 from n1 to n2; n4, ahead, was designated again in the new
    # incarnation and froze before it led, and n5 was promoted on the restored set's
    # majority without three acknowledged entries that n4 and n2's stray held).
    unsettled = by_receipt or stale or epoch_incarnation(fresh[best].last_epoch) < incarnation
    if unsettled and not earlier_sets_heard(nodes, pid, record, unheard, outdated):
        # A live copy was served on another set before etcd went back in time (a set that
        # replaced a dead replica: simulation seed ``returns`` 255, session 38, where n1's
        # copy had been served on n1, n2, n4 and the restored set named n1, n2, n3): that
        # set may have acknowledged what a majority of the restored one lacks.
        return record
    if unsettled and unheard:
        # Every copy counts, so every live node must have said what it holds: one yet to
        # publish since the raise may hold the best (simulation seed ``all`` 100851, session
        # 34: n2's empty copy and another were published since the raise, a majority; the
        # node holding LSNs 1-3 had not published yet, and n2 was designated). A live node
        # publishes at once when it sees the raise; a record of a dead one expires.
        return record
    if unsettled:
        ahead = copies_ahead(nodes, pid, rank(fresh[best]))
    else:
        ahead = voters_ahead(nodes, pid, record, rank(fresh[best])) if gave_up else {}
    if ahead:
        holder = max(ahead, key=lambda n: (ahead[n], n))
        if holder in record.replicas:
            return record  # a voter further ahead has yet to publish after the key vanished
        gone = tuple(n for n in record.replicas if n not in nodes)
        log.warning(
            "partition %d: %s holds a copy ahead of every replica the map names (%s) after etcd"
            " went back in time; it leads, as a voter",
            pid,
            holder,
            ahead[holder],
        )
        return replace(
            record,
            replicas=(*record.replicas, holder),
            learners=tuple(n for n in record.learners if n != holder),
            leader=holder,
            successor=None,
            leaving=gone[:1],
            designation=designated,
            designated_in=incarnation,
        )
    if best == leader and record.successor is None:
        if stale:
            log.warning("partition %d: designating %s again in incarnation %d", pid, leader, incarnation)
            return replace(record, designation=designated, designated_in=incarnation)
        if not gave_up:
            return record  # its key vanished (a restart): it campaigns again
        if designated_since_resigning(current, record):
            return record  # it campaigns on that, or holds off for what no designation ends
        # It resigned but is still the most up to date: designated anew, so it campaigns
        # again even if it resigned because its designation looked stale.
        log.warning(
            "partition %d: %s resigned and is still the most up to date; designating it again", pid, leader
        )
        return replace(record, designation=designated, designated_in=incarnation)
    if best != leader:
        if record.successor is not None and best == record.successor and gave_up:
            log.warning("partition %d: %s handed over; designating %s", pid, leader, best)
        elif handing_over and not gave_up and leader in nodes:
            log.warning("partition %d: %s's key is gone during a hand-over; promoting %s", pid, leader, best)
        else:
            why = "gave up its key" if gave_up else "is gone"
            log.warning("partition %d: leader %s %s; promoting %s", pid, leader, why, best)
    return replace(record, leader=best, successor=None, designation=designated, designated_in=incarnation)


def earlier_sets_heard(
    nodes: Mapping[str, NodeRecord],
    pid: int,
    record: PartitionRecord,
    unheard: Collection[str],
    outdated: Collection[str],
) -> bool:
    """Whether a majority of every voting set a live node's copy of ``pid`` was served on
    in an earlier incarnation (node/served_sets.py) is accounted for; the set the record
    names needs nothing more."""
    for published in nodes.values():
        served = published.served_sets.get(pid)
        if served is None or set(served.voters) == set(record.replicas):
            continue
        if len(accounted_for(nodes, pid, served.voters, unheard, outdated)) < majority(served.voters):
            return False
    return True


def accounted_for(
    nodes: Mapping[str, NodeRecord],
    pid: int,
    among: Collection[str],
    unheard: Collection[str],
    outdated: Collection[str],
    *,
    since: tuple[int, int] = (0, 0),
) -> set[str]:
    """The nodes of ``among`` whose copy is :func:`heard`, and those that moved their copy
    away with a receipt no further than the best live copy: such a node held nothing past
    the receipt's LSN when it deleted (it refuses a tombstone its copy goes past), so what
    it acknowledged the best copy holds (simulation seeds ``returns`` 1071, session 38: a
    member of an earlier served set moved its copy away after the restore, and another was
    gone for good; ``all`` 324971: a member of the newest receipt's set did). ``since``:
    the receipt must be at least that new (one older than the set asked about tells
    nothing of the copy the node held in it)."""
    best = max(copies_ahead(nodes, pid, (-1, -1)).values(), default=(0, 0))
    out = heard(nodes, pid, among, unheard, outdated)
    for n in among:
        found = nodes.get(n)
        receipt = found.receipts.get(pid) if found is not None else None
        if receipt is not None and since <= receipt.order() <= best:
            out.add(n)
    return out


def newest_receipt(nodes: Mapping[str, NodeRecord], pid: int, record: PartitionRecord) -> MoveReceipt | None:
    """The newest receipt known to be newer than ``record``: the newest among the voters'
    copies made again after a move deleted them (the record still names their nodes, so it
    predates those moves), then, while a member of that receipt's set has published a newer
    one, that one (its copy was moved away in turn, after the record; simulation seed ``all``
    320038, session 38: a restore named n2 again, whose receipt's set had since given n3's
    copy to n5, and n3's receipt named the set that held the partition last). A receipt of
    a node outside that chain may be older than the record, and says nothing."""
    remade = [p.remade for n in record.replicas if (p := position_of(nodes, n, pid)) is not None and p.remade]
    newest = max(remade, key=MoveReceipt.order, default=None)
    while newest is not None:
        later = [
            r
            for n in newest.voters
            if (node := nodes.get(n)) is not None
            and (r := node.receipts.get(pid)) is not None
            and r.order() > newest.order()
        ]
        if not later:
            return newest
        newest = max(later, key=MoveReceipt.order)
    return None


def heard(
    nodes: Mapping[str, NodeRecord],
    pid: int,
    among: Collection[str],
    unheard: Collection[str],
    outdated: Collection[str],
) -> set[str]:
    """The nodes of ``among`` whose copy of ``pid`` is known: served and published after the
    leader key vanished (and not made again), or kept as a stray with its rank (a stray takes
    no entries, so a record from before the key was last seen still says what it holds:
    simulation seed ``returns`` 3853, session 38, where n5's stray went unheard for good)."""
    out: set[str] = set()
    for n in among:
        record = nodes.get(n)
        if record is None or n in unheard:
            continue
        p = record.replicas.get(pid)
        fresh = p is not None and p.leader_epoch == 0 and p.remade is None and n not in outdated
        if fresh or pid in record.stray_ranks:
            out.add(n)
    return out


def designated_since_resigning(position: ReplicaPosition | None, record: PartitionRecord) -> bool:
    """Whether ``record`` designates anew since the resignation ``position`` publishes. The
    replica then campaigns on it, or holds off for what a designation cannot end (etcd's
    timeline unsettled, a majority of its voters not registered, its resignation's window):
    designating it again at every plan only wrote to etcd, each plan following the last
    commit's watch event (3,173 designations in 18 s of simulation seed ``pools`` 1732544
    with ``remade-receipt`` taken out; session 88). A position of an older node names no
    designation (None): designated at every plan, as before."""
    return (
        position is not None
        and position.resigned_on is not None
        and position.resigned_on < record.designation
    )


def voters_ahead(
    nodes: Mapping[str, NodeRecord], pid: int, record: PartitionRecord, than: tuple[int, int]
) -> dict[str, tuple[int, int]]:
    """The voters of ``record`` whose copy of ``pid`` ranks above ``than``, fresh or not. A
    leader resigns for such a voter when its copy ends in a later term (node/leadership.py,
    rule 9; simulation seed ``down`` 398, session 87); designated again on the fresh
    positions, it would resign again, for ever, so the manager waits for that voter's."""
    return {n: r for n, r in copies_ahead(nodes, pid, than).items() if n in record.replicas}


def copies_ahead(
    nodes: Mapping[str, NodeRecord], pid: int, than: tuple[int, int]
) -> dict[str, tuple[int, int]]:
    """Each live node's copy of ``pid`` (served, or kept as a stray) ranked above ``than``,
    fresh or not, in the map's replica set or not."""
    out: dict[str, tuple[int, int]] = {}
    for node_id, record in nodes.items():
        served = record.replicas.get(pid)
        held = max(rank(served) if served is not None else (0, 0), record.stray_ranks.get(pid, (0, 0)))
        if held > than:
            out[node_id] = held
    return out


def follow_key_holder(
    nodes: Mapping[str, NodeRecord], pid: int, record: PartitionRecord, holder: str
) -> PartitionRecord:
    """The record designating ``holder``, a voter serving under the key though the record
    names another (a campaign that raced a designation): it won a fenced term, so it leads,
    and designating someone else would leave the partition waiting on a hand-over nobody
    asked for."""
    lead = position_of(nodes, holder, pid)
    if holder == record.leader or holder not in record.replicas or lead is None or lead.role != "leader":
        return record
    log.warning("partition %d: %s holds the key; designating it (was %s)", pid, holder, record.leader)
    return replace(record, leader=holder, successor=None)


def eligible_successors(
    pid: int,
    record: PartitionRecord,
    lead: ReplicaPosition,
    *,
    in_sync_for: Mapping[str, float],
    settle_s: float,
    passed_over: Collection[str],
    excluded: Collection[str],
) -> list[str]:
    """The voters leadership may move to: published in sync by the leader continuously
    for ``settle_s`` (``in_sync_for``: for how long each has been), not ``excluded``
    (draining, leaving, dead) and not ``passed_over`` (a recent hand-over to it failed)."""
    in_sync = set(lead.in_sync)
    return [
        n
        for n in record.replicas
        if n != record.leader
        and n in in_sync
        and in_sync_for.get(n, -1.0) >= settle_s
        and n not in excluded
        and n not in passed_over
    ]


def choose_successor(candidates: Collection[str], leading: Mapping[str, int]) -> str | None:
    """The candidate leading the fewest partitions (then by id); None if there is none."""
    if not candidates:
        return None
    return min(candidates, key=lambda n: (leading.get(n, 0), n))


def review_handover(
    pid: int,
    record: PartitionRecord,
    lead: ReplicaPosition,
    *,
    asked_s: float,
    handover_timeout_s: float,
    alive: Collection[str],
) -> bool:
    """Whether a hand-over under way to ``record.successor`` may go on (False: withdraw it):
    the successor is a live voter still in the leader's sync set, and the request is younger
    than ``handover_timeout_s``."""
    successor = record.successor
    if successor is None:
        return False
    why = None
    if successor not in record.replicas or successor not in alive:
        why = "is gone"
    elif successor not in lead.in_sync:
        why = "fell out of sync"
    elif asked_s > handover_timeout_s:
        why = f"did not take over within {handover_timeout_s:g}s"
    if why is not None:
        log.warning("partition %d: withdrawing the hand-over to %s: it %s", pid, successor, why)
        return False
    return True
