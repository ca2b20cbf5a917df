"""The :class:`~.coordinator.Coordinator` on etcd, through ``aetcd`` (asyncio, gRPC).

Several endpoints are one gRPC target (``ipv4:a:p,b:q,...`` with round-robin), so a dead
etcd member costs one failed call and then traffic goes to the live ones; names are
resolved to addresses once, at connect. Every call has a deadline (``timeout_s``) and
every aetcd or gRPC error becomes :class:`~.coordinator.CoordinatorUnavailable`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import socket
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

import aetcd
import aetcd.exceptions
import aetcd.utils
import grpc
from aetcd import rpc

from ...errors import ConfigurationError, InvalidRequest
from ...tested_versions import RELEASES, ReleaseCheck
from ...types import Epoch
from .coordinator import Claim, CoordinatorUnavailable, Entry, PrefixState, Registered
from .etcd_tls import EtcdTls, etcd_client
from .fingerprint_batch import FingerprintBatch
from .lease_keepalive import LeaseKeepAlive
from .prefix_fingerprint import Fingerprint, Verdict, check_due, check_interval, judge, whole_read_interval

log = logging.getLogger("pushgate.cluster")
T = TypeVar("T")

# A broken watch stream is re-opened after this pause (the periodic re-read covers the gap).
_WATCH_RETRY_S = 0.5
# A failed lease renewal is retried this soon (the deadline bounds the attempts).
_RENEW_RETRY_S = 0.05
# Keys a whole read of a prefix decodes per range request (read_prefix).
_READ_PAGE = 500


def parse_endpoints(spec: str | Sequence[str]) -> list[tuple[str, int]]:
    """``"host:port,host:port"`` (or a list of them) as pairs; the default port is 2379."""
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    out: list[tuple[str, int]] = []
    for item in (i.strip() for i in items):
        if not item:
            continue
        host, _, port = item.rpartition(":") if ":" in item else (item, "", "2379")
        try:
            out.append((host.strip("[]") or "127.0.0.1", int(port)))
        except ValueError:
            raise ConfigurationError(f"bad etcd endpoint {item!r}; expected host:port") from None
    if not out:
        raise ConfigurationError("no etcd endpoint given")
    return out


def _grpc_target(endpoints: list[tuple[str, int]]) -> tuple[str, int]:
    """aetcd joins host and port as ``f"{host}:{port}"``; several addresses go in as one
    ``ipv4:`` target whose last port is the ``port`` argument."""
    if len(endpoints) == 1:
        return endpoints[0]
    addresses = []
    for host, port in endpoints:
        info = socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_STREAM)
        addresses.append(f"{info[0][4][0]}:{port}")
    last_host, last_port = addresses[-1].rsplit(":", 1)
    return "ipv4:" + ",".join([*addresses[:-1], last_host]), int(last_port)


class EtcdSession:
    """A lease renewed every third of its TTL; ``valid()`` while surely alive, ``lost`` once
    etcd says it is gone or it stayed in doubt a whole TTL (``_renew``)."""

    def __init__(self, coordinator: EtcdCoordinator, lease_id: int, ttl_s: float, granted_at: float) -> None:
        self.lease_id = lease_id
        self.ttl_s = ttl_s
        self.lost = asyncio.Event()
        self._coordinator = coordinator
        # Counted from before the grant was asked for: never later than etcd's own clock.
        self._deadline = granted_at + ttl_s
        self._closing = asyncio.Event()
        self._task = asyncio.create_task(self._keep_alive(), name=f"etcd-lease-{lease_id:x}")

    def valid(self) -> bool:
        return not self.lost.is_set() and time.monotonic() < self._deadline

    async def _keep_alive(self) -> None:
        while True:
            # Due a third of a TTL after the last renewal was sent, not after its answer came:
            # counted from the answer, each renewal's round trip came out of the margin a held
            # loop has before the deadline (under load, etcd answered in 0.2-0.3 s and a node
            # whose loop was then held 0.97 s lost its lease; issue 48, item 3).
            due = self._deadline - self.ttl_s * 2 / 3
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, due - time.monotonic())):
                    await self._closing.wait()
            if self._closing.is_set():
                return
            if not await self._renew():
                break
        log.warning("lease %x lost", self.lease_id)
        self.lost.set()

    async def _renew(self) -> bool:
        """Renew, retrying quickly through an etcd election; False: lost.

        Past the deadline the session is *in doubt*, not lost: ``valid()`` is False, so its
        holder acknowledges nothing, but a renewal etcd accepts then proves the lease never
        expired (etcd renews no expired lease: it answers TTL 0), so every key under it is
        still the holder's, and the session is valid again from that renewal's sending on.
        The renewal in flight at the deadline is waited for too: etcd got it, and under load
        its answer came after the deadline, and a node gave up a lease etcd had just renewed
        and stepped down from every partition it led (issue 48, item 3). Lost: etcd answers
        that the lease is gone, or a whole TTL in doubt without an answer."""
        while not self._closing.is_set():
            give_up_at = self._deadline + self.ttl_s
            asked = time.monotonic()
            if asked >= give_up_at:
                return False
            try:
                async with asyncio.timeout(give_up_at - asked):
                    ttl = await self._coordinator._refresh(self.lease_id)
            except (CoordinatorUnavailable, TimeoutError):
                await asyncio.sleep(_RENEW_RETRY_S)
                continue
            if ttl <= 0:
                return False
            late = time.monotonic() - self._deadline
            if late > 0:
                log.warning(
                    "lease %x renewed %.2f s past its deadline (in doubt meanwhile)", self.lease_id, late
                )
            self._deadline = asked + min(self.ttl_s, ttl)
            return True
        return True

    async def close(self) -> None:
        # Told to stop, not cancelled (see _WatchStream): a renewal in flight ends by its deadline.
        self._closing.set()
        await _finish(self._task, self._coordinator.timeout_s * 2)
        self.lost.set()
        with contextlib.suppress(CoordinatorUnavailable):
            await self._coordinator._call(lambda c: c.revoke_lease(self.lease_id))


class EtcdCoordinator:
    """The cluster's view of etcd. Build with endpoints, then ``await connect()``."""

    def __init__(
        self,
        endpoints: str | Sequence[str],
        *,
        timeout_s: float = 2.0,
        tls: EtcdTls | None = None,
        releases: ReleaseCheck = RELEASES,
    ) -> None:
        """``tls``: dial etcd over TLS (plaintext without); ``releases``: whether aetcd is the
        release TLS's connect was tested with (etcd_tls.py)."""
        self.endpoints = parse_endpoints(endpoints)
        self.timeout_s = timeout_s
        self.tls = tls
        self.releases = releases
        self._client: Any = None
        self._checks = FingerprintBatch(self._fingerprints)
        # Every session's renewals, on one stream (lease_keepalive.py); made again once broken.
        self._renewals: LeaseKeepAlive | None = None

    async def connect(self) -> EtcdCoordinator:
        host, port = await asyncio.to_thread(_grpc_target, self.endpoints)
        options: dict[str, Any] = {
            "grpc.lb_policy_name": "round_robin",
            # A member back from a restart is used again within a second, not after
            # gRPC's default back-off (up to two minutes).
            "grpc.initial_reconnect_backoff_ms": 100,
            "grpc.min_reconnect_backoff_ms": 100,
            "grpc.max_reconnect_backoff_ms": 1000,
        }
        if self.tls is not None:
            # Several members are one ``ipv4:`` target: check every member's certificate
            # against the name the operator wrote first (each member's should carry it).
            options["grpc.ssl_target_name_override"] = self.endpoints[0][0]
        self._client = etcd_client(
            host, port, timeout_s=self.timeout_s, options=options, tls=self.tls, releases=self.releases
        )
        await self._call(lambda c: c.connect())
        return self

    async def close(self) -> None:
        if self._renewals is not None:
            renewals, self._renewals = self._renewals, None
            await renewals.close()
        if self._client is not None:
            client, self._client = self._client, None
            with contextlib.suppress(aetcd.exceptions.ClientError, TimeoutError):
                async with asyncio.timeout(self.timeout_s * 2):
                    await client.close()

    async def __aenter__(self) -> EtcdCoordinator:
        return await self.connect()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # Sessions and campaigns -------------------------------------------------------

    async def open_session(self, ttl_s: float = 2.0) -> EtcdSession:
        asked = time.monotonic()
        # etcd leases are whole seconds.
        wanted = max(1, round(ttl_s))
        lease = await self._call(lambda c: c.lease(wanted))
        if lease.ttl > wanted:
            # The session lasts what etcd granted (a dead leader goes unnoticed that long):
            # say so, not silently run on a longer failover than the operator chose.
            log.warning(
                "etcd granted a %d s lease for the %d s asked: its shortest lease is 1.5 times"
                " its --election-timeout, rounded up to whole seconds (docs/cluster.md, section 7)",
                lease.ttl,
                wanted,
            )
        return EtcdSession(self, lease.id, float(lease.ttl), asked)

    async def campaign(
        self, session: Any, key: str, value: bytes, *, unchanged: Mapping[str, bytes] | None = None
    ) -> Claim:
        k = key.encode()
        kept = [(name.encode(), held) for name, held in (unchanged or {}).items()]
        for _ in range(3):
            ok, responses = await self._call(
                lambda c: c.transaction(
                    compare=[c.transactions.create(k) == 0] + [c.transactions.value(n) == v for n, v in kept],
                    success=[c.transactions.put(k, value, lease=session.lease_id)],
                    failure=[c.transactions.get(k)] + [c.transactions.get(n) for n, _ in kept],
                )
            )
            if ok:
                return Claim(True, Epoch(responses[0].response_put.header.revision), value)
            changed = any(
                not (found and found[0][1].value == held)
                for (_, held), found in zip(kept, responses[1:], strict=True)
            )
            if responses and responses[0]:
                holder = responses[0][0][1]
                mine = holder.lease == session.lease_id
                if not (mine and changed):
                    return Claim(mine, Epoch(holder.create_revision), holder.value)
                await self.resign(key, Epoch(holder.create_revision), holder.value)  # ours, on a stale record
            if changed:
                return Claim(False, Epoch(0), b"")  # a record it acted on changed: not ours
            # The holder vanished between the compare and the read: try again.
        raise CoordinatorUnavailable(f"campaign for {key} did not settle")

    async def resign(self, key: str, epoch: Epoch, holder: bytes) -> bool:
        k = key.encode()
        ok, _ = await self._call(
            lambda c: c.transaction(
                compare=[c.transactions.create(k) == epoch, c.transactions.value(k) == holder],
                success=[c.transactions.delete(k)],
                failure=[],
            )
        )
        return bool(ok)

    async def register(self, session: Any, key: str, value: bytes) -> Registered:
        put = await self._call(lambda c: c.put(key.encode(), value, lease=session.lease_id, prev_kv=True))
        prev = put.prev_kv
        before = int(prev.mod_revision) if prev is not None and prev.key else None
        return Registered(before, int(put.header.revision))

    # Reads and writes ---------------------------------------------------------------

    async def get(self, key: str) -> Entry | None:
        kv = await self._call(lambda c: c.get(key.encode()))
        return None if kv is None else _entry(kv)

    async def put(self, key: str, value: bytes) -> int:
        result = await self._call(lambda c: c.put(key.encode(), value))
        revision: int = result.header.revision
        return revision

    async def read_prefix(self, prefix: str) -> PrefixState:
        """Every key under ``prefix`` at one revision, read ``_READ_PAGE`` keys at a time.

        Paged so that no turn of the event loop decodes more than a page: read in one range,
        ``queues/`` at 3,000 records held a node's loop for 0.99 s under load (decoding them,
        every periodic re-read), its lease ran out and it stepped down from every partition
        it led (issue 48, item 3). Every page is read at the first page's revision, so the
        pages make one consistent state (a compaction past it in between fails the read,
        which callers retry)."""
        start = prefix.encode()
        end = aetcd.utils.prefix_range_end(start)
        entries: dict[str, Entry] = {}
        revision = 0
        while True:
            reply = await self._call(functools.partial(self._range, start, end, revision))
            revision = revision or reply.header.revision
            for kv in reply.kvs:
                entry = _entry(kv)
                entries[entry.key] = entry
            if not reply.more or not reply.kvs:
                return PrefixState(prefix, revision, entries)
            start = reply.kvs[-1].key + b"\0"

    async def fingerprint(self, prefix: str) -> Fingerprint:
        """etcd's revision, the keys under ``prefix`` and their newest mod revision
        (``prefix_fingerprint.py``); asked with the other checks of the moment
        (``fingerprint_batch.py``)."""
        return await self._checks.fingerprint(prefix)

    async def _fingerprints(self, prefixes: Sequence[str]) -> list[Fingerprint]:
        """Each prefix's fingerprint in one read-only transaction (served as a range is,
        without a raft proposal): a range sorted by mod revision, limit 1, keys only, for
        each, so no value is sent however many keys; all at the transaction's revision."""
        ranges = []
        for prefix in prefixes:
            start = prefix.encode()
            ranges.append(
                rpc.RequestOp(
                    request_range=rpc.RangeRequest(
                        key=start,
                        range_end=aetcd.utils.prefix_range_end(start),
                        limit=1,
                        keys_only=True,
                        sort_order=rpc.RangeRequest.SortOrder.DESCEND,
                        sort_target=rpc.RangeRequest.SortTarget.MOD,
                    )
                )
            )
        request = rpc.TxnRequest(success=ranges)
        reply = await self._call(lambda c: c.kvstub.Txn(request, timeout=self.timeout_s, metadata=c.metadata))
        revision = int(reply.header.revision)
        out = []
        for answer in reply.responses:
            found = answer.response_range
            newest = found.kvs[0].mod_revision if found.kvs else 0
            out.append(Fingerprint(revision, int(found.count), int(newest)))
        return out

    async def _range(self, start: bytes, end: bytes, revision: int, client: Any) -> Any:
        """One page of a whole read (``read_prefix``), at ``revision`` (0: the current one)."""
        request = rpc.RangeRequest(key=start, range_end=end, limit=_READ_PAGE, revision=revision)
        return await client.kvstub.Range(request, timeout=self.timeout_s, metadata=client.metadata)

    async def create(self, key: str, value: bytes) -> bool:
        return await self.compare_and_put(key, value, 0)

    async def create_many(self, items: Mapping[str, bytes]) -> tuple[int, frozenset[str]]:
        keys = [k.encode() for k in items]
        ok, responses = await self._call(
            lambda c: c.transaction(
                compare=[c.transactions.mod(k) == 0 for k in keys],
                success=[c.transactions.put(k, v) for k, v in zip(keys, items.values(), strict=True)],
                failure=[c.transactions.get(k) for k in keys],
            )
        )
        if ok:
            return int(responses[0].response_put.header.revision), frozenset()
        return 0, frozenset(key for key, found in zip(items, responses, strict=True) if found)

    async def compare_and_put(self, key: str, value: bytes, mod_revision: int) -> bool:
        k = key.encode()
        ok, _ = await self._call(
            lambda c: c.transaction(
                compare=[c.transactions.mod(k) == mod_revision],
                success=[c.transactions.put(k, value)],
                failure=[],
            )
        )
        return bool(ok)

    async def delete(self, key: str, mod_revision: int | None = None) -> bool:
        k = key.encode()
        if mod_revision is None:
            deleted = await self._call(lambda c: c.delete(k))
            return deleted is not None
        ok, responses = await self._call(
            lambda c: c.transaction(
                compare=[c.transactions.mod(k) == mod_revision],
                success=[c.transactions.delete(k)],
                failure=[],
            )
        )
        return bool(ok) and mod_revision != 0 and responses[0].response_delete_range.deleted > 0

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
        fence = fence_key.encode()
        expected = sorted((expect or {}).items())
        ok, _ = await self._call(
            lambda c: c.transaction(
                compare=[c.transactions.create(fence) == epoch, c.transactions.value(fence) == holder]
                # etcd fails a value compare on an absent key: absence is a create revision of 0.
                + [
                    c.transactions.create(k.encode()) == 0
                    if v is None
                    else c.transactions.value(k.encode()) == v
                    for k, v in expected
                ],
                success=[c.transactions.put(k.encode(), v) for k, v in puts.items()]
                + [c.transactions.delete(k.encode()) for k in deletes],
                failure=[],
            )
        )
        return bool(ok)

    # Watches --------------------------------------------------------------------------

    async def watch_prefix(
        self,
        prefix: str,
        *,
        reread_every_s: float = 5.0,
        stop: asyncio.Event | None = None,
        held: Callable[[], PrefixState] | None = None,
    ) -> AsyncGenerator[PrefixState, None]:
        """A whole read at revision R, then etcd's events from R+1 applied in order (module
        docstring of ``coordinator``); a whole read again after any doubt. Every
        ``reread_every_s`` a check: the prefix's fingerprint, a whole read when it disagrees
        and every ``whole_read_interval`` (``prefix_fingerprint.py``)."""
        stop = stop or asyncio.Event()
        last: PrefixState | None = None  # the last state yielded
        fresh: PrefixState | None = None

        def holds_another() -> bool:
            # A consumer holding a state this watch never gave it (one of its own reads) is
            # brought back by whole reads only (below); ``last`` as it is at the check.
            return held is not None and held() is not last

        while not stop.is_set():
            if fresh is None:
                fresh = await self._reread_until_ok(prefix, reread_every_s, stop)
                if fresh is None:
                    return
            prior = held() if held is not None else last
            if last is None or prior is None or fresh.entries != prior.entries:
                last = fresh  # the first state, or one that differs from the consumer's
                yield fresh
            base, fresh = fresh, None
            stream = _WatchStream(self, prefix, base.revision + 1)
            follow = self._follow(stream, base, reread_every_s, stop, holds_another)
            try:
                async with contextlib.aclosing(follow) as states:
                    async for state in states:
                        if state.changed is None:  # a check's read equal to the last state
                            # Yielded only to a consumer holding another state than the one
                            # this watch last gave it (compared a page a turn, section 3 of
                            # docs/cluster.md); holding that very one, it has this one.
                            prior = held() if held is not None else last
                            if prior is last or (
                                prior is not None and not await changed_in_pages(prior, state)
                            ):
                                continue
                        elif not state.changed and held is None:
                            # A check's read at a later revision that changed no key under
                            # the prefix (etcd's other keys changed): a plain consumer has it
                            # already. One holding a state takes it, for its revision
                            # (WatchedPrefix.caught_up: a write of its own beside the prefix).
                            continue
                        last = state
                        yield state
                fresh = stream.fallback
            finally:
                await stream.stop()
            if fresh is None and not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(_WATCH_RETRY_S):
                        await stop.wait()

    async def _follow(
        self,
        stream: _WatchStream,
        base: PrefixState,
        reread_every_s: float,
        stop: asyncio.Event,
        holds_another: Callable[[], bool],
    ) -> AsyncGenerator[PrefixState, None]:
        """States from ``base`` on, the stream's events applied, until the stream breaks, a
        check read disagrees (``stream.fallback``: that read) or ``stop``. A check is the
        prefix's fingerprint (``prefix_fingerprint.py``); a whole read when the fingerprint
        says so, when the consumer holds a state of its own, and every
        ``whole_read_interval`` (longer for a large prefix)."""
        state = base
        now = time.monotonic()
        check_at = check_due(now, check_interval(reread_every_s, len(state.entries)))
        whole_at = now + whole_read_interval(reread_every_s, len(state.entries))
        doubt: int | None = None
        while not stop.is_set():
            item = await _next_item(stream.responses, stop, check_at - time.monotonic())
            if item is None:
                if stop.is_set():
                    return
                now = time.monotonic()
                check_at = check_due(now, check_interval(reread_every_s, len(state.entries)))
                if now < whole_at and not holds_another():
                    try:
                        seen = await self.fingerprint(stream.prefix)
                    except CoordinatorUnavailable:
                        continue
                    verdict, doubt = judge(state, seen, doubt)
                    if verdict is Verdict.WAIT:
                        continue
                    if verdict is Verdict.SAME:
                        if seen.revision > state.revision:
                            # etcd's later revision is other keys': the state, as of it.
                            state = dataclasses.replace(
                                state, revision=seen.revision, changed=frozenset(), since=state.revision
                            )
                            yield state
                        continue
                whole_at, doubt = now + whole_read_interval(reread_every_s, len(state.entries)), None
                try:
                    fresh = await self.read_prefix(stream.prefix)
                except CoordinatorUnavailable:
                    continue
                if fresh.revision < state.revision:
                    stream.fallback = fresh  # etcd went back in time
                    return
                # Compared a page at a time: at 10,000 queue records a comparison in one turn
                # of the loop held a node's loop for about a second under load (read_prefix).
                keys = await changed_in_pages(state, fresh)
                if fresh.revision == state.revision:
                    if keys:
                        log.warning("the watch on %s missed a change; reading it whole", stream.prefix)
                        stream.fallback = fresh  # the events missed one
                        return
                    # The state held: yielded only to a consumer that holds another, one of its
                    # own reads (WatchedPrefix.refresh; see watch_prefix).
                    yield fresh
                    continue
                # Newer than the events applied (they may be on their way): taken whole, and
                # the events it covers are skipped; it names the keys it changed, so its
                # consumers compare nothing again.
                state = dataclasses.replace(fresh, changed=frozenset(keys), since=state.revision)
                yield state
                continue
            if isinstance(item, str):
                log.info("watch on %s broke (%s); reading it whole", stream.prefix, item)
                return
            delta = _apply(state, item.events)
            if delta is not None:
                state = delta
                yield state

    async def _reread_until_ok(self, prefix: str, pause_s: float, stop: asyncio.Event) -> PrefixState | None:
        while not stop.is_set():
            try:
                return await self.read_prefix(prefix)
            except CoordinatorUnavailable:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(min(pause_s, _WATCH_RETRY_S)):
                        await stop.wait()
        return None

    # Internals ------------------------------------------------------------------------

    async def _refresh(self, lease_id: int) -> int:
        client = self._client
        if client is None or client.channel is None:
            raise CoordinatorUnavailable("not connected to etcd")
        if self._renewals is None or self._renewals.broken:
            self._renewals = LeaseKeepAlive(client.channel)
        return await self._renewals.renew(lease_id, self.timeout_s * 2)

    async def _call(self, fn: Callable[[Any], Awaitable[T]]) -> T:
        if self._client is None:
            raise CoordinatorUnavailable("not connected to etcd")
        try:
            async with asyncio.timeout(self.timeout_s * 2):
                return await fn(self._client)
        except (aetcd.exceptions.ClientError, grpc.RpcError, TimeoutError) as exc:
            raise CoordinatorUnavailable(f"etcd: {type(exc).__name__}: {exc}") from None
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # our caller is being cancelled
            # gRPC ends the calls in flight on a channel being closed with CancelledError.
            raise CoordinatorUnavailable("etcd: the connection was closed") from None


class _WatchStream:
    """One etcd watch on a prefix from a revision on; its responses (or why it broke) queued.

    A plain gRPC stream on the client's channel (aetcd's ``WatchStub``), not aetcd's
    ``watch_prefix``: that hands out events one at a time, and a state made from half of a
    transaction's events is one etcd never held; a response carries all of a revision's
    events (``fragment`` is off). It is stopped by cancelling the call, never by cancelling
    a task waiting inside gRPC (a cancellation delivered there can be lost).
    """

    def __init__(self, coordinator: EtcdCoordinator, prefix: str, start_revision: int) -> None:
        self.prefix = prefix
        # Responses in order; a string says why the stream ended (nothing follows it).
        self.responses: asyncio.Queue[Any] = asyncio.Queue()
        # A whole read the follower took instead of the stream (it disagreed with the events).
        self.fallback: PrefixState | None = None
        self._coordinator = coordinator
        self._start_revision = start_revision
        self._call: Any = None
        self._stopping = False
        self._task = asyncio.create_task(self._run(), name=f"etcd-watch {prefix}")

    async def _run(self) -> None:
        client = self._coordinator._client
        if client is None or client.channel is None:
            self.responses.put_nowait("not connected to etcd")
            return
        key = self.prefix.encode()
        create = rpc.WatchCreateRequest(
            key=key, range_end=aetcd.utils.prefix_range_end(key), start_revision=self._start_revision
        )
        self._call = rpc.WatchStub(client.channel).Watch()
        try:
            if self._stopping:
                return
            await self._call.write(rpc.WatchRequest(create_request=create))
            while True:
                response = await self._call.read()
                if response is grpc.aio.EOF:
                    self.responses.put_nowait("the stream ended")
                    return
                if response.compact_revision:
                    self.responses.put_nowait(f"revision {self._start_revision} was compacted")
                    return
                if response.canceled:
                    self.responses.put_nowait(f"etcd cancelled it: {response.cancel_reason}")
                    return
                if response.events:
                    self.responses.put_nowait(response)
        except grpc.RpcError as exc:
            self.responses.put_nowait(f"{type(exc).__name__}: {exc}")
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise
            self.responses.put_nowait("the stream was cancelled")  # stop(), or the channel closed
        finally:
            self._call.cancel()

    async def stop(self) -> None:
        self._stopping = True
        if self._call is not None:
            self._call.cancel()
        await _finish(self._task, self._coordinator.timeout_s * 2)


def _apply(state: PrefixState, events: Sequence[Any]) -> PrefixState | None:
    """``state`` with a response's events of later revisions applied (None: none was later)."""
    entries: dict[str, Entry] | None = None
    changed: set[str] = set()
    revision = state.revision
    for event in events:
        kv = event.kv
        if kv.mod_revision <= state.revision:
            continue  # a whole read already covers it
        if entries is None:
            entries = dict(state.entries)
        key = kv.key.decode()
        if event.type == rpc.Event.EventType.DELETE:
            entries.pop(key, None)
        else:
            entries[key] = _entry(kv)
        changed.add(key)
        revision = max(revision, kv.mod_revision)
    if entries is None:
        return None
    return PrefixState(state.prefix, revision, entries, frozenset(changed), state.revision)


async def _next_item(queue: asyncio.Queue[Any], stop: asyncio.Event, timeout_s: float) -> Any:
    """The queue's next item; None once ``stop`` is set or the timeout passed (plain asyncio
    waits: cancelling them is safe, unlike a wait inside gRPC)."""
    if not queue.empty():
        return queue.get_nowait()
    getter = asyncio.ensure_future(queue.get())
    stopped = asyncio.ensure_future(stop.wait())
    await asyncio.wait({getter, stopped}, timeout=max(timeout_s, 0), return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    if getter.done():
        return getter.result()
    getter.cancel()  # the item, if one came meanwhile, stays queued
    return None


async def _finish(task: asyncio.Task[None], timeout_s: float) -> None:
    """Wait for a task told to stop; cancel it only if it does not end in time."""
    done, _ = await asyncio.wait({task}, timeout=timeout_s)
    if not done:
        log.warning("%s did not stop in %.1fs; cancelling it", task.get_name(), timeout_s)
        task.cancel()
    elif not task.cancelled() and task.exception() is not None:
        log.error("%s failed", task.get_name(), exc_info=task.exception())


async def changed_in_pages(old: PrefixState, new: PrefixState) -> set[str]:
    """The keys added, removed or holding another entry between two states (the whole entry:
    an etcd restored or replaced numbers its revisions again, and a key may hold another value
    at a mod revision it held before), compared ``_READ_PAGE`` keys per turn of the loop."""
    keys = set(old.entries) ^ set(new.entries)
    common = [key for key in new.entries if key in old.entries]
    for begin in range(0, len(common), _READ_PAGE):
        if begin:
            await asyncio.sleep(0)
        for key in common[begin : begin + _READ_PAGE]:
            if old.entries[key] != new.entries[key]:
                keys.add(key)
    return keys


def _entry(kv: Any) -> Entry:
    return Entry(kv.key.decode(), bytes(kv.value), kv.create_revision, kv.mod_revision, kv.lease)
