"""Requests to a partition's leader, following it through moves and failovers.

One loop for every request the cluster backend makes to a node (docs/cluster.md, "The
gateway on the cluster"): find the partition's leader in the watched map, ask it, and on
``not_leader`` / ``stale_epoch`` re-read the map and try again; wait for a partition that has
no leader (up to the request deadline), and give up at once on one that will never have one
(its queue was deleted). A failure that leaves the outcome unknown (a timeout, a lost
connection, a node's "not now") is retried only when the caller says that is safe.
"""

from __future__ import annotations

import asyncio
import functools
import time
from typing import Any

from ..errors import PushgateError, QueueNotFound, StaleEpoch, Unavailable
from ..types import QueueName
from .client import NoAnswer, NodePool, NodeUnreachable
from .metadata import ClusterMetadata
from .node_health import NodeHealth
from .ops import NotLeader
from .partition_map import ClusterView, PartitionInfo, PartitionMap

# Between retries of a partition that answered "not now".
_RETRY_PAUSE_S = 0.05
# While a partition is not in the map: how often to check that its queue still exists.
_PLACEMENT_CHECK_S = 1.0


class PartitionCalls:
    """Calls to partition leaders through one gateway's node connections."""

    def __init__(
        self,
        view: ClusterView,
        metadata: ClusterMetadata,
        health: NodeHealth,
        *,
        deadline_s: float,
        node_timeout_s: float,
    ) -> None:
        self.view = view
        self.metadata = metadata
        self.health = health
        self.deadline_s = deadline_s
        self.node_timeout_s = node_timeout_s
        # Set while the backend runs; cleared first on close, so a request racing it ends.
        self.pool: NodePool | None = None

    def current(self, part: PartitionInfo) -> PartitionInfo | None:
        """The partition as the newest map has it (its leader may have moved)."""
        return self.view.map.partition(part.tenant, part.queue, part.index, part.queue_revision)

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
        the ``time.monotonic()`` the request's deadline counts from (a send that waited in
        the send batcher); None: now.
        """
        now = time.monotonic()
        deadline = (now if since is None else since) + self.deadline_s
        if deadline <= now:
            # Nothing was sent: safe for any request.
            raise Unavailable(f"the request waited out its deadline before it went to {part.queue!r}; retry")
        last: PushgateError = Unavailable(f"no leader for partition {part.index} of {part.queue!r}")
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise last
            pool = self.pool
            if pool is None:  # not started, or closed while this request waited
                raise Unavailable("the cluster backend is not running")
            current = self.current(part)
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
                breaker.before_request(leader.node)
            except Unavailable as exc:
                last = exc
                # Wait for the map to move the leader away from the failing node.
                await self.view.wait_for(
                    functools.partial(_leader_moved, part=current), min(remaining, exc.retry_after_s)
                )
                continue
            client = pool.client(leader.node, leader.address)
            try:
                result = await client.call_with(
                    op,
                    current.id,
                    leader.epoch,
                    {"tenant": part.tenant, **kwargs},
                    timeout_s=min(remaining, self.node_timeout_s),
                )
            except (NotLeader, StaleEpoch):
                breaker.succeeded()  # the node answered; only our map was stale
                last = Unavailable(f"partition {current.id} is changing leader; retry")
                await self.view.refresh()
                await self.view.wait_for(functools.partial(_leader_moved, part=current), min(remaining, 0.5))
                continue
            except QueueNotFound:
                breaker.succeeded()
                # A new leader may not have created the queue in its store yet. The queue
                # asked about, which on a partition feeding a dead-letter queue is that
                # queue, not the partition's own: raises if it is really gone.
                asked = kwargs.get("name", kwargs.get("queue", part.queue))
                await self.metadata.queue(part.tenant, QueueName(str(asked)))
                last = Unavailable(f"partition {current.id} is not ready yet; retry")
                await asyncio.sleep(min(_RETRY_PAUSE_S, max(0.0, deadline - time.monotonic())))
                continue
            except NodeUnreachable as exc:
                breaker.failed()  # not sent: safe to retry whatever it was
                last = exc
                await self.view.wait_for(functools.partial(_leader_moved, part=current), min(remaining, 0.2))
                continue
            except NoAnswer as exc:
                breaker.failed()
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
                await asyncio.sleep(min(_RETRY_PAUSE_S, max(0.0, deadline - time.monotonic())))
                continue
            except PushgateError:
                breaker.succeeded()
                raise
            breaker.succeeded()
            return result


def _has_leader(current: PartitionMap, part: PartitionInfo) -> bool:
    found = current.partition(part.tenant, part.queue, part.index, part.queue_revision)
    return found is not None and found.leader is not None


def _has_leader_or_gone(current: PartitionMap, part: PartitionInfo) -> bool:
    """The partition has a leader, or (placed once) it left the map: either ends a wait."""
    found = current.partition(part.tenant, part.queue, part.index, part.queue_revision)
    if found is None:
        return part.id >= 0
    return found.leader is not None


def _leader_moved(current: PartitionMap, part: PartitionInfo) -> bool:
    found = current.partition(part.tenant, part.queue, part.index, part.queue_revision)
    return found is None or (found.leader is not None and found.leader != part.leader)
