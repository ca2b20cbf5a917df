"""Push on the cluster: the change listeners (woken by nodes' ``Notify``, by new leaders in the
map, and by lost node connections), ``StandingReceive`` (demands the partitions' leaders serve
inside their sending commits, :mod:`.standing`) and ``MessageEvents`` (dead-letter moves and
expiries nodes report). A part of :class:`~.cluster_backend.ClusterBackend`, which provides
the attributes below and hands the node connections the ``_notified``, ``_delivered``,
``_events_reported`` and ``_disconnected`` callbacks (docs/cluster.md, section 9)."""

from __future__ import annotations

import asyncio
import logging

from ...attributes import check_receive
from ...backend import ChangeListener, DeliverCallback, EventListener, MessageEvent
from ...errors import PushgateError
from ...types import QueueName, ReceivedMessage, TenantId
from ..protocol.ops import decode_received
from ..protocol.wire import Delivery, Events, Notify
from .message_operations import MessageOperations
from .metadata import ClusterMetadata
from .node_pool import NodePool
from .partition_map import LeaderClaim, PartitionMap
from .routing import prefix_receipt
from .standing import StandingDemands, Target

log = logging.getLogger("pushgate.cluster")


class PushOperations(MessageOperations):
    """On :class:`.MessageOperations`: a delivery nobody claims any more is released (nacked)."""

    metadata: ClusterMetadata
    pool: NodePool | None
    standing: StandingDemands
    _listeners: list[ChangeListener]
    _event_listeners: list[EventListener]
    _releases: set[asyncio.Task[None]]
    _leaders: dict[int, LeaderClaim | None]
    _addresses: dict[str, str]

    def add_listener(self, listener: ChangeListener) -> None:
        self._listeners.append(listener)

    def _notified(self, node_id: str, notify: Notify) -> None:
        self.standing.saw_notify(notify.partition, notify.tenant, notify.queue)
        self._wake(TenantId(notify.tenant), QueueName(notify.queue))

    # Standing receives (the StandingReceive capability; docs/cluster.md, section 9) ----

    def set_demand(
        self,
        tenant: TenantId,
        queue: QueueName,
        max_messages: int,
        visibility_timeout_s: float | None,
        deliver: DeliverCallback,
        in_memory: bool = False,
    ) -> None:
        """Ask the leaders of the queue's partitions to receive up to ``max_messages`` each
        in the commit of the next send there. Only partitions whose leader this gateway is
        connected to are asked (no dialling here: a dispatcher has received from every
        partition before it idles); the others wake it with ``Notify`` as before.

        ``in_memory`` is not honoured: nodes always receive durably for a remote gateway
        (``node_demands.py`` says why); this backend offers no ``InMemoryReceive``.
        """
        check_receive(max_messages, visibility_timeout_s)
        targets: list[Target] = []
        record = self.metadata.cached_queue(tenant, queue)
        pool = self.pool
        if record is not None and pool is not None:
            for part in self.queue_parts.holders(record):
                leader = part.leader
                client = pool.get(leader.node) if leader is not None else None
                if leader is not None and client is not None and client.address == leader.address:
                    targets.append(Target(part.id, leader.epoch, client))
        self.standing.register(tenant, queue, max_messages, visibility_timeout_s, deliver, targets)

    def clear_demand(self, tenant: TenantId, queue: QueueName, deliver: DeliverCallback) -> None:
        self.standing.withdraw(tenant, queue, deliver)

    def _delivered(self, node_id: str, delivery: Delivery) -> None:
        tenant, queue = TenantId(delivery.tenant), QueueName(delivery.queue)
        try:
            messages = [decode_received(m) for m in delivery.messages]
        except (TypeError, ValueError) as exc:
            log.warning("malformed delivery from node %s: %s", node_id, exc)
            self._wake(tenant, queue)  # its messages come back after their visibility timeout
            return
        for message in messages:
            message.receipt = prefix_receipt(delivery.partition, message.receipt)
        registration = self.standing.delivered(delivery)
        if registration is None:
            self._wake(tenant, queue)  # nobody asked for these any more: released, look again
            self._release(tenant, queue, messages)
            return
        # One commit, one signal: the node sent this gateway no Notify for the commit that
        # served the demand. A short delivery took everything the partition had visible, so
        # it is the commit's only news here (as on the embedded store); after a full one more
        # may be visible, and the listeners are woken for whoever looks next.
        if len(messages) >= registration.max_messages:
            self._wake(tenant, queue)
        try:
            registration.deliver(messages)
        except Exception:
            log.exception("standing receive callback failed")
            return
        if self.standing.look_again(registration, delivery.partition, len(messages)):
            self._wake(tenant, queue)

    # Message events (the MessageEvents capability; docs/cluster.md, section 9) ----------

    def add_event_listener(self, listener: EventListener) -> None:
        """Dead-letter moves and expiries that nodes report to this gateway: each partition's
        leader reports a queue's events to the gateway connection that last received from
        it there (``node_events.py``), so gateways count each once between them."""
        self._event_listeners.append(listener)

    def _events_reported(self, node_id: str, report: Events) -> None:
        events = [
            MessageEvent(TenantId(tenant), QueueName(queue), kind, count)
            for tenant, queue, kind, count in report.events
        ]
        for listener in list(self._event_listeners):
            try:
                listener(events)
            except Exception:
                log.exception("event listener failed")

    def _disconnected(self, node_id: str) -> None:
        # The node forgot this connection's demands (and anything it was pushing into it
        # comes back after its visibility timeout): wake their dispatchers now, so they
        # receive (dialling again) and register anew, rather than at their safety poll.
        if self.pool is None:
            return  # closing
        for tenant, queue in self.standing.sent_to(node_id):
            self._wake(tenant, queue)

    def _release(self, tenant: TenantId, queue: QueueName, messages: list[ReceivedMessage]) -> None:
        async def release() -> None:
            try:
                await self.nack(tenant, [m.receipt for m in messages], 0, queue)
            except PushgateError as exc:
                log.info("releasing %d unclaimed message(s) of %s failed: %s", len(messages), queue, exc.code)

        task = asyncio.create_task(release(), name=f"release {queue}")
        self._releases.add(task)
        task.add_done_callback(self._releases.discard)

    def _wake(self, tenant: TenantId, queue: QueueName) -> None:
        for listener in list(self._listeners):
            try:
                listener(tenant, queue)
            except Exception:  # one listener's bug must not keep the others from waking
                log.exception("change listener failed")

    def _map_changed(self, new_map: PartitionMap) -> None:
        # A new leader may hold messages nobody told us about (it committed them while we
        # were connected to the old one, or we hold no connection to it yet, so no Notify):
        # wake every queue a partition of which has a new leader. Nodes republish their
        # positions often; those changes wake nothing.
        self._addresses.update((n.id, n.address) for n in new_map.nodes.values())
        old, self._leaders = self._leaders, {pid: p.leader for pid, p in new_map.partitions.items()}
        woken: set[tuple[TenantId, QueueName]] = set()
        for pid, part in new_map.partitions.items():
            if part.leader is not None and old.get(pid) != part.leader:
                if part.pool is None:
                    woken.add((part.tenant, part.queue))
                else:  # a pool partition: each queue placed there (the metadata's index)
                    woken.update(self.metadata.index.on_partition(pid))
        for tenant, queue in sorted(woken):
            self._wake(tenant, queue)
