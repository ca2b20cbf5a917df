"""What a node serves on its port (:class:`~.ports.NodeListener`): each connection's hello
routes it to a replica's follower (another node's leader link) or to the gateway requests
loop; requests run on the partitions this node leads, answered only while its etcd session
(its claim) is surely alive; ``Notify`` goes to every gateway connection after a commit that
made messages visible, unless a standing receive's ``Delivery`` stands for it (demands.py).
A part of :class:`~.node.Node`, which provides the attributes below."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from ...errors import PushgateError, Unavailable
from ...types import Epoch
from ..coordination.coordinator import Session
from ..coordination.layout import LeaderRecord
from ..coordination.watched_prefix import WatchedPrefix
from ..protocol import ops
from ..protocol.connection import Closed, Connection, ConnectionClosedError, Event
from ..protocol.stream import NodeStream
from ..protocol.wire import Demand, Hello, Request, Withdraw
from . import pool_queues
from .demands import NodeDemands
from .events import NodeEvents
from .node_config import NodeConfig
from .node_identity import NodeIdentity
from .partition_host import PartitionHost
from .ports import NodeListener

log = logging.getLogger("pushgate.cluster")

# The longest a request waits for the queue record it names (``_records_as_of``): the
# watch's whole re-read interval, after which it holds every write made before it began.
RECORD_WAIT_S = 2.0


class NodeServing:
    config: NodeConfig
    node_id: str
    listener: NodeListener
    identity: NodeIdentity
    hosts: dict[int, PartitionHost]
    session: Session | None
    demands: NodeDemands
    events: NodeEvents
    _clients: dict[NodeStream, None]
    _leaders: dict[int, tuple[LeaderRecord, Epoch]]
    _queue_watch: WatchedPrefix | None

    @property
    def address(self) -> str:
        return self.listener.address

    def _notify(self, partition: int, tenant: str, queue: str) -> None:
        for stream in list(self._clients):
            if self.demands.hold_notify(stream, partition, tenant, queue):
                continue  # a delivery to this gateway wakes it (node_demands.py)
            try:
                stream.connection.notify(partition, tenant, queue)
                stream.flush_soon()
            except ConnectionClosedError:
                self._clients.pop(stream, None)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        stream = NodeStream(Connection(self.node_id), reader, writer)
        try:
            await self._route(stream)
        except asyncio.CancelledError:
            # The node is stopping, or the replica the stream served went: end the connection
            # quietly (asyncio logs a connection callback that ends cancelled as an error),
            # even if cancelled again while closing (seen in a random-fault run, session 31:
            # a follower stream of a replica deleted by its tombstone).
            with contextlib.suppress(asyncio.CancelledError):
                await stream.close()

    async def _route(self, stream: NodeStream) -> None:
        events = stream.events()
        try:
            async with asyncio.timeout(10):
                first = await anext(events)
        except (TimeoutError, StopAsyncIteration):
            await stream.close()
            return
        if not isinstance(first, Hello):
            await stream.close()
            return
        if first.partition is not None:
            host = self.hosts.get(first.partition)
            if host is None or host.follower is None:
                await stream.close()  # not (yet) a replica here: the leader dials again
                return
            await host.follower.serve_stream(stream, events)
            return
        await self._serve_client(stream, events)

    async def _serve_client(self, stream: NodeStream, events: AsyncIterator[Event]) -> None:
        self._clients[stream] = None
        # A dict, not a set: cancelled in the order they came (a set's order is the tasks'
        # addresses, and the simulation replays a seed only if it is always the same).
        running: dict[asyncio.Task[None], None] = {}
        try:
            async for event in events:
                if isinstance(event, Request):
                    if event.op == "receive":
                        self.events.received(
                            stream, event.partition, event.args.get("tenant"), event.args.get("queue")
                        )
                    elif event.op == "send":
                        self.events.sent(
                            stream, event.partition, event.args.get("tenant"), event.args.get("queue")
                        )
                    elif event.op == "send_queues":
                        for queue in pool_queues.named(event.args):
                            self.events.sent(stream, event.partition, event.args.get("tenant"), queue)
                    elif event.op == "delete_queue":
                        self.events.forget_queue(
                            event.partition, event.args.get("tenant"), event.args.get("name")
                        )
                    task = asyncio.create_task(self._answer(stream, event))
                    running[task] = None
                    task.add_done_callback(lambda done: running.pop(done, None))
                elif isinstance(event, Demand | Withdraw):
                    if isinstance(event, Demand):
                        self.events.received(stream, event.partition, event.tenant, event.queue)
                    self.demands.handle(stream, event)
                elif isinstance(event, Closed):
                    break
        finally:
            self._clients.pop(stream, None)
            self.demands.forget(stream)
            self.events.forget(stream)
            for task in list(running):
                task.cancel()
            await stream.close()

    async def _answer(self, stream: NodeStream, request: Request) -> None:
        conn = stream.connection
        try:
            result = await self._dispatch(request)
        except PushgateError as exc:
            epoch, leader = self._leader_hint(request.partition)
            if isinstance(exc, ops.NotLeader | ops.StaleLeader):
                epoch = Epoch(max(epoch, exc.epoch))
            if isinstance(exc, ops.StaleLeader):
                leader = self.address  # we lead, at a newer epoch than the sender knows
            with contextlib.suppress(ConnectionClosedError, ValueError):
                conn.error(request.id, exc.code, exc.detail, epoch=epoch, leader=leader)
                stream.flush_soon()
            return
        except Exception as exc:  # a bug: answer it, do not kill the connection
            log.exception("node %s: %s on partition %d failed", self.node_id, request.op, request.partition)
            with contextlib.suppress(ConnectionClosedError, ValueError):
                conn.error(request.id, "internal_error", type(exc).__name__)
                stream.flush_soon()
            return
        with contextlib.suppress(ConnectionClosedError, ValueError):
            conn.reply(request.id, result)
            stream.flush_soon()

    async def _dispatch(self, request: Request) -> Any:
        refusal = self.identity.verdict.refusal
        if refusal is not None:
            raise Unavailable(f"node {self.node_id} serves nothing: {refusal}")
        host = self.hosts.get(request.partition)
        session = self.session
        if host is None or session is None or not session.valid():
            raise ops.NotLeader(f"node {self.node_id} does not lead partition {request.partition}")
        await self._records_as_of(request.args.get("revision"))
        result = await host.handle(
            request.op, request.epoch, request.args, timeout_s=self.config.request_timeout_s
        )
        # A reply is a promise: only while our claim is surely alive (a frozen leader that
        # woke up past its lease must not acknowledge; a successor may already exist).
        if self.session is not session or not session.valid():
            if ops.OPS[request.op].writes:
                # Applied here (and perhaps on a majority): the outcome is unknown, which
                # not_leader would deny.
                raise Unavailable(
                    f"node {self.node_id} lost its etcd session; the write may have been applied"
                )
            raise ops.NotLeader(f"node {self.node_id} lost its etcd session")
        return result

    async def _records_as_of(self, revision: object) -> None:
        """A request naming the etcd revision of the record it needs (a new queue's first
        request asked again after ``not_leader``: ``PartitionCalls.call``; a gateway of an
        earlier release's ``create_queue``) waits until our watch of
        ``queues/`` holds that revision, at most :data:`RECORD_WAIT_S`. That gateway sends
        it once its own watch brought the record, about when ours does: answered
        ``not_leader`` meanwhile, it re-read the partition map and asked again after 25 ms
        and more, for one create in five at 64 creates at a time (issue 49). A watch still
        behind after the wait (etcd went back, or we are cut off) leaves the answer to the
        partition: ``not_leader`` as before, which the gateway retries."""
        watch = self._queue_watch
        if isinstance(revision, int) and revision > 0 and watch is not None:
            await watch.caught_up(revision, RECORD_WAIT_S)

    def _leader_hint(self, partition: int) -> tuple[Epoch, str | None]:
        claim = self._leaders.get(partition)
        if claim is None:
            return Epoch(0), None
        return claim[1], claim[0].address
