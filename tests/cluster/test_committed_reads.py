"""Reads that must be committed (issue 24, "one entry per (LSN, epoch)"): a partition
leader's peek and queue counts show only what a majority holds, as Raft's read index does.

A real :class:`PartitionHost` leads a real LMDB store with two real followers over TCP
(test_replication.py's ``FollowerNode``). With both followers cut off, a send is written on
the leader but cannot be acknowledged; a peek that showed it would show a message a
failover drops. It waits instead, and answers ``unavailable`` (a read is retried safely)
when no majority comes; once the followers are back, it shows the message, now committed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from backend_store.cluster.coordination.layout import PartitionRecord
from backend_store.cluster.protocol.ops import encode_args
from backend_store.errors import Unavailable
from backend_store.types import Epoch, NewMessage
from tests.conftest import scaled

from .test_replication import FollowerNode, leader_host, open_store, until

QUEUES = {("t", "q"): {"replication_factor": 3}}


def sending(body: bytes) -> dict[str, object]:
    return encode_args("send", tenant="t", queue="q", messages=[NewMessage(body)])


async def test_a_peek_and_counts_show_only_what_a_majority_holds(tmp_path: Path) -> None:
    followers = {name: FollowerNode(name, await open_store(tmp_path / name)) for name in ("f1", "f2")}
    for node in followers.values():
        await node.start()
    host = leader_host(tmp_path / "leader")
    await host.open()
    try:
        record = PartitionRecord("t", "q", 0, ("leader", "f1", "f2"), "leader")
        addresses = {name: f"127.0.0.1:{node.port}" for name, node in followers.items()}
        await host.lead(Epoch(3), record, addresses, QUEUES)
        await until(lambda: host.ready, "the term's first entry")
        await host.handle("send", Epoch(3), sending(b"kept"), timeout_s=scaled(5))
        peek = encode_args("peek", tenant="t", queue="q", max_messages=10)
        assert len(await host.handle("peek", Epoch(3), peek, timeout_s=scaled(5))) == 1
        for node in followers.values():
            await node.stop()
        with pytest.raises(Unavailable):
            await host.handle("send", Epoch(3), sending(b"unacknowledged"), timeout_s=0.5)
        # On the leader's disk, not on a majority: neither shown nor counted.
        with pytest.raises(Unavailable):
            await host.handle("peek", Epoch(3), peek, timeout_s=0.5)
        stats = encode_args("get_queue", tenant="t", name="q")
        with pytest.raises(Unavailable):
            await host.handle("get_queue", Epoch(3), stats, timeout_s=0.5)
        listed = encode_args("queue_stats", tenant="t", names=["q"])  # a page of GET /v1/queues
        with pytest.raises(Unavailable):
            await host.handle("queue_stats", Epoch(3), listed, timeout_s=0.5)
        for node in followers.values():
            await node.start()
        await until(
            lambda: host.leader is not None and host.leader.committed_lsn == host.store.last_lsn, "a majority"
        )
        assert len(await host.handle("peek", Epoch(3), peek, timeout_s=scaled(5))) == 2
        counts = await host.handle("queue_stats", Epoch(3), listed, timeout_s=scaled(5))
        assert counts["q"]["visible"] == 2
    finally:
        await host.close()
        for node in followers.values():
            await node.stop()
            await node.store.close()
