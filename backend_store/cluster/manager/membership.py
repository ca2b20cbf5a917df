"""Replica-set changes one step at a time, as Raft and Kafka make them (pure, no I/O).

A replica moves (a drain, a replacement of a dead one, a rebalance) in steps, each one
written by the manager only once the partition's leader published that the previous one
took effect (docs/cluster.md, "Membership changes"):

1. **Add a learner** (:func:`start_move`): the new node hosts a copy and the leader ships it
   the log, but its acknowledgements count in no majority and it never leads. The voter it
   replaces is marked ``leaving``. Refused while the voters that stay lag (any of them out
   of the leader's sync set, or in it for less than ``settle_s``): a move must not leave the
   partition one failure from losing what the leaving replica holds.
2. **The learner votes** (:func:`advance`): once the leader publishes it in sync (it holds
   the leader's whole log) and publishes the current voting set as its own (a majority of
   it holds every acknowledged write), the learner joins the voters: R voters become R+1.
3. **The leaving voter goes**: once the leader publishes the R+1 set as its own, the leaving
   one leaves it: R+1 become R. Each step adds or removes one voter, so any majority of
   one set shares a replica with any majority of the next; two steps apart they may not,
   which is why each waits for the leader to have taken up the one before.
4. **Its copy is deleted** only on a tombstone (:func:`tombstones`): once the leader
   publishes the new set as its own and the removed replica's published position is no
   further than what that set committed, ``tombstones/{partition}/{node}`` gives the node
   leave to delete it (the node's side: ``node/reconcile.py``).

A voter the leader leads from is never the one leaving: leadership moves first, by a
hand-over (:mod:`.election`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, replace

from ..coordination.layout import MoveReceipt, NodeRecord, PartitionRecord, ReplicaPosition, Tombstone

log = logging.getLogger("pushgate.cluster")

# Picks ``count`` spare nodes for a partition, none of ``exclude`` (and counts them as loaded).
PickSpares = Callable[[set[str], int], list[str]]


@dataclass(frozen=True, slots=True)
class Serving:
    """A partition whose designated leader holds its key and publishes as leader."""

    record: PartitionRecord
    lead: ReplicaPosition

    @property
    def settled(self) -> bool:
        """The leader counts by the record's voting set (the last step took effect)."""
        return set(self.lead.voters) == set(self.record.replicas)

    def in_sync(self, node_id: str) -> bool:
        return node_id in self.lead.in_sync


def advance(
    pid: int,
    serving: Serving,
    factor: int,
    *,
    alive: Collection[str],
    unwanted: Collection[str],
    pick_spares: PickSpares,
    pick_voters: PickSpares,
) -> PartitionRecord:
    """The next step of a change under way (learners, ``leaving``, too few voters), or the
    record unchanged (waiting for the leader to take up the last one). ``pick_spares``:
    nodes settled enough to become learners; ``pick_voters``: any live node, for a voter
    that leaves the majority as large as it was."""
    record = serving.record
    learners = list(record.learners)
    # A learner that died or is being drained will not catch up: drop it (its move starts
    # again with another node below).
    gone = [n for n in learners if n not in alive or n in unwanted]
    if gone:
        log.warning("partition %d: dropping learner(s) %s (gone or drained)", pid, ", ".join(gone))
        return replace(record, learners=tuple(n for n in learners if n not in gone))
    if not serving.settled:
        return record
    for learner in learners:
        if serving.in_sync(learner):
            log.info("partition %d: learner %s caught up; it votes now", pid, learner)
            return replace(
                record,
                replicas=(*record.replicas, learner),
                learners=tuple(n for n in learners if n != learner),
            )
    if learners:
        return record  # still catching up
    leaving = [n for n in record.leaving if n in record.replicas]
    if len(leaving) != len(record.leaving):
        return replace(record, leaving=tuple(leaving))
    if leaving and len(record.replicas) > factor:
        out = next((n for n in leaving if n != record.leader), None)
        if out is not None:
            log.info("partition %d: %s leaves the voters (its replacement votes)", pid, out)
            return replace(
                record,
                replicas=tuple(n for n in record.replicas if n != out),
                leaving=tuple(n for n in leaving if n != out),
            )
        return record  # the leader is leaving: a hand-over comes first
    if len(record.replicas) - len(leaving) < factor:
        # Too few voters (a set placed when few nodes were up, or a move whose learner was
        # dropped). From an even count a new voter leaves the majority as large as it was
        # (2 of 2, then 2 of 3): it joins the voters at once, from any live node, catching
        # up as one, and commits never wait for it. Until it votes, a leader failure leaves
        # the other voter alone, no majority, and nobody is promoted until that leader comes
        # back: a queue created while one of three nodes was restarting was placed on the
        # other two, and after the restart it took ~9 s (the node's settling, a learner's
        # catch-up) before its frozen leader could be replaced (issue 48, item 2;
        # tests/cluster/test_failover_after_restarts.py). From an odd count the majority
        # grows, so a learner first, never a voter that has yet to catch up.
        if len(record.replicas) % 2 == 0:
            voter = pick_voters(set(record.members), 1)
            if voter:
                log.info("partition %d: adding %s as a voter (too few voters)", pid, voter[0])
                return replace(record, replicas=(*record.replicas, voter[0]))
            return record
        spare = pick_spares(set(record.members), 1)
        if spare:
            log.info("partition %d: adding %s as a learner", pid, spare[0])
            return replace(record, learners=(spare[0],))
    return record


def start_move(
    pid: int,
    serving: Serving,
    out: str,
    *,
    healthy: Callable[[str], bool],
    pick_spares: PickSpares,
    why: str,
) -> PartitionRecord:
    """Begin moving voter ``out`` (not the leader) off: a spare joins as a learner and
    ``out`` is marked leaving. Refused (record unchanged) while a voter that stays is not
    ``healthy`` (in the leader's sync set for a while), or no spare is available."""
    record = serving.record
    if not serving.settled or record.learners or record.leaving or record.successor is not None:
        return record
    staying = [n for n in record.replicas if n != out]
    lagging = [n for n in staying if n != record.leader and not healthy(n)]
    if lagging:
        return record
    spare = pick_spares(set(record.members), 1)
    if not spare:
        return record
    log.info("partition %d: moving its replica from %s to %s (%s)", pid, out, spare[0], why)
    return replace(record, learners=(spare[0],), leaving=(out,))


def tombstones(
    nodes: Mapping[str, NodeRecord],
    partitions: Mapping[int, PartitionRecord],
    serving: Mapping[int, Serving],
    existing: Mapping[tuple[int, str], Tombstone],
) -> tuple[dict[tuple[int, str], Tombstone], list[tuple[int, str]]]:
    """Tombstones to write and to delete.

    Written for a node that holds a copy of a partition whose members (voters and learners)
    no longer name it (a copy it still serves, or one it keeps as a stray), once the
    partition's leader publishes the record's voters as its own and the copy's position is
    no further than ``(leader's epoch, committed)``. A stray's position is not published:
    the tombstone's LSN (the leader's committed) is the bound, and the node refuses a
    tombstone its copy goes past. Deleted once the node publishes without the copy, served
    or stray (it deleted it), or when the node is a member again (it must not delete the
    copy it now hosts; the step that adds it deletes the tombstone in the same transaction
    too)."""
    puts: dict[tuple[int, str], Tombstone] = {}
    deletes: list[tuple[int, str]] = []
    for (pid, node_id), _ in sorted(existing.items()):
        record = partitions.get(pid)
        member = record is not None and node_id in record.members
        node = nodes.get(node_id)
        gone = node is not None and pid not in node.replicas and pid not in node.strays
        if member or gone:
            deletes.append((pid, node_id))
    for node_id, node in sorted(nodes.items()):
        copies: list[tuple[int, tuple[int, int]]] = [
            (pid, (position.last_epoch, position.lsn)) for pid, position in node.replicas.items()
        ]
        copies += [(pid, (0, 0)) for pid in node.strays if pid not in node.replicas]
        for pid, held in sorted(copies):
            record = partitions.get(pid)
            found = serving.get(pid)
            if record is None or found is None or node_id in record.members or (pid, node_id) in existing:
                continue
            lead = found.lead
            # The record as it stands after this plan: a removal written in this very plan is
            # not taken up by the leader yet.
            settled = set(lead.voters) == set(record.replicas)
            if not settled or held > (lead.epoch, lead.committed):
                continue  # the new set has not committed past what this copy holds (yet)
            log.info("partition %d: %s's copy is no longer needed (tombstone)", pid, node_id)
            receipt = MoveReceipt(tuple(record.replicas), lead.epoch, lead.committed)
            puts[(pid, node_id)] = Tombstone(
                pid, node_id, "moved", lead.committed, record.tenant, record.queue, receipt
            )
    return puts, deletes


def deletion_tombstones(
    pid: int, record: PartitionRecord, stray_holders: Collection[str] = ()
) -> dict[tuple[int, str], Tombstone]:
    """Tombstones for every member of a partition the manager deletes (its queue was), and for
    every node that reports a stray copy of it (a copy a move left behind, kept for want of a
    tombstone): once the queue is gone, no copy of it is needed anywhere."""
    return {
        (pid, node_id): Tombstone(pid, node_id, "partition_deleted", None, record.tenant, record.queue)
        for node_id in sorted({*record.members, *stray_holders})
    }
