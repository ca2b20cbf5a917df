"""A model of etcd: keys with revisions, leases with TTLs, transactions, watches; wiped and restored.

What the cluster relies on, as etcd does it (one linearizable store, so one object):

- Every write transaction moves the store's **revision** up by one; a key remembers the
  revision that created it (``create_revision``, which the cluster uses as an epoch) and the
  one that last changed it (``mod_revision``).
- A **lease** lives ``ttl`` seconds of etcd's clock past its last keep-alive; when it expires
  (or is revoked) every key attached to it is deleted, in one revision.
- A **transaction** compares ``create_revision`` / ``mod_revision`` of keys and applies its
  success or failure operations atomically. A put under an unknown lease fails as a whole.
- A **watch** on a prefix hears of every revision that touched a key under it (the
  coordinator only takes it as a nudge to read again).
- **Wiped** (stopped, data removed, started again): empty, revisions start over at 1, no
  leases. **Restored** from a snapshot (``etcdctl snapshot restore``): the snapshot's keys,
  leases (their TTL counted from the restore) and revision, which is older than what clients
  saw: revisions go back. Either way every client connection and watch drops. Lease ids
  are never granted twice, across restores and wipes too (etcd draws them from a generator
  seeded by the member id and the clock).

Requests arrive over the simulated network (:mod:`.sim_coordinator` is the client) and are
applied at arrival, in arrival order; the reply leaves after a short processing delay, so
replies to different calls can overtake one another while each call stays linearizable.
"""

from __future__ import annotations

import asyncio
import copy
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .kernel import Process, Trace

# etcd's --max-txn-ops default: a transaction's compares, and each of its branches, at most.
MAX_TXN_OPS = 128


@dataclass(slots=True)
class KeyValue:
    value: bytes
    create_revision: int
    mod_revision: int
    lease: int = 0


@dataclass(slots=True)
class Lease:
    id: int
    ttl: int
    expires_at: float


@dataclass(slots=True)
class EtcdState:
    """Everything a snapshot holds."""

    revision: int = 1
    kv: dict[str, KeyValue] = field(default_factory=dict)
    leases: dict[int, Lease] = field(default_factory=dict)
    next_lease: int = 0x1000


# Requests and replies -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Compare:
    """``target`` of ``key`` (its ``create`` or ``mod`` revision, or its ``value``) equals
    ``value``."""

    key: str
    target: str
    value: int | bytes


@dataclass(frozen=True, slots=True)
class Put:
    key: str
    value: bytes
    lease: int = 0


@dataclass(frozen=True, slots=True)
class Delete:
    key: str


@dataclass(frozen=True, slots=True)
class Get:
    key: str


@dataclass(frozen=True, slots=True)
class Range:
    prefix: str


@dataclass(frozen=True, slots=True)
class Txn:
    compares: tuple[Compare, ...]
    success: tuple[Put | Delete | Get, ...]
    failure: tuple[Put | Delete | Get, ...] = ()


@dataclass(frozen=True, slots=True)
class Grant:
    ttl: int


@dataclass(frozen=True, slots=True)
class KeepAlive:
    lease: int


@dataclass(frozen=True, slots=True)
class Revoke:
    lease: int


@dataclass(frozen=True, slots=True)
class Watch:
    prefix: str


Request = Txn | Grant | KeepAlive | Revoke | Range | Watch


@dataclass(frozen=True, slots=True)
class TxnResult:
    succeeded: bool
    revision: int
    # One per operation run: a Get's (key, KeyValue or None), a Delete's count, None for a Put.
    results: tuple[Any, ...] = ()


@dataclass(frozen=True, slots=True)
class RangeResult:
    revision: int
    items: tuple[tuple[str, KeyValue], ...]


@dataclass(frozen=True, slots=True)
class Failure:
    """etcd refused the call (an unknown lease, say): the client raises."""

    why: str


@dataclass(frozen=True, slots=True)
class Nudge:
    """A watched prefix changed."""

    prefix: str


class EtcdServer:
    """The one etcd the cluster uses (a majority of its members, as clients see it)."""

    def __init__(self, proc: Process, rng: random.Random, trace: Trace) -> None:
        self.proc = proc
        self.rng = rng
        self.trace = trace
        self.state = EtcdState()
        # The last lease id granted by this server in any of its lives: etcd's lease ids come
        # from a generator seeded by the member id and the clock, so an id is never granted
        # twice, across restores and wipes too (a session that outlived a restore must never
        # keep another process's new lease alive with its old id).
        self.last_lease_id = self.state.next_lease
        self.up = True
        # Bumped by every restart: connections of an older incarnation are gone.
        self.incarnation = 0
        self._links: list[Any] = []  # the sim_coordinator links connected now
        self._watches: dict[int, tuple[Any, set[str]]] = {}  # id(link) -> (link, prefixes)
        self._expiry_armed = False
        # Told of every revision with the keys it changed (the simulation's ground truth).
        self.on_revision: list[Callable[[EtcdServer, list[str]], None]] = []
        # Extra processing delay (a slow etcd: its disk is busy).
        self.slow_s = 0.0

    # The server loop ---------------------------------------------------------------------

    def now(self) -> float:
        return asyncio.get_running_loop().time()

    def connect(self, link: Any) -> bool:
        if not self.up:
            return False
        self._links.append(link)
        return True

    def handle(self, link: Any, request: Request) -> tuple[float, Any]:
        """Apply ``request`` now; return (processing delay, reply)."""
        if isinstance(request, Watch):
            self._watches.setdefault(id(link), (link, set()))[1].add(request.prefix)
            return 0.0, None
        reply = self._apply(request)
        delay = 0.0003 + self.rng.random() * 0.0007 + self.slow_s
        if isinstance(request, Txn | Grant | Revoke):
            delay += 0.001 + self.rng.random() * 0.002  # a write: etcd's own fsync
        return delay, reply

    def read_now(self, prefix: str) -> RangeResult:
        """A range read of the model as it is, outside any connection (SimCoordinator's
        ``off_the_network`` prefixes)."""
        result = self._apply(Range(prefix))
        assert isinstance(result, RangeResult)
        return result

    def _apply(self, request: Request) -> Any:
        state = self.state
        if isinstance(request, Range):
            # Values are never changed in place (a put makes a new one): no copy needed.
            items = tuple(sorted((k, v) for k, v in state.kv.items() if k.startswith(request.prefix)))
            return RangeResult(state.revision, items)
        if isinstance(request, Grant):
            self.last_lease_id = state.next_lease = max(state.next_lease, self.last_lease_id) + 1
            lease = Lease(state.next_lease, request.ttl, self.now() + request.ttl)
            state.leases[lease.id] = lease
            self._arm_expiry()
            return lease.id, lease.ttl
        if isinstance(request, KeepAlive):
            found = state.leases.get(request.lease)
            if found is None:
                return 0
            found.expires_at = self.now() + found.ttl
            return found.ttl
        if isinstance(request, Revoke):
            self._revoke(request.lease)
            return True
        assert isinstance(request, Txn)
        return self._txn(request)

    def _txn(self, txn: Txn) -> TxnResult | Failure:
        if max(len(txn.compares), len(txn.success), len(txn.failure)) > MAX_TXN_OPS:
            # Refused whole, as etcd does: a manager's commit whose compares passed the limit
            # (session 63's expectations) placed no partition, tick after tick.
            return Failure("etcdserver: too many operations in txn request")
        state = self.state
        ok = all(self._holds(c) for c in txn.compares)
        ops = txn.success if ok else txn.failure
        for op in ops:
            if isinstance(op, Put) and op.lease and op.lease not in state.leases:
                return Failure(f"lease {op.lease:x} not found")
        writes = any(isinstance(op, Put | Delete) for op in ops)
        revision = state.revision + 1 if writes else state.revision
        results: list[Any] = []
        changed: list[str] = []
        for op in ops:
            if isinstance(op, Get):
                found = state.kv.get(op.key)
                results.append((op.key, found))
            elif isinstance(op, Put):
                old = state.kv.get(op.key)
                created = old.create_revision if old is not None else revision
                state.kv[op.key] = KeyValue(op.value, created, revision, op.lease)
                changed.append(op.key)
                results.append(old)  # etcd's prev_kv
            else:
                deleted = state.kv.pop(op.key, None)
                if deleted is not None:
                    changed.append(op.key)
                results.append(1 if deleted is not None else 0)
        if writes:
            state.revision = revision
            self._changed(changed)
        return TxnResult(ok, state.revision, tuple(results))

    def _holds(self, compare: Compare) -> bool:
        found = self.state.kv.get(compare.key)
        actual: int | bytes | None
        if compare.target == "value":
            actual = found.value if found is not None else None
        elif compare.target == "create":
            actual = found.create_revision if found is not None else 0
        else:
            actual = found.mod_revision if found is not None else 0
        return actual == compare.value

    # Leases --------------------------------------------------------------------------------

    def _arm_expiry(self) -> None:
        if not self._expiry_armed and self.state.leases:
            self._expiry_armed = True
            at = min(lease.expires_at for lease in self.state.leases.values())
            asyncio.get_running_loop().call_at(at, self._expire)

    def _expire(self) -> None:
        self._expiry_armed = False
        if not self.up:
            return
        now = self.now()
        for lease in sorted(self.state.leases.values(), key=lambda x: x.id):
            if lease.expires_at <= now:
                self.trace.add(now, "etcd", f"lease {lease.id:x} expired")
                self._revoke(lease.id)
        self._arm_expiry()

    def _revoke(self, lease_id: int) -> None:
        state = self.state
        if state.leases.pop(lease_id, None) is None:
            return
        keys = sorted(k for k, v in state.kv.items() if v.lease == lease_id)
        if keys:
            state.revision += 1
            for key in keys:
                del state.kv[key]
            self._changed(keys)

    def put_raw(self, key: str, value: bytes) -> None:
        """A write from outside the cluster's code (a test's corruption)."""
        self._txn(Txn((), (Put(key, value),)))

    # Watches --------------------------------------------------------------------------------

    def _changed(self, keys: list[str]) -> None:
        for callback in self.on_revision:
            callback(self, keys)
        for link, prefixes in list(self._watches.values()):
            for prefix in sorted(prefixes):
                if any(k.startswith(prefix) for k in keys):
                    link.nudge(prefix)

    # Operators' faults ------------------------------------------------------------------------

    def snapshot(self) -> EtcdState:
        """``etcdctl snapshot save``."""
        return copy.deepcopy(self.state)

    def stop(self) -> None:
        """Stop the server: every connection drops."""
        self.up = False
        self.incarnation += 1
        links, self._links = self._links, []
        self._watches.clear()
        for link in links:
            link.server_gone()

    def start(self, state: EtcdState | None = None) -> None:
        """Start again on ``state`` (None: keep the data; a fresh ``EtcdState()``: wiped)."""
        if state is not None:
            self.state = copy.deepcopy(state)
            now = self.now()
            for lease in self.state.leases.values():
                lease.expires_at = now + lease.ttl  # etcd restarts every lease's TTL
        self.up = True
        self._arm_expiry()
        for callback in self.on_revision:
            callback(self, sorted(self.state.kv))

    def wipe(self) -> None:
        self.stop()
        self.start(EtcdState())

    def restore(self, snapshot: EtcdState, bump: int = 0) -> None:
        """``etcdutl snapshot restore`` (etcd 3.5+ takes ``--bump-revision N``: the restored
        store's revision is raised by ``N``, keys keep their revisions, watches must re-read)."""
        self.stop()
        if bump:
            snapshot = copy.deepcopy(snapshot)
            snapshot.revision += bump
        self.start(snapshot)
