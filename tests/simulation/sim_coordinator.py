"""The :class:`~backend_store.cluster.coordination.coordinator.Coordinator` of a simulated
process: etcd calls over the simulated network to :class:`~.etcd_model.EtcdServer`.

It keeps the production coordinator's rules (``etcd_coordinator.py``), which the code on top
of it depends on:

- every call has a deadline (``2 * timeout_s``) and any failure is
  :class:`CoordinatorUnavailable`, whether or not etcd applied it;
- a session's lease is renewed a third of its TTL after the last renewal was sent, retried
  quickly; its deadline counts from before the grant (or the renewal) was asked for on the
  process's own (possibly skewed) clock; past it the session is *in doubt*, not lost
  (``valid()`` is False) until etcd answers: a renewal it accepts proves the lease never
  expired, and the session is valid again; lost when etcd says the lease is gone or a whole
  TTL passes in doubt;
- a watch only nudges: the state handed out is always a fresh read of the whole prefix, read
  again at least every ``reread_every_s``, and handed out only when its entries changed.

A frozen process makes no call until it thaws (what it was told meanwhile waits in its
socket); a dead one makes none at all.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from typing import Any

from backend_store.cluster.coordination.coordinator import (
    Claim,
    CoordinatorUnavailable,
    Entry,
    PrefixState,
    Registered,
)
from backend_store.errors import InvalidRequest
from backend_store.types import Epoch

from .etcd_model import (
    Compare,
    Delete,
    EtcdServer,
    Failure,
    Get,
    Grant,
    KeepAlive,
    KeyValue,
    Nudge,
    Put,
    Range,
    RangeResult,
    Request,
    Revoke,
    Txn,
    TxnResult,
    Watch,
)
from .kernel import Process
from .network import Network, Pipe

RENEW_RETRY_S = 0.05


class _Link:
    """One gRPC connection to etcd: calls out, replies and watch nudges back."""

    def __init__(self, client: SimCoordinator) -> None:
        self.client = client
        network, proc, server = client.network, client.proc, client.server
        self.broken = False
        self.incarnation = server.incarnation  # etcd's: a restart ends this connection
        self.pending: dict[int, asyncio.Future[Any]] = {}
        self.to_server: Pipe = network.pipe(proc, "etcd", self._arrive, lambda: server.proc)
        self.to_client: Pipe = network.pipe(server.proc, proc.name, self._reply, lambda: proc)
        self._next_id = 0
        self._nudging: set[str] = set()

    def call(self, request: Request) -> asyncio.Future[Any]:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if isinstance(request, Watch):
            future.set_result(None)
        else:
            self._next_id += 1
            self.pending[self._next_id] = future
        self.to_server.send((self._next_id, request))
        return future

    # etcd's side
    def _arrive(self, item: tuple[int, Request]) -> None:
        server = self.client.server
        if self.broken:
            return
        if not server.up or server.incarnation != self.incarnation:
            self.to_client.send("reset")
            return
        call_id, request = item
        delay, reply = server.handle(self, request)
        if isinstance(request, Watch):
            return
        asyncio.get_running_loop().call_later(delay, self._send_reply, call_id, reply)

    def _send_reply(self, call_id: int, reply: Any) -> None:
        if not self.broken:
            self.to_client.send((call_id, reply))

    def nudge(self, prefix: str) -> None:
        # Revisions in a row are one watch response while the client has not read it yet.
        if prefix not in self._nudging:
            self._nudging.add(prefix)
            self.to_client.send(Nudge(prefix))

    def server_gone(self) -> None:
        """etcd stopped: the connection resets (the client hears when the path lets it)."""
        self.to_client.send("reset")

    # the client's side
    def _reply(self, item: Any) -> None:
        if self.broken:
            return
        if item == "reset":
            self.fail("the connection to etcd was reset")
        elif isinstance(item, Nudge):
            self._nudging.discard(item.prefix)
            self.client.nudged(item.prefix)
        else:
            call_id, reply = item
            future = self.pending.pop(call_id, None)
            if future is not None and not future.done():
                future.set_result(reply)

    def fail(self, why: str) -> None:
        self.broken = True
        pending, self.pending = self.pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(CoordinatorUnavailable(f"etcd: {why}"))
        self.client.link_lost(self)


class SimSession:
    """A lease kept alive by a task of its process (``EtcdSession``'s rules)."""

    def __init__(self, coordinator: SimCoordinator, lease_id: int, ttl_s: float, granted_at: float) -> None:
        self.lease_id = lease_id
        self.ttl_s = ttl_s
        self.lost = asyncio.Event()
        self._coordinator = coordinator
        self._proc = coordinator.proc
        self._deadline = granted_at + ttl_s
        self._closing = asyncio.Event()
        self._task = self._proc.spawn(self._keep_alive(), f"lease {lease_id:x}")

    def valid(self) -> bool:
        return not self.lost.is_set() and self._proc.clock() < self._deadline

    async def _keep_alive(self) -> None:
        proc = self._proc
        while True:
            # Due a third of a TTL after the last renewal was sent (EtcdSession._keep_alive).
            due = self._deadline - self.ttl_s * 2 / 3
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(proc.local_to_real(max(0.0, due - proc.clock()))):
                    await self._closing.wait()
            await proc.awake()
            if self._closing.is_set():
                return
            if not await self._renew():
                break
        self._coordinator.note(f"lease {self.lease_id:x} lost")
        self.lost.set()

    async def _renew(self) -> bool:
        """``EtcdSession._renew``'s rule: in doubt past the deadline, until etcd answers or a
        whole TTL has passed; a renewal answered after the deadline is waited for."""
        proc = self._proc
        while not self._closing.is_set():
            give_up_at = self._deadline + self.ttl_s
            asked = proc.clock()
            if asked >= give_up_at:
                return False
            try:
                async with asyncio.timeout(proc.local_to_real(give_up_at - asked)):
                    ttl = await self._coordinator.call(KeepAlive(self.lease_id))
            except (CoordinatorUnavailable, TimeoutError):
                await proc.sleep(RENEW_RETRY_S)
                continue
            if ttl <= 0:
                return False
            if asked > self._deadline:
                self._coordinator.note(
                    f"lease {self.lease_id:x} renewed past its deadline (in doubt meanwhile)"
                )
            self._deadline = asked + min(self.ttl_s, ttl)
            return True
        return True

    async def close(self) -> None:
        self._closing.set()
        self.lost.set()
        with contextlib.suppress(CoordinatorUnavailable):
            await self._coordinator.call(Revoke(self.lease_id))


class SimCoordinator:
    """One process's coordinator."""

    def __init__(
        self,
        proc: Process,
        network: Network,
        server: EtcdServer,
        *,
        timeout_s: float = 2.0,
        off_the_network: frozenset[str] = frozenset(),
    ) -> None:
        """``off_the_network``: prefixes nothing writes in this run, read from etcd's model on
        the spot (no message, no delay, nothing drawn from the random stream) and watched
        without a stream: a prefix a new version of a process reads leaves the schedules of
        runs that never write it as they were."""
        self.proc = proc
        self.off_the_network = off_the_network
        self.network = network
        self.server = server
        self.timeout_s = timeout_s
        self._link: _Link | None = None
        self._nudges: dict[str, list[asyncio.Event]] = {}
        self._watching: dict[str, int] = {}
        proc.on_kill(self._killed)

    def note(self, text: str) -> None:
        self.network.trace.add(asyncio.get_running_loop().time(), self.proc.name, text)

    def _killed(self) -> None:
        link, self._link = self._link, None
        if link is not None:
            link.broken = True

    # The connection --------------------------------------------------------------------------

    async def _connected(self) -> _Link:
        link = self._link
        if link is not None and not link.broken:
            return link
        proc = self.proc
        if not (self.network.passes(proc.name, "etcd") and self.network.passes("etcd", proc.name)):
            await asyncio.sleep(self.timeout_s)
            raise CoordinatorUnavailable("etcd: connect timed out")
        await asyncio.sleep(self.network.latency(proc.name, "etcd") + self.network.latency("etcd", proc.name))
        await proc.awake()
        if not proc.alive:
            raise CoordinatorUnavailable("etcd: the process is dead")
        link = _Link(self)
        if not self.server.connect(link):
            raise CoordinatorUnavailable("etcd: connection refused")
        self._link = link
        loop = asyncio.get_running_loop()
        for prefix in sorted(self._watching):
            # Each prefix's watch is re-opened on its own retry timer (``_PrefixFollower``:
            # a broken watch waits ``_WATCH_RETRY_S``, 0.5 s, before it tries again), so after
            # etcd comes back the prefixes are read again in any order, up to 0.5 s apart: a
            # process's picture can be fresh for one prefix and stale for another.
            loop.call_later(self.network.rng.random() * 0.5, self._reopen_watch, link, prefix)
        return link

    def _reopen_watch(self, link: _Link, prefix: str) -> None:
        if link is self._link and not link.broken and prefix in self._watching:
            link.call(Watch(prefix))
            self.nudged(prefix)  # a new watch stream: read again

    def link_lost(self, link: _Link) -> None:
        if self._link is link:
            self._link = None
        for prefix in sorted(self._watching):
            self.nudged(prefix)  # the watch stream broke: whoever watches reads again

    async def call(self, request: Request) -> Any:
        proc = self.proc
        await proc.awake()
        if not proc.alive:
            raise CoordinatorUnavailable("etcd: the process is dead")
        try:
            async with asyncio.timeout(self.timeout_s * 2):
                link = await self._connected()
                reply = await link.call(request)
        except TimeoutError:
            raise CoordinatorUnavailable("etcd: deadline exceeded") from None
        if isinstance(reply, Failure):
            raise CoordinatorUnavailable(f"etcd: {reply.why}")
        return reply

    async def _txn(self, txn: Txn) -> TxnResult:
        result = await self.call(txn)
        assert isinstance(result, TxnResult)
        return result

    # Coordinator --------------------------------------------------------------------------------

    async def open_session(self, ttl_s: float = 2.0) -> SimSession:
        asked = self.proc.clock()
        lease_id, ttl = await self.call(Grant(max(1, round(ttl_s))))
        return SimSession(self, lease_id, float(ttl), asked)

    async def campaign(
        self, session: Any, key: str, value: bytes, *, unchanged: Mapping[str, bytes] | None = None
    ) -> Claim:
        kept = tuple((unchanged or {}).items())
        compares = (Compare(key, "create", 0), *(Compare(name, "value", held) for name, held in kept))
        reads = (Get(key), *(Get(name) for name, _ in kept))
        for _ in range(3):
            result = await self._txn(Txn(compares, (Put(key, value, session.lease_id),), reads))
            if result.succeeded:
                return Claim(True, Epoch(result.revision), value)
            changed = any(
                found is None or found.value != held
                for (_, held), (_, found) in zip(kept, result.results[1:], strict=True)
            )
            _, holder = result.results[0]
            if holder is not None:
                mine = holder.lease == session.lease_id
                if not (mine and changed):
                    return Claim(mine, Epoch(holder.create_revision), holder.value)
                await self.resign(key, Epoch(holder.create_revision), holder.value)  # ours, on a stale record
            if changed:
                return Claim(False, Epoch(0), b"")
        raise CoordinatorUnavailable(f"campaign for {key} did not settle")

    async def resign(self, key: str, epoch: Epoch, holder: bytes) -> bool:
        compares = (Compare(key, "create", epoch), Compare(key, "value", holder))
        result = await self._txn(Txn(compares, (Delete(key),)))
        return result.succeeded

    async def register(self, session: Any, key: str, value: bytes) -> Registered:
        result = await self._txn(Txn((), (Put(key, value, session.lease_id),)))
        before = result.results[0]
        return Registered(None if before is None else int(before.mod_revision), result.revision)

    async def get(self, key: str) -> Entry | None:
        result = await self._txn(Txn((), (Get(key),)))
        _, found = result.results[0]
        return None if found is None else _entry(key, found)

    async def put(self, key: str, value: bytes) -> int:
        return (await self._txn(Txn((), (Put(key, value),)))).revision

    async def read_prefix(self, prefix: str) -> PrefixState:
        if prefix in self.off_the_network:
            result = self.server.read_now(prefix)
            return PrefixState(prefix, result.revision, {k: _entry(k, v) for k, v in result.items})
        result = await self.call(Range(prefix))
        assert isinstance(result, RangeResult)
        return PrefixState(prefix, result.revision, {k: _entry(k, v) for k, v in result.items})

    async def create(self, key: str, value: bytes) -> bool:
        return await self.compare_and_put(key, value, 0)

    async def create_many(self, items: Mapping[str, bytes]) -> tuple[int, frozenset[str]]:
        compares = tuple(Compare(key, "mod", 0) for key in items)
        puts = tuple(Put(key, value) for key, value in items.items())
        result = await self._txn(Txn(compares, puts, tuple(Get(key) for key in items)))
        if result.succeeded:
            return result.revision, frozenset()
        return 0, frozenset(key for key, found in result.results if found is not None)

    async def compare_and_put(self, key: str, value: bytes, mod_revision: int) -> bool:
        return (await self._txn(Txn((Compare(key, "mod", mod_revision),), (Put(key, value),)))).succeeded

    async def delete(self, key: str, mod_revision: int | None = None) -> bool:
        compares = () if mod_revision is None else (Compare(key, "mod", mod_revision),)
        result = await self._txn(Txn(compares, (Delete(key),)))
        return result.succeeded and bool(result.results[0])

    async def fenced_commit(
        self,
        fence_key: str,
        epoch: Epoch,
        puts: Mapping[str, bytes],
        deletes: Sequence[str] = (),
        *,
        holder: bytes,
        expect: Mapping[str, bytes | None] | None = None,
    ) -> bool:
        if set(puts) & set(deletes):
            raise InvalidRequest("a fenced commit cannot both put and delete a key (etcd refuses it)")
        ops: tuple[Put | Delete, ...] = tuple(Put(k, v) for k, v in puts.items()) + tuple(
            Delete(k) for k in deletes
        )
        fence = (Compare(fence_key, "create", epoch), Compare(fence_key, "value", holder))
        expected = tuple(
            Compare(k, "create", 0) if v is None else Compare(k, "value", v)
            for k, v in sorted((expect or {}).items())
        )
        return (await self._txn(Txn(fence + expected, ops))).succeeded

    def nudged(self, prefix: str) -> None:
        for event in self._nudges.get(prefix, []):
            event.set()

    async def watch_prefix(
        self,
        prefix: str,
        *,
        reread_every_s: float = 5.0,
        stop: asyncio.Event | None = None,
        held: Callable[[], PrefixState] | None = None,
    ) -> AsyncGenerator[PrefixState, None]:
        if prefix in self.off_the_network:
            yield await self.read_prefix(prefix)
            await (stop or asyncio.Event()).wait()  # nothing writes it: no other state comes
            return
        nudge = asyncio.Event()
        self._nudges.setdefault(prefix, []).append(nudge)
        self._watching[prefix] = self._watching.get(prefix, 0) + 1
        if self._link is not None and not self._link.broken:
            self._link.call(Watch(prefix))
        stop = stop or asyncio.Event()
        try:
            state: PrefixState | None = None
            while state is None and not stop.is_set():
                try:
                    state = await self.read_prefix(prefix)
                except CoordinatorUnavailable:
                    await self._wait(nudge, stop, min(reread_every_s, 0.5))
            if state is None:
                return
            yield state
            while True:
                await self._wait(nudge, stop, reread_every_s)
                if stop.is_set():
                    return
                nudge.clear()
                try:
                    fresh = await self.read_prefix(prefix)
                except CoordinatorUnavailable:
                    continue
                if fresh.entries != (held() if held is not None else state).entries:
                    state = fresh
                    yield state
        finally:
            self._nudges[prefix].remove(nudge)
            self._watching[prefix] -= 1
            if not self._watching[prefix]:
                del self._watching[prefix]

    async def _wait(self, nudge: asyncio.Event, stop: asyncio.Event, timeout_s: float) -> None:
        """Until nudged or ``timeout_s`` passed (``stop`` is looked at after: the simulation
        stops watches only at its end)."""
        if not stop.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.proc.local_to_real(timeout_s)):
                    await nudge.wait()
        await self.proc.awake()

    async def close(self) -> None:
        link, self._link = self._link, None
        if link is not None:
            link.broken = True


def _entry(key: str, kv: KeyValue) -> Entry:
    return Entry(key, kv.value, kv.create_revision, kv.mod_revision, kv.lease)
