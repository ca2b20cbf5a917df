"""Failover in the lease, not in the freeze (issue 24, defect 5): real etcd, three real
``pushgate node`` processes and a manager, the gateway's ``ClusterBackend`` in the test.

- A leader frozen with SIGSTOP holds the requests it was sent. Once the watched map shows
  its successor (a newer epoch: about a lease after the freeze), the gateway gives them up:
  a deduplicated send goes to the new leader, a send without a dedupe id fails with
  ``unavailable`` (its outcome is unknown). Neither waits for the node timeout, set here far
  past the test's bound so that waiting for it fails the test.
- A gateway that cannot reach etcd (its map is stale) follows a hand-over by the leader hint
  in the old leader's ``not_leader``, without re-reading the map.

The time from the freeze to the first acknowledged send is printed; bench/cluster_bench.py
measures it over rounds (docs/cluster.md, section 7).
"""

from __future__ import annotations

import asyncio
import signal
import time

import pytest

from backend_store import StoreOptions
from backend_store.cluster.client.cluster_backend import ClusterBackend, open_cluster_backend
from backend_store.errors import Unavailable
from backend_store.types import NewMessage, QueueName, SendResult, TenantId
from tests.conftest import scaled
from tests.fixtures.tcp_proxy import TcpProxy

from .placed import queue_partitions
from .processes import ClusterHarness

TENANT, QUEUE = TenantId("acme"), QueueName("orders")


async def _three_replicas(backend: ClusterBackend) -> None:
    assert await backend.view.wait_for(lambda m: len(m.nodes) == 3, scaled(30)), "nodes did not register"
    await backend.create_queue(TENANT, QUEUE, {"replication_factor": 3, "replication_mode": "sync"})

    def placed(m: object) -> bool:
        parts = queue_partitions(backend, TENANT, QUEUE)
        return len(parts) == 1 and len(parts[0].replicas) == 3 and parts[0].leader is not None

    assert await backend.view.wait_for(placed, scaled(30)), "the queue never got three replicas"


async def _send(backend: ClusterBackend, body: str, *, dedupe: bool = True) -> SendResult:
    message = NewMessage(body.encode(), dedupe_id=body if dedupe else None)
    [result] = await backend.send(TENANT, QUEUE, [message])
    assert isinstance(result, SendResult), result
    return result


async def test_requests_held_at_a_frozen_leader_are_given_up_when_its_successor_appears(
    harness: ClusterHarness,
) -> None:
    # A node timeout far past the test's bound: a request that waits for it fails the test.
    node_timeout = scaled(120)
    url = (
        f"cluster://{','.join(harness.endpoints)}{harness.prefix}"
        f"?node_timeout_s={node_timeout}&request_deadline_s={node_timeout + 60}"
    )
    backend = open_cluster_backend(url, StoreOptions())
    await backend.start()
    frozen: str | None = None
    try:
        await _three_replicas(backend)
        for i in range(5):
            await _send(backend, f"warm-{i}")
        [part] = queue_partitions(backend, TENANT, QUEUE)
        assert part.leader is not None
        frozen, old_epoch = part.leader.node, part.leader.epoch
        harness.nodes[frozen].signal(signal.SIGSTOP)
        stopped = time.monotonic()
        safe = [asyncio.ensure_future(_send(backend, f"held-{i}")) for i in range(4)]
        unsafe = asyncio.ensure_future(_send(backend, "no-dedupe-id", dedupe=False))
        done, _ = await asyncio.wait([*safe, unsafe], timeout=scaled(30))
        took = time.monotonic() - stopped
        assert len(done) == 5, f"requests held at the frozen leader still waiting after {took:.1f}s"
        acknowledged = [task.result() for task in safe]  # every deduplicated send went through
        with pytest.raises(Unavailable):
            unsafe.result()  # outcome unknown: given up, not resent
        print(f"SIGSTOP of the leader -> 4 held deduplicated sends acknowledged: {took:.2f}s")
        [now] = queue_partitions(backend, TENANT, QUEUE)
        assert now.leader is not None and now.leader.epoch > old_epoch and now.leader.node != frozen
        harness.nodes[frozen].signal(signal.SIGCONT)
        frozen = None
        # Each held send is stored once (its retry deduplicated), where it was acknowledged.
        peeked = await backend.peek(TENANT, QUEUE, 100)
        bodies = [m.body.decode() for m in peeked]
        for i, result in enumerate(acknowledged):
            assert bodies.count(f"held-{i}") == 1
            assert next(m.id for m in peeked if m.body == f"held-{i}".encode()) == result.id
    finally:
        if frozen is not None:
            harness.nodes[frozen].signal(signal.SIGCONT)
        await backend.close()


async def test_a_gateway_cut_off_from_etcd_follows_a_hand_over_by_the_leader_hint(
    harness: ClusterHarness,
) -> None:
    proxies = [await TcpProxy(int(e.rsplit(":", 1)[1])).start() for e in harness.endpoints]
    url = f"cluster://{','.join(p.address for p in proxies)}{harness.prefix}?request_deadline_s={scaled(20)}"
    backend = open_cluster_backend(url, StoreOptions())
    await backend.start()
    try:
        await _three_replicas(backend)
        await _send(backend, "before")
        [part] = queue_partitions(backend, TENANT, QUEUE)
        assert part.leader is not None
        old, old_epoch = part.leader.node, part.leader.epoch
        for proxy in proxies:
            proxy.partition()  # the gateway's map stays as it is now
        await harness.manager_command("--drain", old)
        pid = part.id
        new, _, new_epoch = await harness.serving_leader(pid, not_node=old)

        async def old_leader_knows() -> bool:
            record = (await harness.node_records()).get(old)
            position = record.replicas.get(pid) if record is not None else None
            return position is not None and position.leader_epoch == new_epoch

        await harness.wait_for(f"{old} to see {new}'s key", old_leader_knows)
        assert queue_partitions(backend, TENANT, QUEUE)[0].leader == part.leader  # still stale
        after = await _send(backend, "after")  # asked the old leader, told the new one
        assert after.id
        assert new_epoch > old_epoch
    finally:
        for proxy in proxies:
            proxy.heal()
        await backend.close()
        for proxy in proxies:
            await proxy.close()
