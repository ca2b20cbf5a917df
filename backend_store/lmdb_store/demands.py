"""Standing receives on the embedded store (:class:`~backend_store.backend.StandingReceive`).

A push dispatcher with nothing to do registers a demand for its queue; the writer thread
serves it inside the next batch that touched the queue, after the batch's operations and in
its transaction (``GroupCommitWriter``'s ``after_ops``), and the delivery goes to the
dispatcher's event loop once that batch is committed. One commit, one signal: a demand that
took everything the queue had visible is that commit's only news of the queue.
"""

from __future__ import annotations

import asyncio
import functools
from dataclasses import dataclass
from pathlib import Path

from ..attributes import check_receive
from ..backend import DeliverCallback
from ..options import StoreOptions
from ..types import QueueName, TenantId
from .environment import Writes
from .group_commit import PostCommit
from .store_core import StoreCore


@dataclass(frozen=True, slots=True)
class _Demand:
    max_messages: int
    visibility_timeout_s: float | None
    deliver: DeliverCallback
    loop: asyncio.AbstractEventLoop
    in_memory: bool


class StandingDemands(StoreCore):
    """The store's standing receives: registered on the event loop, served by the writer."""

    def __init__(self, path: Path, options: StoreOptions) -> None:
        super().__init__(path, options)
        # Standing receives by (tenant, queue); set and cleared on the event loop, taken by
        # the writer thread (single dict operations, atomic under the GIL).
        self._demands: dict[tuple[str, str], _Demand] = {}

    def set_demand(
        self,
        tenant: TenantId,
        queue: QueueName,
        max_messages: int,
        visibility_timeout_s: float | None,
        deliver: DeliverCallback,
        in_memory: bool = False,
    ) -> None:
        check_receive(max_messages, visibility_timeout_s)
        loop = asyncio.get_running_loop()
        self._demands[(tenant, queue)] = _Demand(
            int(max_messages), visibility_timeout_s, deliver, loop, in_memory
        )

    def clear_demand(self, tenant: TenantId, queue: QueueName, deliver: DeliverCallback) -> None:
        key = (tenant, queue)
        demand = self._demands.get(key)
        if demand is not None and demand.deliver == deliver:
            self._demands.pop(key, None)

    def demand_waiting(self, tenant: TenantId, queue: QueueName, deliver: DeliverCallback) -> bool:
        """Whether the demand registered with ``deliver`` is still waiting (not served, not
        replaced, not withdrawn). Called on the event loop after a commit's wake-up, it tells a
        backend node whether that commit served it (its delivery callback comes next)."""
        demand = self._demands.get((tenant, queue))
        return demand is not None and demand.deliver == deliver

    def _serve_demands(self, w: Writes, now: float) -> list[PostCommit]:
        """In the writer, inside a batch's transaction: receive for demands on touched queues.

        One commit, one signal: a demand that took everything the queue had visible (its
        receive came back short) is the queue's only news of this commit; its delivery is the
        wake-up, and the listeners hear nothing of the queue (a dispatcher, long-poll or
        other gateway woken now would find nothing). A full delivery leaves the queue's
        wake-up in place: more may be visible, for whoever looks."""
        post: list[PostCommit] = []
        for key in list(w.touched):
            demand = self._demands.pop(key, None)
            if demand is None:
                continue
            # A batch that aborts (and is redone) must not lose the demand it took; a newer
            # registration made meanwhile wins.
            w.on_abort.append(functools.partial(self._demands.setdefault, key, demand))
            messages = self._ops.receive(
                w, now, key[0], key[1], demand.max_messages, demand.visibility_timeout_s, demand.in_memory
            )
            if messages:
                post.append((demand.loop, functools.partial(demand.deliver, messages)))
                if len(messages) < demand.max_messages:
                    w.touched.discard(key)
            else:
                self._demands.setdefault(key, demand)  # still waiting
        return post
