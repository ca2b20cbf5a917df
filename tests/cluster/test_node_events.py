"""Message events on ``cluster://``: a partition's dead-letter moves are reported to one
gateway, the one whose receive found them, not to every gateway connected to the node (nor
to the one that sent the messages)."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence

from backend_store.backend import MessageEvent, MessageEvents
from backend_store.cluster.client.cluster_backend import ClusterBackend, open_cluster_backend
from backend_store.cluster.coordination.layout import Layout
from backend_store.cluster.node.node import Node
from backend_store.errors import QueueNotFound
from backend_store.options import StoreOptions
from backend_store.types import NewMessage, QueueName, TenantId
from tests.conftest import scaled

from .placed import queue_partitions

T = TenantId("acme")
SRC, DLQ = QueueName("src"), QueueName("dlq")


class Recorder:
    def __init__(self, backend: ClusterBackend) -> None:
        assert isinstance(backend, MessageEvents)
        self.totals: Counter[tuple[str, str]] = Counter()
        self.changed = asyncio.Event()
        backend.add_event_listener(self)

    def __call__(self, events: Sequence[MessageEvent]) -> None:
        for e in events:
            self.totals[(e.queue, e.kind)] += e.count
        self.changed.set()

    async def wait_for(self, expected: Counter[tuple[str, str]]) -> None:
        async with asyncio.timeout(scaled(10)):
            while self.totals != expected:
                self.changed.clear()
                await self.changed.wait()


async def test_a_dead_letter_move_is_reported_by_the_gateway_whose_receive_found_it(
    inprocess_nodes: tuple[Layout, list[Node]], etcd_endpoints: list[str]
) -> None:
    layout, _ = inprocess_nodes
    url = f"cluster://{','.join(etcd_endpoints)}{layout.prefix}"
    a, b = open_cluster_backend(url, StoreOptions()), open_cluster_backend(url, StoreOptions())
    await a.start()
    await b.start()
    try:
        seen_by_a, seen_by_b = Recorder(a), Recorder(b)
        await a.create_queue(T, DLQ, {"replication_factor": 2})
        await a.create_queue(T, SRC, {"replication_factor": 2, "max_receives": 1, "dead_letter_queue": "dlq"})
        # b sends (so it is connected to the leader too): a receiver comes before a sender.
        await b.send(T, SRC, [NewMessage(b"a"), NewMessage(b"b"), NewMessage(b"c")])
        got = await a.receive(T, SRC, 10, visibility_timeout_s=3600)
        assert len(got) == 3
        await a.nack(T, [m.receipt for m in got[:2]])
        assert await a.receive(T, SRC, 10) == []  # moved, not delivered
        await seen_by_a.wait_for(Counter({("src", "dead_lettered"): 2}))
        # b receives too, from the dead-letter queue: the moves were a's to report.
        assert len(await b.receive(T, DLQ, 10)) == 2
        await b.check_writable()
        assert seen_by_b.totals == Counter()
        assert seen_by_a.totals == Counter({("src", "dead_lettered"): 2})
    finally:
        await a.close()
        await b.close()


async def test_a_deleted_queue_leaves_no_record_of_who_reports_its_events(
    inprocess_nodes: tuple[Layout, list[Node]], etcd_endpoints: list[str]
) -> None:
    """Each node remembers, per queue and partition, the gateway connection that reports its
    events; a gateway that lives long and deletes many queues must not leave one behind per
    queue (they stayed until the connection closed)."""
    layout, nodes = inprocess_nodes
    url = f"cluster://{','.join(etcd_endpoints)}{layout.prefix}"
    gateway = open_cluster_backend(url, StoreOptions())
    await gateway.start()
    gone = QueueName("gone")

    def reporters() -> int:
        return sum(node.events.reporter(pid, T, gone) is not None for node in nodes for pid in node.hosts)

    try:
        await gateway.create_queue(T, gone, {"replication_factor": 2, "partitions": 2})
        await gateway.send(T, gone, [NewMessage(b"a"), NewMessage(b"b")])
        await gateway.receive(T, gone, 10)
        assert reporters() >= 1
        await gateway.delete_queue(T, gone)
        assert reporters() == 0
    finally:
        await gateway.close()


async def test_a_node_drops_its_copy_of_a_former_dead_letter_queue_once_that_queue_is_deleted(
    inprocess_nodes: tuple[Layout, list[Node]], etcd_endpoints: list[str]
) -> None:
    """A queue that changed its dead-letter queue keeps the old one's dead letters in its
    partitions (still read through the old queue). When the old queue goes, the deleting
    gateway deletes those copies; if that call is lost (here: the record is only marked
    ``deleting`` in etcd, docs/cluster.md "Shared partitions"), the partition's leader drops
    its copy on the mark (never on a record's absence)."""
    layout, nodes = inprocess_nodes
    url = f"cluster://{','.join(etcd_endpoints)}{layout.prefix}"
    gateway = open_cluster_backend(url, StoreOptions())
    await gateway.start()
    old, new, src = QueueName("old-dlq"), QueueName("new-dlq"), QueueName("feeds")
    try:
        for name in (old, new):
            await gateway.create_queue(T, name, {"replication_factor": 2})
        await gateway.create_queue(
            T, src, {"replication_factor": 2, "max_receives": 1, "dead_letter_queue": old}
        )
        await gateway.send(T, src, [NewMessage(b"poison")])
        assert len(await gateway.receive(T, src, 1, visibility_timeout_s=0)) == 1
        assert await gateway.receive(T, src, 1) == []  # moved to old-dlq's copy in src's partition
        await gateway.update_queue(T, src, {"dead_letter_queue": new})
        assert [m.body for m in await gateway.receive(T, old, 10, visibility_timeout_s=60)] == [b"poison"]
        [part] = queue_partitions(gateway, T, src)
        [leader] = [node for node in nodes if part.leader is not None and node.node_id == part.leader.node]
        store = leader.hosts[part.id].store
        await store.get_queue(T, old)  # the copy is there
        assert await gateway.metadata.mark_deleting(await gateway.metadata.queue(T, old)) is not None
        async with asyncio.timeout(scaled(10)):
            while True:
                try:
                    await store.get_queue(T, old)
                except QueueNotFound:
                    break
                await asyncio.sleep(0.05)
    finally:
        await gateway.close()
