"""The cluster manager (``pushgate manager``): keeps the partition map in etcd true.

Run two or more; they campaign for ``/pushgate/manager`` and one leads, the others stand by
(a standby takes over when the leader's lease expires). The leader watches queues, nodes,
partitions and leader keys and, on every change (and every ``tick_s``), computes the map's
next state (:func:`plan`) and writes it in one transaction fenced on its own epoch, so a
deposed manager's writes are refused by etcd.

What :func:`plan` does, per queue with ``partitions: P`` (default 1) and
``replication_factor: R`` (default 1):

- allocates the missing partitions ``index 0..P-1`` (ids from ``counters/partition``), each
  on the R least-loaded live ``up`` nodes (fewer if fewer exist; grown later), the first
  one designated leader;
- when a partition's leader key is gone and its designated leader's node is gone too (or
  that leader published that it resigned for lack of a quorum: check-quorum, :mod:`.quorum`),
  promotes the live replica with the highest ``(last_epoch, lsn)`` among positions its
  replicas published after they saw the key vanish (they republish at once), once those make
  a majority of the replica set (a minority could lack an acknowledged write); a resigned
  leader publishes what it vouches for, not its last entry, and loses ties;
- moves leadership off a draining node to its best follower, then replaces the draining
  replica with another live node;
- deletes the partitions of deleted queues (and those past a lowered P);
- once nothing else is to be done and every replica is live and caught up (:func:`_settled`),
  rebalances one step at a time (:func:`_rebalance`): a replica from the most to the least
  loaded node (a node that joined), then leadership from the node leading the most
  partitions to one of their followers leading the fewest.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import PushgateError
from ..types import Epoch
from .coordinator import Coordinator, CoordinatorUnavailable, PrefixState, Session
from .etcd_tls import EtcdTls
from .layout import (
    Layout,
    NodeRecord,
    PartitionRecord,
    pack,
    parse_ids,
    unpack,
)

log = logging.getLogger("pushgate.cluster")


@dataclass(slots=True)
class ClusterView:
    """What the manager knows from etcd."""

    queues: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    # Each queue record's create_revision (its incarnation: a re-created queue has a new one).
    queue_revisions: dict[tuple[str, str], int] = field(default_factory=dict)
    nodes: dict[str, NodeRecord] = field(default_factory=dict)
    partitions: dict[int, PartitionRecord] = field(default_factory=dict)
    leaders: set[int] = field(default_factory=set)  # partitions whose leader key exists
    drained: set[str] = field(default_factory=set)  # nodes an operator asked to drain
    counter: int = 0


# A follower this many entries behind its leader (or more) is still catching up: no
# rebalancing step starts until it is within this distance.
SETTLED_LAG = 1000


@dataclass(slots=True)
class Plan:
    puts: dict[int, PartitionRecord] = field(default_factory=dict)
    deletes: list[int] = field(default_factory=list)
    counter: int = 0


def _int_attr(attributes: Mapping[str, Any], name: str, default: int) -> int:
    value = attributes.get(name, default)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else default


def plan(view: ClusterView, *, rebalance: bool = True) -> Plan:
    """The map changes that make ``view`` what it should be (pure; tested without etcd)."""
    out = Plan(counter=view.counter)
    up = sorted(n for n, rec in view.nodes.items() if rec.state == "up" and n not in view.drained)
    load: dict[str, int] = {n: 0 for n in up}
    leading: dict[str, int] = {n: 0 for n in up}
    for record in view.partitions.values():
        for n in record.replicas:
            if n in load:
                load[n] += 1
        if record.leader in leading:
            leading[record.leader] += 1
    by_slot = {(r.tenant, r.queue, r.index): pid for pid, r in view.partitions.items() if _current(view, r)}

    def least_loaded(exclude: set[str], count: int) -> list[str]:
        chosen = sorted((n for n in up if n not in exclude), key=lambda n: (load[n], n))[:count]
        for n in chosen:
            load[n] += 1
        return chosen

    for (tenant, queue), attributes in sorted(view.queues.items()):
        partitions = _int_attr(attributes, "partitions", 1)
        factor = _int_attr(attributes, "replication_factor", 1)
        mode = attributes.get("replication_mode", "sync")
        mode = mode if mode in ("sync", "async") else "sync"
        for index in range(partitions):
            pid = by_slot.get((tenant, queue, index))
            if pid is None:
                replicas = least_loaded(set(), factor)
                if not replicas:
                    continue  # no live node yet
                # Leaders spread too: the chosen node leading the fewest partitions leads.
                first = min(replicas, key=lambda n: (leading[n], replicas.index(n)))
                leading[first] += 1
                replicas = [first, *(n for n in replicas if n != first)]
                out.counter += 1
                out.puts[out.counter] = PartitionRecord(
                    tenant,
                    queue,
                    index,
                    tuple(replicas),
                    replicas[0],
                    mode,
                    view.queue_revisions.get((tenant, queue)),
                )
                continue
            record = view.partitions[pid]
            changed = _repair(view, pid, record, factor, mode, least_loaded)
            if changed != record:
                out.puts[pid] = changed
    for pid, record in view.partitions.items():
        found = view.queues.get((record.tenant, record.queue))
        if found is None or record.index >= _int_attr(found, "partitions", 1) or not _current(view, record):
            out.deletes.append(pid)
    if rebalance and not out.puts and not out.deletes and _settled(view):
        out.puts.update(_rebalance(view, load, leading))
    return out


def _settled(view: ClusterView) -> bool:
    """Every partition has a serving leader, the one designated, and every replica is live
    and within :data:`SETTLED_LAG` of it: the previous step (if any) has completed."""
    for pid, record in view.partitions.items():
        leader = view.nodes.get(record.leader or "")
        at = leader.replicas.get(pid) if leader is not None else None
        if pid not in view.leaders or at is None or at.role != "leader":
            return False
        for n in record.replicas:
            node = view.nodes.get(n)
            position = node.replicas.get(pid) if node is not None else None
            if position is None or position.lsn + SETTLED_LAG <= at.lsn:
                return False
    return True


def _rebalance(
    view: ClusterView, load: dict[str, int], leading: dict[str, int]
) -> dict[int, PartitionRecord]:
    """At most one step towards an even spread (counts differing by at most one).

    A replica moves from a node holding at least two more than another to that other (the
    joiner catches up from the log or a snapshot; meanwhile a majority of the others still
    acknowledges), never the leader's own replica. Then leadership moves, by designation,
    to a follower leading at least two fewer partitions: the old leader hands over once its
    successor holds its whole log (:meth:`.PartitionHost.hand_over`)."""
    partitions = sorted(view.partitions.items())
    for high in sorted(load, key=lambda n: (-load[n], n)):
        for pid, record in partitions:
            if high not in record.replicas or record.leader == high:
                continue
            targets = [n for n in load if n not in record.replicas and load[n] <= load[high] - 2]
            if targets:
                low = min(targets, key=lambda n: (load[n], n))
                log.info("partition %d: moving its replica from %s to %s (rebalancing)", pid, high, low)
                return {
                    pid: replace(record, replicas=tuple(low if n == high else n for n in record.replicas))
                }
    for high in sorted(leading, key=lambda n: (-leading[n], n)):
        for pid, record in partitions:
            if record.leader != high:
                continue
            targets = [n for n in record.replicas if n in leading and leading[n] <= leading[high] - 2]
            if targets:
                low = min(targets, key=lambda n: (leading[n], n))
                log.info("partition %d: moving leadership from %s to %s (rebalancing)", pid, high, low)
                return {pid: replace(record, leader=low)}
    return {}


def _current(view: ClusterView, record: PartitionRecord) -> bool:
    """Whether a partition was made for the queue record etcd holds now (not for an earlier
    queue of the same name, deleted and created again before the manager saw it go)."""
    revision = view.queue_revisions.get((record.tenant, record.queue))
    return record.queue_revision is None or revision is None or record.queue_revision == revision


def _repair(
    view: ClusterView,
    pid: int,
    record: PartitionRecord,
    factor: int,
    mode: str,
    least_loaded: Any,
) -> PartitionRecord:
    replicas = list(record.replicas)
    leader = record.leader
    nodes = view.nodes

    def position(n: str) -> tuple[int, int]:
        p = nodes[n].replicas.get(pid) if n in nodes else None
        return (p.last_epoch, p.lsn) if p is not None else (-1, -1)

    def resigned(n: str) -> bool:
        p = nodes[n].replicas.get(pid) if n in nodes else None
        return p is not None and p.role == "resigned"

    live_positioned = [n for n in replicas if n in nodes and pid in nodes[n].replicas]
    # A dead leader (or one that resigned for lack of a quorum): promote the most up-to-date
    # live replica, judged only on positions published after the replica saw the leader's
    # key vanish (leader_epoch 0), and only when those make a majority of the replica set:
    # every acknowledged write is on a majority, so such a set holds it. A resigned leader's
    # position is what it vouches for (its unacknowledged tail left out), and on a tie a
    # replica that did not resign wins; if the resigned one is still the most up to date,
    # it stays designated and campaigns again.
    if pid not in view.leaders and (leader is None or leader not in nodes or resigned(leader)):
        fresh = [n for n in live_positioned if nodes[n].replicas[pid].leader_epoch == 0]
        if len(fresh) >= len(replicas) // 2 + 1:
            best = max(fresh, key=lambda n: (position(n), not resigned(n), n))
            if best != leader:
                why = "resigned (no quorum)" if leader is not None and resigned(leader) else "is gone"
                log.warning("partition %d: leader %s %s; promoting %s", pid, leader, why, best)
                leader = best
    # Draining: leadership first (to an up follower that is positioned), then the replica.
    # (An operator may drain a dead node: that is how its replicas are replaced.)
    draining = {n for n in replicas if n in view.drained or (n in nodes and nodes[n].state == "draining")}
    if leader in draining:
        candidates = [n for n in live_positioned if n not in draining]
        if candidates:
            leader = max(candidates, key=lambda n: (position(n), n))
    elif draining and pid in view.leaders:
        for n in sorted(draining):
            spare = least_loaded(set(replicas), 1)
            if spare:
                replicas[replicas.index(n)] = spare[0]
    # Grow a set placed when there were too few nodes.
    if len(replicas) < factor:
        replicas += least_loaded(set(replicas), factor - len(replicas))
    if leader is None and replicas:
        leader = replicas[0]
    return replace(record, replicas=tuple(replicas), leader=leader, mode=mode)


class Manager:
    def __init__(
        self,
        coordinator: Coordinator,
        *,
        manager_id: str | None = None,
        ttl_s: float = 2.0,
        tick_s: float = 0.25,
        layout: Layout | None = None,
        rebalance: bool = True,
    ) -> None:
        self.layout = layout or Layout()
        self.rebalance = rebalance
        self.coordinator = coordinator
        self.manager_id = manager_id or f"manager-{uuid.uuid4().hex[:8]}"
        self.ttl_s = ttl_s
        self.tick_s = tick_s
        self.view = ClusterView()
        self.epoch: Epoch | None = None  # set while leading
        self.leading = asyncio.Event()
        self._changed = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._seen: set[str] = set()

    async def start(self) -> None:
        for prefix, handler in (
            (self.layout.queues, self._on_queues),
            (self.layout.nodes, self._on_nodes),
            (self.layout.partitions, self._on_partitions),
            (self.layout.leaders, self._on_leaders),
            (self.layout.drain, self._on_drain),
        ):
            self._tasks.append(asyncio.create_task(self._watch(prefix, handler), name=f"watch {prefix}"))
        self._tasks.append(asyncio.create_task(self._run(), name=self.manager_id))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks)

    async def _watch(self, prefix: str, handler: Any) -> None:
        while True:
            try:
                async for state in self.coordinator.watch_prefix(prefix, reread_every_s=2.0):
                    handler(state)
                    self._seen.add(prefix)
                    self._changed.set()
            except (CoordinatorUnavailable, PushgateError) as exc:
                log.warning("watch on %s failed: %s", prefix, exc)
                await asyncio.sleep(0.5)
            except Exception:
                log.exception("watch on %s failed", prefix)
                await asyncio.sleep(0.5)

    def _on_queues(self, state: PrefixState) -> None:
        out: dict[tuple[str, str], dict[str, Any]] = {}
        revisions: dict[tuple[str, str], int] = {}
        for key, entry in state.entries.items():
            tenant, _, queue = key[len(state.prefix) :].partition("/")
            with contextlib.suppress(PushgateError):
                attributes = unpack(entry.value)
                if isinstance(attributes, dict):
                    out[(tenant, queue)] = attributes
                    revisions[(tenant, queue)] = entry.create_revision
        self.view.queues = out
        self.view.queue_revisions = revisions

    def _on_nodes(self, state: PrefixState) -> None:
        out: dict[str, NodeRecord] = {}
        for node_id, value in state.values().items():
            with contextlib.suppress(PushgateError):
                out[node_id] = NodeRecord.unpack(value)
        self.view.nodes = out

    def _on_partitions(self, state: PrefixState) -> None:
        out: dict[int, PartitionRecord] = {}
        for pid, value in parse_ids(state.values()).items():
            with contextlib.suppress(PushgateError):
                out[pid] = PartitionRecord.unpack(value)
        self.view.partitions = out

    def _on_leaders(self, state: PrefixState) -> None:
        self.view.leaders = set(parse_ids(state.values()))

    def _on_drain(self, state: PrefixState) -> None:
        self.view.drained = set(state.values())

    async def _run(self) -> None:
        while True:
            try:
                session = await self.coordinator.open_session(self.ttl_s)
            except CoordinatorUnavailable:
                await asyncio.sleep(0.5)
                continue
            try:
                await self._campaign(session)
                await self._lead(session)
            except CoordinatorUnavailable as exc:
                log.warning("%s: etcd unavailable: %s", self.manager_id, exc)
            except Exception:  # a bug: log it, give up the lead, campaign again
                log.exception("%s: planning failed", self.manager_id)
                await asyncio.sleep(self.tick_s)
            finally:
                self.epoch = None
                self.leading.clear()
                with contextlib.suppress(CoordinatorUnavailable):
                    await session.close()

    async def _campaign(self, session: Session) -> None:
        while session.valid():
            claim = await self.coordinator.campaign(session, self.layout.manager, self.manager_id.encode())
            if claim.won:
                self.epoch = claim.epoch
                self.leading.set()
                log.warning("%s: leading the cluster at epoch %d", self.manager_id, claim.epoch)
                return
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.tick_s * 2):
                    await session.lost.wait()

    async def _lead(self, session: Session) -> None:
        epoch = self.epoch
        assert epoch is not None
        while session.valid():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.tick_s):
                    await self._changed.wait()
            self._changed.clear()
            if len(self._seen) < 5 or not session.valid():
                continue  # never plan on a partial picture
            counter = await self.coordinator.get(self.layout.partition_counter)
            self.view.counter = int(unpack(counter.value)) if counter is not None else 0
            change = plan(self.view, rebalance=self.rebalance)
            if not change.puts and not change.deletes:
                continue
            layout = self.layout
            puts = {layout.partition(pid): rec.pack() for pid, rec in change.puts.items()}
            if change.counter != self.view.counter:
                puts[layout.partition_counter] = pack(change.counter)
            ok = await self.coordinator.fenced_commit(
                layout.manager, epoch, puts, [layout.partition(pid) for pid in change.deletes]
            )
            if not ok:
                log.warning("%s: fenced out (epoch %d is no longer the manager's)", self.manager_id, epoch)
                return
            # Our own write: apply it to the view now, so the next tick does not repeat it.
            self.view.partitions.update(change.puts)
            for pid in change.deletes:
                self.view.partitions.pop(pid, None)


async def set_drain(
    etcd: str, node_id: str, *, drain: bool, prefix: str | None = None, etcd_tls: EtcdTls | None = None
) -> None:
    """Ask the managers to move every replica off ``node_id`` (or stop asking)."""
    from .etcd_coordinator import EtcdCoordinator

    layout = Layout(prefix) if prefix else Layout()
    async with EtcdCoordinator(etcd, tls=etcd_tls) as coordinator:
        if drain:
            await coordinator.put(layout.drain + node_id, b"")
        else:
            key = layout.drain + node_id
            entry = await coordinator.get(key)
            if entry is not None:  # a delete fenced on the key itself (the interface has no plain delete)
                await coordinator.fenced_commit(key, Epoch(entry.create_revision), {}, [key])


async def run_manager(
    etcd: str,
    *,
    manager_id: str | None = None,
    ttl_s: float = 2.0,
    prefix: str | None = None,
    rebalance: bool = True,
    etcd_tls: EtcdTls | None = None,
) -> None:
    """``pushgate manager``: run until cancelled."""
    from .etcd_coordinator import EtcdCoordinator

    coordinator = await EtcdCoordinator(etcd, tls=etcd_tls).connect()
    manager = Manager(
        coordinator,
        manager_id=manager_id,
        ttl_s=ttl_s,
        layout=Layout(prefix) if prefix else None,
        rebalance=rebalance,
    )
    await manager.start()
    print(f"pushgate manager {manager.manager_id} started", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await manager.stop()
        await coordinator.close()
