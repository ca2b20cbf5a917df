"""The cluster under a network partition: real etcd, real ``pushgate node`` and ``pushgate
manager`` processes, each node behind TCP proxies the test controls (``tests/cluster/network.py``).

Cutting a node off (``ClusterNetwork.isolate``) is a full partition of that node: nobody
reaches its advertised address (gateways, other leaders' replication links), it reaches
neither etcd nor the other nodes (each node's proxy recognises its replication links by their
hello and holds them), and nothing is closed: bytes are held in both directions and
delivered after the heal, as TCP delivers a short partition's retransmissions. What still
reaches the node is its real port, which the test dials as a gateway on its side of the
partition would.

Why this tests the promise and not just the lease: the cut-off leader keeps running. It
goes on taking sends from its side's gateway at its old epoch, writing them to its own log
and shipping them into the held links, until its etcd session runs out (a TTL, counted from
before its last renewal, so before etcd lets its key go and a successor is elected); then it
answers ``not_leader``. Its shipments are not lost but held: at the heal they reach
followers whose storage fences the successor has raised (the new leader's first shipment,
a heartbeat at worst, raised them during the partition), so they are refused, and the old
leader, rejoining as a follower, drops the tail nobody acknowledged. A fence that let the
old term in, a leader that acknowledged without a majority, or two leaders handing out
positions at once would show in the data: a send begun after the cut acknowledged or
surviving, or an acknowledged message missing or at another place (id, seq) in the final log.
"""

from __future__ import annotations

import asyncio
import collections
import signal
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from backend_store.cluster.client.node_pool import NodeClient
from backend_store.cluster.protocol import ops
from backend_store.errors import PushgateError, StaleEpoch, Unavailable
from backend_store.types import Epoch, NewMessage, QueueName, SendResult, TenantId
from tests.conftest import scaled
from tests.fixtures.etcd_server import unique_prefix

from .processes import ClusterHarness
from .workload import (
    RF3_SYNC,
    Producers,
    Q,
    T,
    check_acknowledged_in_place,
    has_replicas,
    replicated_everywhere,
)


@pytest.fixture
async def harness(etcd_endpoints: list[str], tmp_path: Path) -> AsyncIterator[ClusterHarness]:
    h = ClusterHarness(etcd_endpoints, tmp_path, unique_prefix("partition") + "/")
    try:
        yield h
    finally:
        await h.close()


class OldSideSenders:
    """A gateway on the cut-off leader's side: a steady stream of sends straight to its real
    port at its epoch, each message once (a new body each), each answer awaited on its own
    (open loop: sends keep starting while earlier ones wait for a majority, so the old leader
    writes sends begun after the cut into its log). Notes which began after the cut."""

    def __init__(self, node: str, address: str, pid: int, epoch: Epoch) -> None:
        # Longer than the node's own 5 s wait for a majority: we hear its answer.
        self.client = NodeClient("old-side-gateway", node, address, timeout_s=scaled(10))
        self.pid, self.epoch = pid, epoch
        self.acknowledged: dict[str, SendResult] = {}
        self.after_cut: set[str] = set()  # sends begun once the node was cut off
        self.refused: dict[str, str] = {}  # body: the error code
        self.errors: list[BaseException] = []
        self.cut = False
        self._in_flight = asyncio.Semaphore(64)
        self._sends: set[asyncio.Task[None]] = set()
        self._loop: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._loop = asyncio.create_task(self._run())

    async def _run(self) -> None:
        for i in range(10**6):
            await self._in_flight.acquire()
            body = f"x{i}"
            if self.cut:
                self.after_cut.add(body)
            task = asyncio.create_task(self._send(body))
            self._sends.add(task)
            task.add_done_callback(self._sends.discard)
            await asyncio.sleep(0.02)  # the stream's pace, not a wait for anything

    async def _send(self, body: str) -> None:
        message = NewMessage(body.encode(), dedupe_id=body)
        try:
            (result,) = await self.client.call(
                "send", self.pid, self.epoch, tenant=TenantId(T), queue=QueueName(Q), messages=[message]
            )
            if isinstance(result, PushgateError):
                raise result
            self.acknowledged[body] = result
        except (Unavailable, StaleEpoch) as exc:
            self.refused[body] = exc.code
        except Exception as exc:  # neither an acknowledgement nor a refusal: the test fails
            self.errors.append(exc)
        finally:
            self._in_flight.release()

    async def stop(self) -> None:
        tasks = [t for t in (self._loop, *self._sends) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.client.close()
        assert not self.errors, self.errors


async def test_a_leader_cut_off_is_fenced_and_loses_nothing_acknowledged(harness: ClusterHarness) -> None:
    h = await harness.start(nodes=3, managers=1, proxied=True)
    assert h.network is not None
    await h.create_queue(T, Q, RF3_SYNC)
    pid = await h.partition_of(T, Q)
    await h.wait_for("three replicas", lambda: has_replicas(h, pid, 3))
    producers = Producers(h, pid)
    producers.start()
    await producers.more(20, "sends before the partition")
    cut_off, _, epoch = await h.serving_leader(pid)
    old_side = OldSideSenders(cut_off, h.listen[cut_off], pid, epoch)
    old_side.start()

    async def old_side_acknowledged() -> bool:
        return len(old_side.acknowledged) >= 5

    await h.wait_for("sends acknowledged on the old side", old_side_acknowledged)
    h.network.isolate(cut_off)
    old_side.cut = True

    # The majority side elects a successor and goes on acknowledging without the old leader.
    _, _, new_epoch = await h.serving_leader(pid, not_node=cut_off)
    assert new_epoch > epoch
    await producers.more(20, "sends to the new leader during the partition")

    # Cut off, the old leader took sends begun after the cut until its session ran out: it
    # wrote them and shipped them into the held links, and found no majority (unavailable,
    # after its 5 s wait); then it refuses at once (not_leader).
    async def old_side_refused() -> bool:
        codes = {old_side.refused.get(body) for body in old_side.after_cut}
        return {"unavailable", "not_leader"} <= codes

    await h.wait_for("the old leader to take sends after the cut, then refuse them", old_side_refused)
    h.network.heal()
    await producers.more(10, "sends after the heal")
    await producers.stop()
    # The old leader rejoins as a follower, dropping what it wrote and nobody acknowledged,
    # and ends with the new leader's log.
    await replicated_everywhere(h, pid, list(h.nodes))
    await old_side.stop()
    _, _, final_epoch = await h.serving_leader(pid)
    assert final_epoch >= new_epoch

    log = await h.read_log(pid, T, Q)
    bodies = [m.body.decode() for m in log]
    producers.check(bodies)
    assert collections.Counter(bodies).most_common(1)[0][1] == 1
    # Nothing the old leader acknowledged is lost or moved, before the cut or (had it
    # acknowledged any) after; the producers' acknowledgements keep their places too.
    check_acknowledged_in_place({**old_side.acknowledged, **producers.results}, log)
    # Cut off, it acknowledged nothing begun after the cut, and none of it survived: its
    # shipments, held by the partition, were refused by the fences at the heal.
    assert not old_side.after_cut & set(old_side.acknowledged)
    assert not old_side.after_cut & set(bodies), "a send the old leader took after the cut survived"


async def test_a_follower_cut_off_catches_up_after_the_heal(harness: ClusterHarness) -> None:
    h = await harness.start(nodes=3, managers=1, proxied=True)
    assert h.network is not None
    await h.create_queue(T, Q, RF3_SYNC)
    pid = await h.partition_of(T, Q)
    await h.wait_for("three replicas", lambda: has_replicas(h, pid, 3))
    producers = Producers(h, pid)
    producers.start()
    await producers.more(20, "sends before the partition")
    leader, _, _ = await h.serving_leader(pid)
    follower = next(n for n in h.nodes if n != leader)
    h.network.isolate(follower)

    # The leader and the other follower are a majority: sync sends go on being acknowledged
    # while the follower's lease expires. (Leadership is not asserted to stay put: under
    # load an etcd stall can cost the leader its own session, and a new term is fine.)
    async def lease_expired() -> bool:
        return follower not in await h.node_records()

    await h.wait_for("the cut-off follower's lease to expire", lease_expired)
    await producers.more(30, "sends while a follower is cut off")
    h.network.heal()
    await producers.more(10, "sends after the heal")
    await producers.stop()
    await replicated_everywhere(h, pid, list(h.nodes))
    log = await h.read_log(pid, T, Q)
    producers.check([m.body.decode() for m in log])
    check_acknowledged_in_place(producers.results, log)


async def test_a_leader_cut_off_from_its_followers_only_resigns_for_lack_of_a_quorum(
    harness: ClusterHarness,
) -> None:
    """Check-quorum: etcd and gateways still reach the leader, so its lease lives on; it hears
    from no follower for its window (one TTL), resigns (deletes its key, refuses requests,
    publishes what it vouches for), and the manager promotes a follower on the majority's fresh
    positions. Without check-quorum nobody replaces it and no send is acknowledged until the
    heal (this test then times out waiting for a new leader)."""
    h = await harness.start(nodes=3, managers=1, proxied=True)
    assert h.network is not None
    await h.create_queue(T, Q, RF3_SYNC)
    pid = await h.partition_of(T, Q)
    await h.wait_for("three replicas", lambda: has_replicas(h, pid, 3))
    producers = Producers(h, pid)
    producers.start()
    await producers.more(20, "sends before the cut")
    cut_off, _, epoch = await h.serving_leader(pid)

    h.network.separate(cut_off)
    cut_at = time.monotonic()

    async def send_probe() -> tuple[SendResult, float]:
        # What a gateway sees: one send, retried (same dedupe id) until acknowledged.
        return await h.send_until_ok(pid, T, Q, "probe"), time.monotonic()

    probe = asyncio.create_task(send_probe())
    try:
        await _cut_off_leader_is_replaced(h, pid, cut_off, epoch, producers, probe, cut_at)
    finally:
        probe.cancel()  # done unless the test failed
        await asyncio.gather(probe, return_exceptions=True)


async def test_a_resigned_leader_still_the_best_is_designated_anew_once_per_resignation(
    harness: ClusterHarness,
) -> None:
    """f2 is cut off from its peers, the leader and f1 acknowledge more sends, then f1 is
    frozen: the leader hears from no majority of voters still registered and resigns
    (check-quorum, a 1 s window, while f1's 4 s lease keeps it registered), vouching for
    entries f2 lacks. f1's position is from before the key vanished, so the best of the
    fresh majority (the leader and f2) is the leader: the manager designates it anew, and it
    holds off for its window before it leads again (and may resign again, f1 still
    registered). The manager designates it once a resignation; until session 88 it did so
    at every plan through the window, each plan following its own last commit: 1,534 times
    for one resignation (election.designated_since_resigning)."""
    harness.lease_ttl = 4.0
    h = await harness.start(nodes=3, managers=1, proxied=True, node_args=["--quorum-window", "1"])
    assert h.network is not None
    await h.create_queue(T, Q, RF3_SYNC)
    pid = await h.partition_of(T, Q)
    await h.wait_for("three replicas", lambda: has_replicas(h, pid, 3))
    producers = Producers(h, pid)
    producers.start()
    await producers.more(10, "sends before the cut")
    leader, _, epoch = await h.serving_leader(pid)
    f1, f2 = sorted(n for n in h.nodes if n != leader)
    h.network.separate(f2)
    await producers.more(20, "sends the leader and f1 alone acknowledged")
    await producers.stop()

    def resignations() -> int:
        return h.nodes[leader].log_tail(10**7).count(f"partition {pid}: resigned leadership of epoch")

    designation, resigned = (await h.partitions())[pid].designation, resignations()
    h.nodes[f1].signal(signal.SIGSTOP)
    await h.wait_for("the leader's resignation", lambda: _at_least(resignations, resigned + 1))

    async def led_again() -> bool:
        key = await h.leader(pid)
        return key is not None and key[0] == leader and key[2] > epoch

    await h.wait_for("the leader to lead again after its window", led_again)
    record = (await h.partitions())[pid]
    assert record.leader == leader
    designated, resigned = record.designation - designation, resignations() - resigned
    assert 1 <= designated <= resigned, f"{designated} designations for {resigned} resignations"


async def _at_least(count: Callable[[], int], n: int) -> bool:
    return count() >= n


async def _cut_off_leader_is_replaced(
    h: ClusterHarness,
    pid: int,
    cut_off: str,
    epoch: Epoch,
    producers: Producers,
    probe: asyncio.Task[tuple[SendResult, float]],
    cut_at: float,
) -> None:
    assert h.network is not None
    key_gone_at: float | None = None

    async def new_leader() -> tuple[str, str, Epoch] | None:
        nonlocal key_gone_at
        found = await h.leader(pid)
        if key_gone_at is None and (found is None or found[0] != cut_off):
            key_gone_at = time.monotonic()
        return found if found is not None and found[0] != cut_off else None

    successor, _, new_epoch = await h.wait_for("a follower to take over", new_leader)
    assert new_epoch > epoch
    probe_result, acked_at = await probe
    await producers.more(20, "sends to the new leader while the old one is cut off")
    # It resigned (not lost its session: etcd was reachable all along), and refuses requests
    # at its old epoch on its real port, as a gateway still reaching it would see.
    assert f"resigned leadership of epoch {epoch} for lack of a quorum" in h.nodes[cut_off].log_tail(10**6)
    old_side = NodeClient("old-side-gateway", cut_off, h.listen[cut_off], timeout_s=scaled(10))
    try:
        with pytest.raises(ops.NotLeader):
            await old_side.call("get_queue", pid, epoch, tenant=TenantId(T), queue=QueueName(Q))
    finally:
        await old_side.close()

    h.network.heal()
    await producers.more(10, "sends after the heal")
    await producers.stop()
    # The old leader rejoins as a follower and ends with the new leader's log.
    await replicated_everywhere(h, pid, list(h.nodes))
    records = await h.node_records()
    assert records[cut_off].replicas[pid].role == "follower"
    log = await h.read_log(pid, T, Q)
    bodies = [m.body.decode() for m in log]
    producers.check(bodies)
    assert collections.Counter(bodies).most_common(1)[0][1] == 1
    check_acknowledged_in_place({**producers.results, "probe": probe_result}, log)
    assert key_gone_at is not None
    print(
        f"\ncheck-quorum: {cut_off} cut off from its followers; its key gone after"
        f" {key_gone_at - cut_at:.2f}s, {successor} leading at epoch {new_epoch} (was {epoch}),"
        f" first acknowledged send {acked_at - cut_at:.2f}s after the cut"
    )
