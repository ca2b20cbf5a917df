"""Standing receives on a backend node, for the gateways connected to it.

A gateway's idle push dispatcher sends a :class:`~.wire.Demand` to the leader of each
partition of its queue. The node registers it on that partition's store
(:meth:`LmdbBackend.set_demand <backend_store.lmdb_store.engine.LmdbBackend.set_demand>`), so
the next commit that makes messages of the queue visible (a send, a nack) also receives them
for it, inside that same commit: it is one log entry, replicated like any write. Once that
entry is replicated (``sync``: on a majority) the node pushes the messages to the gateway's
connection as a :class:`~.wire.Delivery`. Send-to-push then costs one replicated commit and
no round trip, where a ``Notify`` followed by a ``receive`` request costs two of each.

Rules kept here:

- **One demand per queue per partition.** A partition's store holds one demand per queue,
  so a later registration (another gateway's, or a newer one of the same gateway) replaces
  the earlier; a gateway whose demand was replaced is woken by ``Notify`` and receives with
  a request, as before.
- **The delivery is the wake-up.** The commit that served a connection's demand sends that
  connection no ``Notify`` for the queue: the ``Delivery`` (sent after replication) wakes it,
  so its dispatcher does not wake early and send a receive of its own. Wake-ups of later
  commits for the same queue and connection wait behind a delivery not sent yet, so a
  gateway never reads "nothing more was there" after hearing "more is there".
- **Soft state.** Demands are never answered. A demand for a partition this node does not
  lead at the gateway's epoch is ignored; a connection's demands go when it closes; a
  demand left on a store that stopped leading is never served (followers write nothing of
  their own). Messages received for a connection that is gone, or whose commit could not
  be replicated (the leader was deposed, no majority in time), are not pushed: they are
  visible again after their visibility timeout (at-least-once). The failed case sends a
  ``Notify`` instead, so the gateway looks again.
- **Never held in memory.** Demands always receive durably (``in_memory=False``): a hold
  lives in the leader's memory only, outside the log, so after a failover the new leader
  would hand the message out again, and the receive it saves costs nothing here anyway
  (it rides in the send's commit).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from ...backend import DeliverCallback, StandingReceive
from ...errors import PushgateError
from ...types import Lsn, QueueName, ReceivedMessage, TenantId
from ..protocol.connection import ConnectionClosedError
from ..protocol.ops import encode_received
from ..protocol.stream import NodeStream
from ..protocol.wire import Demand, Withdraw
from .hosted_store import HostedStore

if TYPE_CHECKING:
    from .partition_host import PartitionHost

log = logging.getLogger("pushgate.cluster")


@runtime_checkable
class DemandStore(HostedStore, StandingReceive, Protocol):
    """A replica's store that takes standing receives (the LMDB store; a store without them,
    the simulation's, leaves its gateways to the leader's ``Notify``)."""

    def demand_waiting(self, tenant: TenantId, queue: QueueName, deliver: DeliverCallback) -> bool: ...


# (partition, tenant, queue): what one store demand is registered for.
_QueueKey = tuple[int, str, str]
# A connection's deliveries and wake-ups for one partition's queue, kept in order.
_OutboxKey = tuple[NodeStream, int, str, str]


@dataclass(eq=False, slots=True)
class _Registered:
    stream: NodeStream
    demand: Demand
    store: DemandStore
    # What the store was given (compared by identity when withdrawn).
    callback: Callable[[list[ReceivedMessage]], None] | None = None
    consumed: bool = False

    @property
    def key(self) -> _QueueKey:
        return (self.demand.partition, self.demand.tenant, self.demand.queue)

    @property
    def outbox_key(self) -> _OutboxKey:
        return (self.stream, *self.key)


@dataclass(slots=True)
class _Outbox:
    """Served demands of one connection and queue whose delivery is not sent yet."""

    waiting: int = 0
    tail: asyncio.Task[None] | None = None
    # A later commit's wake-up, held until the deliveries before it are sent.
    wake_after: bool = False


class NodeDemands:
    """The standing receives gateways registered on this node's partition stores."""

    def __init__(self, hosts: Mapping[int, PartitionHost], *, timeout_s: float = 5.0) -> None:
        self._hosts = hosts
        self._timeout_s = timeout_s
        self._by_queue: dict[_QueueKey, _Registered] = {}
        self._by_stream: dict[NodeStream, dict[tuple[int, int], _Registered]] = {}
        self._outboxes: dict[_OutboxKey, _Outbox] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        # Counted for tests and benchmarks: demands registered, deliveries sent.
        self.registered = 0
        self.delivered = 0

    # Frames from gateways ----------------------------------------------------------------

    def handle(self, stream: NodeStream, message: Demand | Withdraw) -> None:
        if isinstance(message, Withdraw):
            found = self._by_stream.get(stream, {}).get((message.id, message.partition))
            if found is not None:
                self._drop(found)
            return
        host = self._hosts.get(message.partition)
        leader = host.leader if host is not None else None
        if host is None or leader is None or leader.deposed.is_set() or host.handing_over_to is not None:
            return  # not ours to serve: the gateway is woken by the leader's Notify instead
        if message.epoch and message.epoch != leader.epoch:
            return
        store = host.store
        if not isinstance(store, DemandStore):
            return  # the leader's Notify wakes the gateway instead
        registered = _Registered(stream, message, store)
        registered.callback = functools.partial(self._served, registered)
        try:
            # Never in memory: see the module docstring.
            store.set_demand(
                TenantId(message.tenant),
                QueueName(message.queue),
                message.max_messages,
                message.visibility_timeout_s,
                registered.callback,
                in_memory=False,
            )
        except PushgateError as exc:
            log.debug("demand on partition %d refused: %s", message.partition, exc.detail)
            return
        replaced = self._by_queue.get(registered.key)
        if replaced is not None:
            self._forget(replaced)  # the store holds one demand per queue: ours replaced it
        previous = self._by_stream.get(stream, {}).get((message.id, message.partition))
        if previous is not None:
            self._drop(previous)
        self._by_queue[registered.key] = registered
        self._by_stream.setdefault(stream, {})[(message.id, message.partition)] = registered
        self.registered += 1

    def waiting(self, partition: int, tenant: str, queue: str) -> bool:
        """Whether a gateway's demand for the queue is registered on the partition now."""
        registered = self._by_queue.get((partition, tenant, queue))
        return registered is not None and not registered.consumed

    def forget(self, stream: NodeStream) -> None:
        """The connection closed: withdraw its demands."""
        for registered in list(self._by_stream.pop(stream, {}).values()):
            self._drop(registered)

    # Wake-ups ------------------------------------------------------------------------------

    def hold_notify(self, stream: NodeStream, partition: int, tenant: str, queue: str) -> bool:
        """Called for each connection before a commit's ``Notify`` goes out; True: do not send
        it now (a delivery to this connection wakes it, or must go first)."""
        registered = self._by_queue.get((partition, tenant, queue))
        if registered is not None and registered.stream is stream and not registered.consumed:
            host = self._hosts.get(partition)
            served = (
                host is not None
                and host.follower is not None
                and host.store is registered.store
                and registered.callback is not None
                and not registered.store.demand_waiting(
                    TenantId(tenant), QueueName(queue), registered.callback
                )
            )
            if served:
                # This commit received for it (its delivery callback runs next, on this loop).
                self._consume(registered)
                return True
        outbox = self._outboxes.get((stream, partition, tenant, queue))
        if outbox is not None:
            outbox.wake_after = True
            return True
        return False

    # Deliveries --------------------------------------------------------------------------

    def _served(self, registered: _Registered, messages: list[ReceivedMessage]) -> None:
        """The store's callback, on the loop, right after the commit that received ``messages``."""
        self._consume(registered)
        key = registered.outbox_key
        outbox = self._outboxes.setdefault(key, _Outbox())
        host = self._hosts.get(registered.demand.partition)
        previous = outbox.tail
        task = asyncio.create_task(
            self._deliver(registered, messages, host, registered.store.last_lsn, previous),
            name=f"delivery p{registered.demand.partition}",
        )
        outbox.tail = task
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _deliver(
        self,
        registered: _Registered,
        messages: list[ReceivedMessage],
        host: PartitionHost | None,
        lsn: Lsn,
        previous: asyncio.Task[None] | None,
    ) -> None:
        demand, stream = registered.demand, registered.stream
        replicated = False
        try:
            leader = host.leader if host is not None else None
            if (
                leader is not None
                and host is not None
                and host.follower is not None
                and host.store is registered.store
            ):
                try:
                    # The receive is in the commit of ``lsn`` (or before it): push only what
                    # the partition promises to keep, as a receive request's reply would.
                    await leader.replicate(lsn, self._timeout_s)
                    replicated = True
                except PushgateError as exc:
                    log.info(
                        "partition %d: delivery for demand %d not replicated (%s); its messages"
                        " return after their visibility timeout",
                        demand.partition,
                        demand.id,
                        exc.code,
                    )
            if previous is not None:
                await asyncio.wait([previous])
            outbox = self._outboxes.get(registered.outbox_key)
            last = outbox is not None and outbox.waiting <= 1
            conn = stream.connection
            try:
                if replicated:
                    conn.deliver(
                        demand.id,
                        demand.partition,
                        demand.tenant,
                        demand.queue,
                        [encode_received(m) for m in messages],
                    )
                    self.delivered += 1
                if not replicated or (last and outbox is not None and outbox.wake_after):
                    conn.notify(demand.partition, demand.tenant, demand.queue)
                stream.flush_soon()
            except ConnectionClosedError:
                pass  # gone: the messages come back after their visibility timeout
        finally:
            outbox = self._outboxes.get(registered.outbox_key)
            if outbox is not None:
                outbox.waiting -= 1
                if outbox.waiting <= 0:
                    del self._outboxes[registered.outbox_key]

    # Internals ---------------------------------------------------------------------------

    def _consume(self, registered: _Registered) -> None:
        """The store handed the demand out: it is no longer registered; a delivery is due."""
        if registered.consumed:
            return
        registered.consumed = True
        self._forget(registered)
        self._outboxes.setdefault(registered.outbox_key, _Outbox()).waiting += 1

    def _drop(self, registered: _Registered) -> None:
        """Withdraw a demand from its store (if it is still waiting there) and forget it."""
        if not registered.consumed and registered.callback is not None:
            registered.store.clear_demand(
                TenantId(registered.demand.tenant), QueueName(registered.demand.queue), registered.callback
            )
        self._forget(registered)

    def _forget(self, registered: _Registered) -> None:
        if self._by_queue.get(registered.key) is registered:
            del self._by_queue[registered.key]
        mine = self._by_stream.get(registered.stream)
        ident = (registered.demand.id, registered.demand.partition)
        if mine is not None and mine.get(ident) is registered:
            del mine[ident]
            if not mine:
                del self._by_stream[registered.stream]

    async def close(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
