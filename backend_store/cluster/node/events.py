"""Who received from a queue on a backend node: which gateway reports a partition's
dead-letter moves and expiries, and which gateways a commit wakes.

A partition's leader store reports its events after each commit
(:class:`~backend_store.backend.MessageEvents`). Several gateways may be connected to the
node, and the usage and metrics they feed must count each move once between them, so the
node sends each commit's events to **one** gateway connection: the one that last received
from that queue on that partition (a ``receive`` request or a standing demand), which is the
gateway whose receive found a message past ``max_receives`` in the common case, the embedded
store's rule. Expiries found by the leader's sweeper, which no gateway caused, go the same
way. A queue nobody received from over an open connection reports to the connection that last
sent to it there instead: messages expiring in a queue without consumers are the expiries a
user most wants counted. A queue nobody sent to or received from over an open connection
since the node started has nobody to report to, and its events are only logged (at debug
level).

Events go out only from leader stores (followers make no events: they apply the leader's
entries) and only once that store has served a send or receive here (the listener is
attached then).
Counting stays at most once: an event is sent to one connection or to none. What a node
remembers goes with the connection, the queue (deleted) or the partition (gone from the node).

**Wake-ups go to the queue's receivers.** A commit that makes messages of a queue visible
sends ``Notify`` only to the connections that received from that queue on that partition here
(:meth:`NodeEvents.receivers`), not to every gateway connected: a send to an inbox nobody
waits on costs no frame and no wake-up, and with several gateways each send no longer wakes
them all. Nothing is lost by it: whoever waits on a queue received from it first (a long-poll
and a push dispatcher receive before they wait, and receive from every partition of the
queue before they idle; a standing demand names its queue), over the same connection its
wake-up comes back on, and the node registers the receive before it runs it, so a commit
after the receive wakes the waiter and one before it is in what the receive reads. A
gateway that lost its connection, or whose partition got a new leader, is woken by that
(the gateway's ``_disconnected`` and ``_map_changed``) and receives again, which registers
it with the new connection or leader. A connection stays a queue's receiver until it closes
(or the queue or the partition goes): a waiter that stopped costs a wake-up it ignores, as
every waiter did before (bench/README.md, "Session 69").
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from ...backend import MessageEvent, MessageEvents
from ..protocol.connection import ConnectionClosedError
from ..protocol.stream import NodeStream

if TYPE_CHECKING:
    from .hosted_store import HostedStore
    from .partition_host import PartitionHost

log = logging.getLogger("pushgate.cluster")


class NodeEvents:
    def __init__(self, hosts: Mapping[int, PartitionHost]) -> None:
        self._hosts = hosts
        # Each queue's receiving connections, the latest last (a dict: ordered, and replayable
        # in the simulation, where a set's order would be the streams' addresses).
        self._receivers: dict[tuple[int, str, str], dict[NodeStream, None]] = {}
        self._senders: dict[tuple[int, str, str], NodeStream] = {}  # asked when nobody received
        self._listening: weakref.WeakSet[HostedStore] = weakref.WeakSet()  # stores our listener is on

    def received(self, stream: NodeStream, partition: int, tenant: object, queue: object) -> None:
        """A gateway received (or registered a demand) on ``partition``'s ``tenant``/``queue``."""
        if not isinstance(tenant, str) or not isinstance(queue, str):
            return  # a malformed request: the store refuses it anyway
        streams = self._receivers.setdefault((partition, tenant, queue), {})
        streams.pop(stream, None)
        streams[stream] = None
        self._listen(partition)

    def sent(self, stream: NodeStream, partition: int, tenant: object, queue: object) -> None:
        """A gateway sent to ``partition``'s ``tenant``/``queue`` (reports when nobody received)."""
        if not isinstance(tenant, str) or not isinstance(queue, str):
            return
        self._senders[(partition, tenant, queue)] = stream
        self._listen(partition)

    def receivers(self, partition: int, tenant: str, queue: str) -> list[NodeStream]:
        """The connections a commit that made messages of the queue visible wakes."""
        streams = self._receivers.get((partition, tenant, queue))
        return list(streams) if streams else []

    def _listen(self, partition: int) -> None:
        host = self._hosts.get(partition)
        if host is None or host.follower is None:
            return
        store = host.store
        # Membership first: isinstance against a runtime protocol walks the protocol's
        # members, and this runs for every send.
        if store not in self._listening and isinstance(store, MessageEvents):
            self._listening.add(store)
            store.add_event_listener(lambda events: self._committed(partition, events))

    def forget(self, stream: NodeStream) -> None:
        """A gateway connection closed."""
        for key in [k for k, s in self._senders.items() if s is stream]:
            del self._senders[key]
        for key in [k for k, streams in self._receivers.items() if stream in streams]:
            streams = self._receivers[key]
            del streams[stream]
            if not streams:
                del self._receivers[key]

    def forget_queue(self, partition: int, tenant: object, queue: object) -> None:
        """A queue was deleted on ``partition`` (a new one of that name starts with nobody)."""
        if isinstance(tenant, str) and isinstance(queue, str):
            self._receivers.pop((partition, tenant, queue), None)
            self._senders.pop((partition, tenant, queue), None)

    def forget_partition(self, partition: int) -> None:
        """``partition`` left this node."""
        for table in (self._receivers, self._senders):
            for key in [k for k in table if k[0] == partition]:
                del table[key]

    def reporter(self, partition: int, tenant: str, queue: str) -> NodeStream | None:
        """The gateway connection that reports this queue's events on ``partition``, if any:
        the one that received from it last, else the one that sent to it last."""
        key = (partition, tenant, queue)
        receivers = self._receivers.get(key)
        if receivers:
            return next(reversed(receivers))
        return self._senders.get(key)

    def _committed(self, partition: int, events: Sequence[MessageEvent]) -> None:
        host = self._hosts.get(partition)
        if host is None or not host.leading:
            return
        by_stream: dict[NodeStream, list[tuple[str, str, str, int]]] = {}
        for event in events:
            stream = self.reporter(partition, event.tenant, event.queue)
            if stream is None:
                log.debug(
                    "partition %d: %s event of %s has nobody to report to", partition, event.kind, event.queue
                )
                continue
            by_stream.setdefault(stream, []).append((event.tenant, event.queue, event.kind, event.count))
        for stream, batch in by_stream.items():
            try:
                stream.connection.report_events(partition, batch)
                stream.flush_soon()
            except ConnectionClosedError:
                pass  # the gateway is gone; its counts go with it
