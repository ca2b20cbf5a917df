"""The coordinator on a real etcd: campaigns and epochs, leases that expire when their holder
dies or freezes, fenced commits, watches backed by re-reads, and an etcd member killed.

Most tests share the session's etcd (``etcd_endpoints``) under a unique key prefix; the
restart and member-kill tests start their own members.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import httpx
import pytest

from backend_store.cluster.coordination.coordinator import (
    Claim,
    Coordinator,
    CoordinatorUnavailable,
    PrefixState,
)
from backend_store.cluster.coordination.etcd_coordinator import EtcdCoordinator, parse_endpoints
from backend_store.cluster.coordination.watched_prefix import WatchedPrefix
from backend_store.errors import ConfigurationError, InvalidRequest
from backend_store.types import Epoch
from tests.conftest import scaled
from tests.fixtures.etcd_server import etcd_cluster, unique_prefix

REPO = Path(__file__).resolve().parents[2]
T = TypeVar("T")


@pytest.fixture
async def coordinator(etcd_endpoints: list[str]) -> AsyncIterator[EtcdCoordinator]:
    async with EtcdCoordinator(etcd_endpoints) as c:
        yield c


async def next_state(states: AsyncIterator[PrefixState], timeout: float = 5) -> PrefixState:
    return await asyncio.wait_for(anext(states), scaled(timeout))


class LeaseHolder:
    """``tests/cluster/lease_holder.py`` in a child process of its own group."""

    def __init__(self, endpoints: list[str], key: str, log: Path) -> None:
        self.log = log.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.cluster.lease_holder", ",".join(endpoints), key],
            cwd=REPO,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            start_new_session=True,
        )

    async def line(self, timeout: float = 15) -> str:
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(self.proc.stdout.readline), scaled(timeout))
        return line.strip()

    async def epoch(self) -> Epoch:
        line = await self.line()
        assert line.startswith("epoch "), line
        return Epoch(int(line.split()[1]))

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=scaled(10))
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.log.close()


async def retry_until_ok(call: Callable[[], Awaitable[T]], timeout: float = 10) -> T:
    """What a caller does with ``unavailable``: try again until a deadline."""
    deadline = time.monotonic() + scaled(timeout)
    while True:
        try:
            return await call()
        except CoordinatorUnavailable:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


async def campaign_until_won(
    coordinator: EtcdCoordinator, key: str, timeout: float = 10
) -> tuple[Epoch, float]:
    """Campaign each time the key changes (watched, with re-reads) until this side wins."""
    session = await coordinator.open_session(2.0)
    started = time.monotonic()
    states = coordinator.watch_prefix(key, reread_every_s=0.5)
    try:
        while True:
            claim = await coordinator.campaign(session, key, b"successor")
            if claim.won:
                return claim.epoch, time.monotonic() - started
            await next_state(states, timeout)
    finally:
        await states.aclose()


# ---------------------------------------------------------------------------


def test_endpoints_parse_from_a_url_list() -> None:
    assert parse_endpoints("10.0.0.1:2379, etcd-2:12379,etcd-3") == [
        ("10.0.0.1", 2379),
        ("etcd-2", 12379),
        ("etcd-3", 2379),
    ]
    with pytest.raises(ConfigurationError):
        parse_endpoints("host:port")
    with pytest.raises(ConfigurationError):
        parse_endpoints(" , ")


async def test_one_campaign_wins_and_its_epoch_is_the_keys_create_revision(
    coordinator: EtcdCoordinator,
) -> None:
    typed: Coordinator = coordinator
    key = unique_prefix("campaign") + "/leader"
    first, second = await typed.open_session(), await typed.open_session()
    try:
        won = await typed.campaign(first, key, b"node-a")
        lost = await typed.campaign(second, key, b"node-b")
        entry = await typed.get(key)
        assert entry is not None and entry.lease == first.lease_id
        assert won.won and won.epoch == entry.create_revision
        assert not lost.won and (lost.epoch, lost.holder) == (won.epoch, b"node-a")
        # Campaigning again for a key one already holds is a win at the same epoch.
        assert await typed.campaign(first, key, b"node-a") == won

        # Resigning needs the right epoch and the claim's own value: a restored etcd numbers
        # revisions again, so a stale claim of another node can share this one's epoch.
        assert not await typed.resign(key, Epoch(won.epoch - 1), b"node-a")
        assert not await typed.resign(key, won.epoch, b"node-b")
        assert (await typed.get(key)) == entry
        assert await typed.resign(key, won.epoch, b"node-a")
        again = await typed.campaign(second, key, b"node-b")
        assert again.won and again.epoch > won.epoch
    finally:
        await first.close()
        await second.close()


async def test_a_campaign_on_records_etcd_no_longer_holds_is_refused(
    coordinator: EtcdCoordinator,
) -> None:
    """A node claims a partition's leader key only while etcd still holds the partition
    record it read and the cluster record it judged it by (simulation seeds ``all`` 100074:
    a node whose map watch was behind led on a designation the manager had replaced; 50473:
    one whose cluster watch was behind led on a designation from before a restore)."""
    typed: Coordinator = coordinator
    prefix = unique_prefix("designated")
    key, record, cluster = prefix + "/leaders/1", prefix + "/partitions/1", prefix + "/cluster"
    session, other = await typed.open_session(), await typed.open_session()
    try:
        await typed.put(cluster, b"incarnation 0")
        await typed.put(record, b"leader n3")
        await typed.put(record, b"leader n2")  # the manager moved on; n3's watch is behind
        refused = await typed.campaign(session, key, b"n3", unchanged={record: b"leader n3"})
        assert refused == Claim(False, Epoch(0), b"")
        assert await typed.get(key) is None  # nothing claimed
        # Absent, the record designates nobody either.
        absent = prefix + "/partitions/2"
        assert not (await typed.campaign(session, key, b"n3", unchanged={absent: b"x"})).won
        # The record stands, but the incarnation it was judged by does not.
        await typed.put(cluster, b"incarnation 1")
        stale = {record: b"leader n2", cluster: b"incarnation 0"}
        assert await typed.campaign(other, key, b"n2", unchanged=stale) == Claim(False, Epoch(0), b"")
        assert await typed.get(key) is None

        current = {record: b"leader n2", cluster: b"incarnation 1"}
        won = await typed.campaign(other, key, b"n2", unchanged=current)
        assert won.won
        # Held by another: the holder is reported, whatever the records say.
        lost = await typed.campaign(session, key, b"n3", unchanged={record: b"leader n3"})
        assert (lost.won, lost.epoch, lost.holder) == (False, won.epoch, b"n2")
        # One's own earlier claim is still a win, as without records to compare.
        assert await typed.campaign(other, key, b"n2", unchanged=current) == won
        # But not once a record it compares changed (etcd restored from a snapshot that holds
        # this lease's old key, ``all`` 203747): refused, and the key is given back.
        await typed.put(record, b"leader n4")
        assert await typed.campaign(other, key, b"n2", unchanged=current) == Claim(False, Epoch(0), b"")
        assert await typed.get(key) is None
    finally:
        await session.close()
        await other.close()


async def test_a_killed_holders_lease_expires_and_the_successor_gets_a_higher_epoch(
    coordinator: EtcdCoordinator, etcd_endpoints: list[str], tmp_path: Path
) -> None:
    key = unique_prefix("killed") + "/leader"
    holder = LeaseHolder(etcd_endpoints, key, tmp_path / "holder.log")
    try:
        old_epoch = await holder.epoch()
        os.killpg(holder.proc.pid, signal.SIGKILL)
        new_epoch, _ = await campaign_until_won(coordinator, key)
        assert new_epoch > old_epoch
    finally:
        holder.stop()


async def test_a_frozen_holder_finds_its_session_lost_and_its_fenced_commit_refused(
    coordinator: EtcdCoordinator, etcd_endpoints: list[str], tmp_path: Path
) -> None:
    key = unique_prefix("frozen") + "/leader"
    holder = LeaseHolder(etcd_endpoints, key, tmp_path / "holder.log")
    try:
        old_epoch = await holder.epoch()
        os.killpg(holder.proc.pid, signal.SIGSTOP)
        new_epoch, _ = await campaign_until_won(coordinator, key)
        assert new_epoch > old_epoch
        os.killpg(holder.proc.pid, signal.SIGCONT)
        # Woken up, it learns its lease is gone; anything fenced on its epoch is refused.
        assert await holder.line() == "lost"
        assert await holder.line() == "fenced_commit False"
        assert await coordinator.get(key + "/written-by-old-holder") is None
        entry = await coordinator.get(key)
        assert entry is not None and entry.create_revision == new_epoch
    finally:
        holder.stop()


async def test_a_fenced_commit_applies_only_under_the_current_epoch(coordinator: EtcdCoordinator) -> None:
    prefix = unique_prefix("fenced")
    manager_key, map_key = prefix + "/manager", prefix + "/map/p0"
    first = await coordinator.open_session()
    claim = await coordinator.campaign(first, manager_key, b"manager-1")
    # The epoch is a revision, and revisions repeat across an etcd wiped and restored: the
    # fence also names the holder, so another holder's claim of the same revision refuses it.
    assert not await coordinator.fenced_commit(
        manager_key, claim.epoch, {map_key: b"v0"}, holder=b"manager-2"
    )
    assert await coordinator.get(map_key) is None
    assert await coordinator.fenced_commit(manager_key, claim.epoch, {map_key: b"v1"}, holder=b"manager-1")
    await first.close()  # revoked: the key is gone at once

    second = await coordinator.open_session()
    try:
        successor = await coordinator.campaign(second, manager_key, b"manager-2")
        assert successor.won and successor.epoch > claim.epoch
        # The deposed manager's change is refused whole: neither the put nor the delete lands.
        assert not await coordinator.fenced_commit(
            manager_key, claim.epoch, {prefix + "/map/p1": b"stale"}, deletes=[map_key], holder=b"manager-1"
        )
        state = await coordinator.read_prefix(prefix + "/map/")
        assert state.values() == {"p0": b"v1"}
        assert await coordinator.fenced_commit(
            manager_key, successor.epoch, {map_key: b"v2"}, deletes=[], holder=b"manager-2"
        )
        entry = await coordinator.get(map_key)
        assert entry is not None and entry.value == b"v2"
        with pytest.raises(InvalidRequest):
            await coordinator.fenced_commit(
                manager_key, successor.epoch, {map_key: b"v3"}, deletes=[map_key], holder=b"manager-2"
            )
    finally:
        await second.close()


async def test_a_fenced_commit_holds_only_while_etcd_holds_what_it_expects(
    coordinator: EtcdCoordinator,
) -> None:
    # The manager's deletions expect the partition and queue records it read: a commit after
    # etcd changed under it (restored between the read and the commit) must change nothing.
    prefix = unique_prefix("expect")
    manager_key, record, queue, out = prefix + "/manager", prefix + "/p2", prefix + "/q", prefix + "/t2"
    session = await coordinator.open_session()
    try:
        claim = await coordinator.campaign(session, manager_key, b"m")
        await coordinator.put(record, b"late")
        holder = b"m"
        expect: dict[str, bytes | None] = {record: b"late", queue: None}
        await coordinator.put(queue, b"back")  # the queue is there after all
        assert not await coordinator.fenced_commit(
            manager_key, claim.epoch, {out: b"x"}, holder=holder, expect=expect
        )
        assert await coordinator.get(out) is None
        await coordinator.put(record, b"another")  # and the record is another one
        await coordinator.delete(queue)
        assert not await coordinator.fenced_commit(
            manager_key, claim.epoch, {out: b"x"}, holder=holder, expect=expect
        )
        await coordinator.delete(record)  # absent: a value compare on it fails too
        assert not await coordinator.fenced_commit(
            manager_key, claim.epoch, {out: b"x"}, holder=holder, expect=expect
        )
        assert await coordinator.get(out) is None
        await coordinator.put(record, b"late")
        assert await coordinator.fenced_commit(
            manager_key, claim.epoch, {out: b"x"}, [record], holder=holder, expect=expect
        )
        assert await coordinator.get(record) is None
        entry = await coordinator.get(out)
        assert entry is not None and entry.value == b"x"
    finally:
        await session.close()


async def test_a_closed_session_revokes_its_keys(coordinator: EtcdCoordinator) -> None:
    key = unique_prefix("register") + "/nodes/n1"
    session = await coordinator.open_session()
    written = await coordinator.register(session, key, b"127.0.0.1:7001")
    assert session.valid()
    entry = await coordinator.get(key)
    assert entry is not None and entry.lease == session.lease_id
    # What the write replaced (nothing) and its own revision (node/registrations.py).
    assert written.before is None and written.revision == entry.mod_revision
    await session.close()
    assert not session.valid() and session.lost.is_set()
    assert await coordinator.get(key) is None


async def test_a_watch_hands_out_each_new_state(coordinator: EtcdCoordinator) -> None:
    prefix = unique_prefix("watch") + "/"
    # A long re-read interval: what arrives quickly came through the watch.
    states = coordinator.watch_prefix(prefix, reread_every_s=60)
    try:
        assert (await next_state(states)).values() == {}
        revision = await coordinator.put(prefix + "a", b"1")
        state = await next_state(states)
        assert state.values() == {"a": b"1"} and state.revision >= revision
        await coordinator.put(prefix + "b", b"2")
        assert (await next_state(states)).values() == {"a": b"1", "b": b"2"}
        # Keys beside the prefix are not its business; deletions are news too.
        await coordinator.put(prefix.rstrip("/") + "-other", b"x")
        await coordinator.put(prefix + "c", b"3")
        assert (await next_state(states)).values() == {"a": b"1", "b": b"2", "c": b"3"}
        session = await coordinator.open_session()
        claim = await coordinator.campaign(session, prefix + "a", b"ignored")
        assert await coordinator.resign(prefix + "a", claim.epoch, claim.holder)
        await session.close()
        assert (await next_state(states)).values() == {"b": b"2", "c": b"3"}
    finally:
        await states.aclose()


async def test_a_watch_compares_with_the_state_its_consumer_holds(coordinator: EtcdCoordinator) -> None:
    """A consumer that also takes states of its own reads (``WatchedPrefix.refresh``) may
    hold one the watch never yielded; etcd then restored to the state the watch last yielded
    must still reach it. Compared with its own last state, the watch yielded nothing, and a
    node kept a cluster record etcd no longer held (simulation seed ``etcd`` 100): here the
    consumer holds a state of its own making, and the next periodic re-read, equal to the
    last state yielded, is yielded all the same."""
    prefix = unique_prefix("held") + "/"
    await coordinator.put(prefix + "a", b"1")
    held = PrefixState(prefix, 0)
    states = coordinator.watch_prefix(prefix, reread_every_s=0.3, held=lambda: held)
    try:
        first = await next_state(states)
        assert first.values() == {"a": b"1"}
        # The consumer's own read showed another state (a write the watch then missed).
        held = PrefixState(prefix, first.revision + 1, {})
        again = await next_state(states)
        assert again.values() == {"a": b"1"}
    finally:
        await states.aclose()
    # Without ``held``, a state equal to the last one yielded is not yielded again, not even
    # when the check's read comes at a later revision because other keys changed (CI stop 52:
    # another test's writes made this watch yield an unchanged state).
    plain = coordinator.watch_prefix(prefix, reread_every_s=0.3)
    try:
        await next_state(plain)
        await coordinator.put(unique_prefix("elsewhere"), b"x")
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(anext(plain), 1.0)
    finally:
        await plain.aclose()


async def test_a_read_of_our_own_that_comes_back_older_is_taken_at_once(
    coordinator: EtcdCoordinator,
) -> None:
    """``WatchedPrefix.refresh`` reads after the held state was taken, so an older answer is
    etcd gone back in time and is taken before ``refresh`` returns. Left to the confirming
    read, a node that raised the incarnation after a restore decided on its record from
    before the restore meanwhile, and led at its restored key's old epoch (simulation seed
    ``all`` 150423). Here the held state is one from "before a restore": a revision etcd
    has not reached."""
    prefix = unique_prefix("refresh") + "/"
    await coordinator.put(prefix + "cluster", b"incarnation 1")
    watch = WatchedPrefix(coordinator, prefix, reread_every_s=60.0)
    try:
        await watch.start()
        watch.apply(PrefixState(prefix, 10**12, {}))  # held from an etcd that went further
        await watch.refresh()
        assert watch.state.revision < 10**12
        assert watch.state.values() == {"cluster": b"incarnation 1"}
    finally:
        await watch.close()


async def test_a_watch_closed_as_it_opens_stops_without_being_cancelled(
    coordinator: EtcdCoordinator, caplog: pytest.LogCaptureFixture
) -> None:
    # A gateway or test that closes its store right after start() closes watches whose
    # etcd stream may still be opening: the follower must see that it was told to stop once
    # the stream is open, not run until its stop deadline (twice the etcd timeout) and be
    # cancelled (which gRPC's stream machinery can lose).
    prefix = unique_prefix("watch-close") + "/"
    for _ in range(5):  # the first state and the stream's opening race: try the race a few times
        states = coordinator.watch_prefix(prefix, reread_every_s=60)
        await next_state(states)
        await states.aclose()
    assert not [r for r in caplog.records if "did not stop" in r.getMessage()]


async def test_a_lease_longer_than_asked_is_counted_and_said(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # etcd's default timing (100 ms heartbeats, a 1,000 ms election timeout) grants no lease
    # under 2 s: a session asked for 1 s lasts 2, counts 2 and says so; one asked for 2 does not.
    with etcd_cluster(tmp_path / "etcd", timing_ms=("100", "1000")) as cluster:
        async with EtcdCoordinator(cluster.endpoints) as coordinator:
            with caplog.at_level(logging.WARNING, logger="pushgate.cluster"):
                asked_two = await coordinator.open_session(2.0)
                assert asked_two.ttl_s == 2.0
                assert not [r for r in caplog.records if "etcd granted" in r.getMessage()]
                asked_one = await coordinator.open_session(1.0)
                assert asked_one.ttl_s == 2.0
                warned = [r.getMessage() for r in caplog.records if "etcd granted" in r.getMessage()]
                assert warned == [
                    "etcd granted a 2 s lease for the 1 s asked: its shortest lease is 1.5 times its"
                    " --election-timeout, rounded up to whole seconds (docs/cluster.md, section 7)"
                ]
            await asked_one.close()
            await asked_two.close()


def _lease_keepalive_counts(endpoint: str) -> tuple[int, int]:
    """etcd's own counts of ``LeaseKeepAlive`` streams opened and renewals received."""
    metrics = httpx.get(f"http://{endpoint}/metrics", timeout=5).text
    counts = {}
    for name in ("grpc_server_started_total", "grpc_server_msg_received_total"):
        (line,) = [m for m in metrics.splitlines() if m.startswith(name) and '"LeaseKeepAlive"' in m]
        counts[name] = int(float(line.rsplit(" ", 1)[1]))
    return counts["grpc_server_started_total"], counts["grpc_server_msg_received_total"]


async def test_every_renewal_goes_on_one_keepalive_stream(tmp_path: Path) -> None:
    # A stream per renewal (aetcd's refresh_lease) cost etcd and the holder about 1 ms of CPU
    # more a renewal; at the dev cluster's 1 s lease each holder renews three times a second.
    with etcd_cluster(tmp_path / "etcd") as cluster:
        async with EtcdCoordinator(cluster.endpoints) as coordinator:
            first = await coordinator.open_session(1.0)
            second = await coordinator.open_session(1.0)
            assert first.ttl_s == second.ttl_s == 1.0
            streams_before, renewals_before = _lease_keepalive_counts(cluster.endpoints[0])
            await asyncio.sleep(scaled(2.5))
            streams, renewals = _lease_keepalive_counts(cluster.endpoints[0])
            assert first.valid() and second.valid()
            # Two sessions, each renewing every third of a second: about 14 renewals.
            assert renewals - renewals_before >= 8
            assert streams - streams_before <= 1
            await first.close()
            await second.close()


async def test_a_renewal_is_answered_for_its_own_lease_and_a_revoked_one_is_lost(
    coordinator: EtcdCoordinator, etcd_endpoints: list[str]
) -> None:
    # Renewals of two leases share the stream; the one revoked behind the session's back
    # is answered TTL 0 and lost, and the other goes on being renewed.
    kept = await coordinator.open_session(2.0)
    revoked = await coordinator.open_session(2.0)
    await asyncio.to_thread(
        subprocess.run,
        ["etcdctl", "--endpoints", etcd_endpoints[0], "lease", "revoke", f"{revoked.lease_id:x}"],
        check=True,
        capture_output=True,
        env={**os.environ, "ETCDCTL_API": "3"},
        timeout=scaled(10),
    )
    await asyncio.wait_for(revoked.lost.wait(), scaled(5))
    deadline = time.monotonic() + 2 * kept.ttl_s
    while time.monotonic() < deadline:
        assert kept.valid()
        await asyncio.sleep(0.1)
    await kept.close()
    await revoked.close()


async def test_a_watch_and_a_session_survive_an_etcd_restart(tmp_path: Path) -> None:
    with etcd_cluster(tmp_path / "etcd") as cluster:
        async with EtcdCoordinator(cluster.endpoints) as coordinator:
            prefix = unique_prefix("restart") + "/"
            # A lease that must outlive a restart is a window of seconds (docs/testing.md): a
            # loaded machine can take longer than 2 s to restart etcd and renew.
            session = await coordinator.open_session(5.0)
            await coordinator.register(session, prefix + "node", b"n1")
            states = coordinator.watch_prefix(prefix, reread_every_s=0.5)
            try:
                assert (await next_state(states)).values() == {"node": b"n1"}
                member = cluster.members[0]
                cluster.kill_member(member)
                cluster.start_member(member)
                await retry_until_ok(lambda: coordinator.put(prefix + "after", b"restart"))
                state = await next_state(states, timeout=15)
                assert state.values() == {"node": b"n1", "after": b"restart"}
                # etcd keeps leases across a restart and the session renewed it.
                assert not session.lost.is_set()
            finally:
                await states.aclose()
                await session.close()


async def test_an_etcd_member_killed_in_a_three_member_cluster(tmp_path: Path) -> None:
    with etcd_cluster(tmp_path / "etcd", size=3) as cluster:
        async with EtcdCoordinator(cluster.endpoints) as coordinator:
            prefix = unique_prefix("member-kill") + "/"
            session = await coordinator.open_session(2.0)
            claim = await coordinator.campaign(session, prefix + "leader", b"node-a")
            states = coordinator.watch_prefix(prefix, reread_every_s=0.5)
            try:
                assert set((await next_state(states)).values()) == {"leader"}
                cluster.kill_member(cluster.members[0])
                # Writes, fenced commits and the watch go on through the two live members
                # (calls during etcd's own leader election fail with unavailable: retried).
                assert await retry_until_ok(
                    lambda: coordinator.fenced_commit(
                        prefix + "leader", claim.epoch, {prefix + "map": b"1"}, holder=b"node-a"
                    )
                )
                state = await next_state(states, timeout=15)
                assert state.values() == {"leader": b"node-a", "map": b"1"}
                # Two TTLs later the session is still renewed and the claim still held.
                deadline = time.monotonic() + 2 * session.ttl_s
                while time.monotonic() < deadline:
                    assert not session.lost.is_set()
                    await asyncio.sleep(0.1)
                again = await coordinator.campaign(session, prefix + "leader", b"node-a")
                assert again.won and again.epoch == claim.epoch
            finally:
                await states.aclose()
                await session.close()
