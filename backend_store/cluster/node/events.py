"""Message events on a backend node: which gateway reports a partition's dead-letter moves
and expiries.

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
        self._receivers: dict[tuple[int, str, str], NodeStream] = {}
        self._senders: dict[tuple[int, str, str], NodeStream] = {}  # asked when nobody received
        self._listening: weakref.WeakSet[HostedStore] = weakref.WeakSet()  # stores our listener is on

    def received(self, stream: NodeStream, partition: int, tenant: object, queue: object) -> None:
        """A gateway received (or registered a demand) on ``partition``'s ``tenant``/``queue``."""
        self._note(self._receivers, stream, partition, tenant, queue)

    def sent(self, stream: NodeStream, partition: int, tenant: object, queue: object) -> None:
        """A gateway sent to ``partition``'s ``tenant``/``queue`` (reports when nobody received)."""
        self._note(self._senders, stream, partition, tenant, queue)

    def _note(
        self,
        streams: dict[tuple[int, str, str], NodeStream],
        stream: NodeStream,
        partition: int,
        tenant: object,
        queue: object,
    ) -> None:
        if not isinstance(tenant, str) or not isinstance(queue, str):
            return  # a malformed request: the store refuses it anyway
        streams[(partition, tenant, queue)] = stream
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
        for streams in (self._receivers, self._senders):
            for key in [k for k, s in streams.items() if s is stream]:
                del streams[key]

    def forget_queue(self, partition: int, tenant: object, queue: object) -> None:
        """A queue was deleted on ``partition`` (a new one of that name starts with nobody)."""
        if isinstance(tenant, str) and isinstance(queue, str):
            for streams in (self._receivers, self._senders):
                streams.pop((partition, tenant, queue), None)

    def forget_partition(self, partition: int) -> None:
        """``partition`` left this node."""
        for streams in (self._receivers, self._senders):
            for key in [k for k in streams if k[0] == partition]:
                del streams[key]

    def reporter(self, partition: int, tenant: str, queue: str) -> NodeStream | None:
        """The gateway connection that reports this queue's events on ``partition``, if any."""
        key = (partition, tenant, queue)
        return self._receivers.get(key) or self._senders.get(key)

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
