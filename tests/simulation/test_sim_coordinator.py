"""The simulation's etcd coordinator (``sim_coordinator.py``) on its own, on virtual time: the
rules of the production coordinator (``etcd_coordinator.py``) that the code on top of it
depends on, and that the simulation's seeds reach only by chance. ``test_coordinator.py`` checks
the same rules on the production coordinator against a real etcd; here the model is checked,
as the ablations of these fixes (``ablations.py``: ``claim-compares``, ``claim-cluster-compare``,
``own-key-compares``, ``publish-check``) take them out of the model, not of production."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

from backend_store.cluster.coordination.coordinator import Claim, Registered
from backend_store.cluster.coordination.layout import Layout

from .etcd_model import EtcdServer
from .kernel import Process, Trace, VirtualLoop
from .network import Network
from .sim_coordinator import SimCoordinator

T = TypeVar("T")

LAYOUT = Layout()
KEY = LAYOUT.leader(5)
RECORD = LAYOUT.partition(5)
CLUSTER = LAYOUT.cluster  # compared with the partition's record by ``NodeLeadership._campaign``


def on_virtual_time(body: Callable[[SimCoordinator], Awaitable[T]]) -> T:
    """Run ``body`` with the coordinator of one process ("n1") of a fresh etcd model."""
    loop = VirtualLoop()

    async def main() -> T:
        rng = random.Random(0)
        trace = Trace()
        network = Network(rng, trace)
        etcd_proc = Process("etcd")
        network.attach(etcd_proc)
        server = EtcdServer(etcd_proc, rng, trace)
        proc = Process("n1")
        network.attach(proc)
        try:
            return await body(SimCoordinator(proc, network, server))
        finally:
            proc.kill()

    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(main())
    finally:
        asyncio.set_event_loop(None)
        loop.close()


async def records(coordinator: SimCoordinator) -> None:
    assert await coordinator.create(RECORD, b"record v1")
    assert await coordinator.create(CLUSTER, b"cluster v1")


def test_a_claim_on_a_record_that_changed_is_refused() -> None:
    async def body(coordinator: SimCoordinator) -> tuple[Claim, object]:
        session = await coordinator.open_session()
        await records(coordinator)
        await coordinator.put(RECORD, b"record v2")  # changed since the claimant read it
        claim = await coordinator.campaign(session, KEY, b"n1", unchanged={RECORD: b"record v1"})
        return claim, await coordinator.get(KEY)

    claim, held = on_virtual_time(body)
    assert not claim.won
    assert held is None  # nobody holds the key: the claim wrote nothing


def test_a_claim_on_a_cluster_record_that_changed_is_refused() -> None:
    async def body(coordinator: SimCoordinator) -> tuple[Claim, object]:
        session = await coordinator.open_session()
        await records(coordinator)
        await coordinator.put(CLUSTER, b"cluster v2")  # e.g. a restore or a new cluster id
        unchanged = {RECORD: b"record v1", CLUSTER: b"cluster v1"}
        claim = await coordinator.campaign(session, KEY, b"n1", unchanged=unchanged)
        return claim, await coordinator.get(KEY)

    claim, held = on_virtual_time(body)
    assert not claim.won
    assert held is None


def test_a_claim_on_unchanged_records_wins() -> None:
    async def body(coordinator: SimCoordinator) -> Claim:
        session = await coordinator.open_session()
        await records(coordinator)
        unchanged = {RECORD: b"record v1", CLUSTER: b"cluster v1"}
        return await coordinator.campaign(session, KEY, b"n1", unchanged=unchanged)

    assert on_virtual_time(body).won


def test_a_key_of_ones_own_lease_on_a_changed_record_is_given_up_not_won() -> None:
    # etcd restored from a backup held the key under the session's own lease, still alive,
    # while the record it was won on changed (``all`` 203747, session 35).
    async def body(coordinator: SimCoordinator) -> tuple[Claim, Claim, object]:
        session = await coordinator.open_session()
        await records(coordinator)
        first = await coordinator.campaign(session, KEY, b"n1", unchanged={RECORD: b"record v1"})
        await coordinator.put(RECORD, b"record v2")
        again = await coordinator.campaign(session, KEY, b"n1", unchanged={RECORD: b"record v1"})
        return first, again, await coordinator.get(KEY)

    first, again, held = on_virtual_time(body)
    assert first.won
    assert not again.won
    assert held is None  # the stale key was deleted


def test_registering_says_what_the_write_replaced_and_its_own_revision() -> None:
    async def body(coordinator: SimCoordinator) -> tuple[Registered, Registered, int]:
        session = await coordinator.open_session()
        key = LAYOUT.node("n1")
        first = await coordinator.register(session, key, b"record 1")
        written = await coordinator.get(key)
        assert written is not None
        second = await coordinator.register(session, key, b"record 2")
        return first, second, written.mod_revision

    first, second, mod_revision = on_virtual_time(body)
    assert first.before is None  # nothing was there
    assert first.revision == mod_revision  # the write's own revision
    assert second.before == mod_revision  # the record it replaced, by its revision
    assert second.revision > mod_revision


def test_a_session_past_its_deadline_is_in_doubt_until_etcd_answers() -> None:
    """``EtcdSession``'s rule (issue 48, item 3; on a real etcd in test_node_inprocess.py): a
    renewal etcd answers after the session's deadline proves the lease alive, so the session
    is not valid meanwhile (its holder acknowledges nothing) and valid again after, never
    lost. The model gave the session up at its deadline, which production no longer does."""

    async def body(coordinator: SimCoordinator) -> list[str]:
        session = await coordinator.open_session(ttl_s=2.0)
        seen: list[str] = []
        # Virtual time (on_virtual_time): no wall-clock wait; one renewal on a fast network.
        await asyncio.sleep(1.0)
        coordinator.network.set_slow("n1", 0.8)  # a round trip of 1.6 s: past the deadline
        for _ in range(80):
            await asyncio.sleep(0.05)
            state = "lost" if session.lost.is_set() else "valid" if session.valid() else "doubt"
            if not seen or seen[-1] != state:
                seen.append(state)
        return seen

    seen = on_virtual_time(body)
    # Each renewal answered late: in doubt then valid again, again and again, never lost.
    assert seen[:3] == ["valid", "doubt", "valid"] and "lost" not in seen, seen
