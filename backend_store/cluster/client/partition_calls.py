"""Requests to a partition's leader, following it through moves and failovers.

One loop for every request the cluster backend makes to a node (docs/cluster.md, "The
gateway on the cluster"): find the partition's leader in the watched map, ask it, and on
``not_leader`` / ``stale_epoch`` re-read the map and try again; wait for a partition that has
no leader (up to the request deadline), and give up at once on one that will never have one
(its queue was deleted). A failure that leaves the outcome unknown (a timeout, a lost
connection, a node's "not now") is retried only when the caller says that is safe.

Failover in the lease, not in the freeze (docs/cluster.md, "The gateway on the cluster"):

- A request held at a leader that the watched map then shows replaced (a newer epoch: the
  old one was frozen, or cut off, past its lease) is given up at once rather than at its
  timeout: sent again to the new leader when that is safe (reads, deduplicated sends),
  failed as ``unavailable`` (outcome unknown) otherwise, so the sends queued behind it go.
- ``not_leader`` and ``stale_epoch`` name the leader the node knows (its address and epoch):
  when that is newer than the map's, the request goes there at once, before the watch says.
- A leader the map shows that answers ``not_leader`` without naming a newer one is mostly
  one still starting its term (its key is in etcd; its first entry is not committed yet),
  or one that has not applied the queue asked about: etcd is asked once whether that queue
  still exists (a gateway whose watched copy still holds a queue another gateway deleted
  answered 503 at the deadline, 10 s later; now ``queue_not_found`` at once). Otherwise
  no map change will come to end the wait, so it is asked again after 25 ms, doubling up to
  0.5 s (the wait ends at once when the map does move). A fixed 0.5 s wait cost a failover
  0.4-0.65 s after the new leader could serve (session 33, measured with a traced client).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any, Protocol

from ...errors import PushgateError, QueueNotFound, StaleEpoch, Unavailable
from ...types import Epoch, QueueName, TenantId
from ..coordination.coordinator import CoordinatorUnavailable
from ..protocol.address import NodeUnreachable
from ..protocol.ops import NotLeader
from .metadata import QueueRecord
from .node_health import NodeHealth
from .node_pool import NoAnswer, NodeClient
from .partition_map import ClusterView, LeaderClaim, PartitionInfo, PartitionMap


class NodeClients(Protocol):
    """Where the calls get a node's client (``NodePool``; the simulation's network)."""

    def client(self, node_id: str, address: str) -> NodeClient: ...


class QueueRecords(Protocol):
    """Where the calls read a queue's record, afresh or from the watched copy
    (``ClusterMetadata``)."""

    def queue(self, tenant: TenantId, name: QueueName) -> Awaitable[QueueRecord]: ...

    def cached_queue(self, tenant: TenantId, name: QueueName) -> QueueRecord | None: ...


# Between retries of a partition that answered "not now".
_RETRY_PAUSE_S = 0.05
# After ``not_leader`` from the map's leader: the first wait for the map to move (or the
# leader to be ready), doubled on each answer like it up to the most.
_NOT_LEADER_FIRST_WAIT_S = 0.025
_NOT_LEADER_MOST_WAIT_S = 0.5
# While a partition is not in the map: how often to check that its queue still exists.
_PLACEMENT_CHECK_S = 1.0


class PartitionCalls:
    """Calls to partition leaders through one gateway's node connections."""

    def __init__(
        self,
        view: ClusterView,
        metadata: QueueRecords,
        health: NodeHealth,
        *,
        deadline_s: float,
        node_timeout_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.view = view
        self.metadata = metadata
        self.health = health
        self.deadline_s = deadline_s
        self.node_timeout_s = node_timeout_s
        self._clock = clock
        # Set while the backend runs; cleared first on close, so a request racing it ends.
        self.pool: NodeClients | None = None
        # Requests waiting on a leader's answer: partition -> {task: the epoch asked}. A map
        # showing a newer epoch gives them up (``_leader_replaced``).
        self._held: dict[int, dict[asyncio.Task[Any], Epoch]] = {}
        self._given_up: set[asyncio.Task[Any]] = set()
        view.add_listener(self._leader_replaced)

    def _leader_replaced(self, current: PartitionMap) -> None:
        """Give up the requests held at a leader the map shows replaced (the watch's callback)."""
        for pid, held in list(self._held.items()):
            part = current.partitions.get(pid)
            if part is None or part.leader is None:
                continue  # no new leader yet: a request may still be answered
            for task, epoch in list(held.items()):
                if part.leader.epoch > epoch:
                    del held[task]
                    self._given_up.add(task)
                    task.cancel()
            if not held:
                del self._held[pid]

    def _hinted(self, exc: PushgateError, asked: LeaderClaim) -> LeaderClaim | None:
        """The leader a ``not_leader``/``stale_epoch`` answer names, if newer than ``asked``
        and a node the map knows (by its address)."""
        epoch = getattr(exc, "epoch", 0)
        address = getattr(exc, "leader", None)
        if not address or epoch <= asked.epoch:
            return None
        for node in self.view.map.nodes.values():
            if node.address == address:
                return LeaderClaim(node.id, address, Epoch(epoch))
        return None

    def current(self, part: PartitionInfo) -> PartitionInfo | None:
        """The partition as the newest map has it (its leader may have moved)."""
        return self.view.map.resolve(part)

    async def _check_still_placed(self, part: PartitionInfo) -> None:
        """Raise if ``part`` (not in the map: not placed yet, or dropped) will never have a
        leader: its queue was deleted (``QueueNotFound``, as for a queue deleted before the
        request), or deleted and created again (its partitions are new ones), or the index is
        past a lowered partition count. Returns if the queue is the same incarnation and has
        that index (the manager has yet to place it: wait for it)."""
        record = await self.metadata.queue(part.tenant, part.queue)
        if part.queue_revision is not None and record.create_revision != part.queue_revision:
            raise QueueNotFound(f"queue {part.queue!r} was deleted")
        if part.index >= record.attributes.partitions:
            raise Unavailable(f"partition {part.index} of {part.queue!r} was dropped; retry")

    async def call(
        self,
        part: PartitionInfo,
        op: str,
        *,
        retry_unknown: bool = False,
        since: float | None = None,
        **kwargs: Any,
    ) -> Any:
        """Run ``op`` on the partition's leader, following it through moves and failovers.

        ``retry_unknown``: also retry after a failure that leaves the outcome unknown (the
        request may have been applied): only for reads and deduplicated sends. ``since``:
        the time on the calls' clock (``time.monotonic()`` unless one was given) the
        request's deadline counts from (a send that waited in the send batcher); None: now.
        """
        now = self._clock()
        deadline = (now if since is None else since) + self.deadline_s
        if deadline <= now:
            # Nothing was sent: safe for any request.
            raise Unavailable(f"the request waited out its deadline before it went to {part.queue!r}; retry")
        last: PushgateError = Unavailable(f"no leader for partition {part.index} of {part.queue!r}")
        hinted: LeaderClaim | None = None  # a newer leader a node named than the map has
        not_leader_wait = _NOT_LEADER_FIRST_WAIT_S
        queue_checked = False  # etcd asked once whether the queue still exists
        while True:
            remaining = deadline - self._clock()
            if remaining <= 0:
                raise last
            pool = self.pool
            if pool is None:  # not started, or closed while this request waited
                raise Unavailable("the cluster backend is not running")
            current = self.current(part)
            if current is not None and hinted is not None:
                if current.leader is None or current.leader.epoch < hinted.epoch:
                    current = replace(current, leader=hinted)
                hinted = None
            if current is None or current.leader is None:
                condition = _has_leader_or_gone
                if current is None:
                    # Not placed yet, or placed once and gone from the map now (the manager
                    # dropped it, mostly because its queue was deleted): raise at once if it
                    # will not come, rather than wait out the deadline for a leader.
                    await self._check_still_placed(part)
                    condition = _has_leader
                # In slices: a queue deleted while we wait is seen within one.
                await self.view.wait_for(
                    functools.partial(condition, part=part), min(remaining, _PLACEMENT_CHECK_S)
                )
                continue
            leader = current.leader
            assert leader is not None
            breaker = self.health.breaker(leader.node)
            try:
                trial = breaker.before_request(leader.node, leader.epoch)
            except Unavailable as exc:
                last = exc
                # Wait for the map to move the leader away from the failing node, or for the
                # node's next verdict (a trial under way may succeed at once).
                await self._until_moved_or_verdict(
                    current, breaker.verdict(), min(remaining, exc.retry_after_s)
                )
                continue
            client = pool.client(leader.node, leader.address)
            task = asyncio.current_task()
            assert task is not None
            held = self._held.setdefault(current.id, {})
            held[task] = leader.epoch
            try:
                try:
                    result = await client.call_with(
                        op,
                        current.id,
                        leader.epoch,
                        {"tenant": part.tenant, **kwargs},
                        timeout_s=min(remaining, self.node_timeout_s),
                    )
                finally:  # before any other await: only the call itself is given up
                    held.pop(task, None)
                    if not held and self._held.get(current.id) is held:
                        del self._held[current.id]
            except asyncio.CancelledError:
                if trial:
                    breaker.abandon()  # no verdict on the node: another request may be the trial
                if task not in self._given_up:
                    raise
                self._given_up.discard(task)
                if task.uncancel():
                    raise  # cancelled by its caller too
                # The map shows a newer leader: whatever this one does with the request, it
                # can no longer acknowledge it (its lease ran out before the new key).
                last = NoAnswer(
                    f"partition {current.id}: its leader {leader.node} was replaced while it held "
                    "the request; it may have been applied"
                )
                if not retry_unknown:
                    raise last from None
                continue
            except (NotLeader, StaleEpoch) as exc:
                breaker.succeeded()  # the node answered; only our map was stale
                last = Unavailable(f"partition {current.id} is changing leader; retry")
                hinted = self._hinted(exc, leader)
                if hinted is not None:
                    continue  # straight to the leader the node named
                known = self.metadata.cached_queue(part.tenant, _asked(part, kwargs))
                if known is not None and known.placement is not None and "revision" not in kwargs:
                    # Mostly a new queue's first request (a create is a record write) at a
                    # leader whose watch has not brought the record yet: asked again at once,
                    # naming the revision of the record in our watched copy, which the leader
                    # waits for its watch to reach (node_serving.py), where it waited 25 ms
                    # and more for a map that would not change.
                    kwargs = {**kwargs, "revision": known.mod_revision}
                    continue
                if not queue_checked:
                    # Mostly the leader has yet to apply the queue: a new one, or one another
                    # gateway deleted that our watched copy still holds, which would be asked
                    # about until the deadline. etcd tells (once: a read per such call, none
                    # on the common path); ``QueueNotFound`` ends the call. Cut off from
                    # etcd: the leader is asked again, as before.
                    queue_checked = True
                    with contextlib.suppress(CoordinatorUnavailable):
                        await self.metadata.queue(part.tenant, _asked(part, kwargs))
                with contextlib.suppress(CoordinatorUnavailable):
                    # Cut off from etcd: the nodes' hints are all we have; ask again below.
                    await self.view.refresh()
                await self.view.wait_for(
                    functools.partial(_leader_moved, part=current), min(remaining, not_leader_wait)
                )
                not_leader_wait = min(2 * not_leader_wait, _NOT_LEADER_MOST_WAIT_S)
                continue
            except QueueNotFound:
                breaker.succeeded()
                # A new leader may not have created the queue in its store yet. The queue
                # asked about, which on a partition feeding a dead-letter queue is that
                # queue, not the partition's own: raises if it is really gone.
                await self.metadata.queue(part.tenant, _asked(part, kwargs))
                last = Unavailable(f"partition {current.id} is not ready yet; retry")
                await asyncio.sleep(min(_RETRY_PAUSE_S, max(0.0, deadline - self._clock())))
                continue
            except NodeUnreachable as exc:
                breaker.failed(leader.epoch)  # not sent: safe to retry whatever it was
                last = exc
                await self.view.wait_for(functools.partial(_leader_moved, part=current), min(remaining, 0.2))
                continue
            except NoAnswer as exc:
                breaker.failed(leader.epoch)
                if not retry_unknown:
                    raise
                last = exc
                await self.view.wait_for(functools.partial(_leader_moved, part=current), min(remaining, 0.2))
                continue
            except Unavailable as exc:
                # The node answered "not now" (not ready yet, no replication majority in
                # time): it is alive, and the request may or may not have been applied.
                breaker.succeeded()
                if not retry_unknown:
                    raise
                last = exc
                await asyncio.sleep(min(_RETRY_PAUSE_S, max(0.0, deadline - self._clock())))
                continue
            except PushgateError:
                breaker.succeeded()
                raise
            breaker.succeeded()
            return result

    async def _until_moved_or_verdict(
        self, part: PartitionInfo, verdict: asyncio.Event, timeout_s: float
    ) -> None:
        moved = asyncio.ensure_future(
            self.view.wait_for(functools.partial(_leader_moved, part=part), timeout_s)
        )
        heard = asyncio.ensure_future(verdict.wait())
        try:
            await asyncio.wait((moved, heard), return_when=asyncio.FIRST_COMPLETED)
        finally:
            moved.cancel()
            heard.cancel()


def _asked(part: PartitionInfo, kwargs: dict[str, Any]) -> QueueName:
    """The queue a request asks about, which on a partition feeding a dead-letter queue is
    that queue, not the partition's own."""
    return QueueName(str(kwargs.get("name", kwargs.get("queue", part.queue))))


def _has_leader(current: PartitionMap, part: PartitionInfo) -> bool:
    found = current.resolve(part)
    return found is not None and found.leader is not None


def _has_leader_or_gone(current: PartitionMap, part: PartitionInfo) -> bool:
    """The partition has a leader, or (placed once) it left the map: either ends a wait."""
    found = current.resolve(part)
    if found is None:
        return part.id >= 0
    return found.leader is not None


def _leader_moved(current: PartitionMap, part: PartitionInfo) -> bool:
    found = current.resolve(part)
    return found is None or (found.leader is not None and found.leader != part.leader)
