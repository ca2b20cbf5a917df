"""What the cluster needs from its coordination service, as a small project-owned interface.

etcd does the consensus; nothing in Pushgate runs its own. The cluster uses four things,
each the way etcd's documentation recommends:

- **Sessions**: a lease with a TTL (about 2 s), kept alive in the background. Keys written
  under it vanish when the holder dies or freezes past the TTL. ``Session.lost`` is set
  once the session can no longer be trusted (the lease expired, or could not be renewed
  within its TTL): its holder must stop acting on anything it claimed.
- **Campaigns**: a key created only if absent (``create_revision == 0``) under a session.
  The winner's **epoch** is that key's ``create_revision``: it only grows, across holders
  and etcd restarts. Partition leaders and the manager are elected this way.
- **Watches**: a consistent read of the whole prefix at a revision R, then etcd's events
  from R+1 on, applied in order: each state handed out equals a read at its revision, and
  says which keys changed. Any doubt (a broken stream, a compacted revision, etcd gone back
  in time, a periodic re-read that disagrees) falls back to a whole read, and a periodic
  re-read runs regardless, so a missed event costs at most one re-read interval, never a
  wrong picture.
- **Fenced commits**: a transaction that applies only while a campaign key still has the
  caller's epoch; a deposed manager's changes to the partition map are refused.

:class:`Coordinator` is the interface; :mod:`.etcd_coordinator` implements it on etcd.
Errors are :class:`CoordinatorUnavailable` (code ``unavailable``: etcd unreachable).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from ...errors import Unavailable
from ...types import Epoch


class CoordinatorUnavailable(Unavailable):
    """etcd could not be reached (or did not answer in time)."""


@dataclass(frozen=True, slots=True)
class Entry:
    """One key as etcd holds it."""

    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    lease: int = 0


@dataclass(frozen=True, slots=True)
class PrefixState:
    """Every key under a prefix, as a read at one etcd revision would give it.

    ``changed``, when known, is the set of keys added, changed or removed since the state of
    revision ``since`` (a watch that applied etcd's events to that state says which keys the
    events named; None: not known, compare the entries). Neither takes part in equality."""

    prefix: str
    revision: int
    entries: dict[str, Entry] = field(default_factory=dict)
    changed: frozenset[str] | None = field(default=None, compare=False)
    since: int = field(default=0, compare=False)

    def values(self) -> dict[str, bytes]:
        """Key (without the prefix) to value."""
        return {key[len(self.prefix) :]: e.value for key, e in self.entries.items()}

    def mod_revisions(self) -> dict[str, int]:
        """Key (without the prefix) to the revision that last changed it."""
        return {key[len(self.prefix) :]: e.mod_revision for key, e in self.entries.items()}


@dataclass(frozen=True, slots=True)
class Claim:
    """The outcome of a campaign: who holds the key, and their epoch."""

    won: bool
    epoch: Epoch
    holder: bytes


@dataclass(frozen=True, slots=True)
class Registered:
    """What a write under a lease (``Coordinator.register``) found and made."""

    before: int | None  # the mod revision etcd held the key at before (None: it held none)
    revision: int  # the write's own


class Session(Protocol):
    """A lease kept alive in the background."""

    lease_id: int
    ttl_s: float
    # Set once the lease expired or could not be renewed within its TTL; never cleared.
    lost: asyncio.Event

    def valid(self) -> bool:
        """Whether the lease is surely still alive (renewed less than a TTL ago, not lost)."""

    async def close(self) -> None:
        """Stop renewing and revoke the lease (its keys vanish at once)."""


class Coordinator(Protocol):
    async def open_session(self, ttl_s: float = 2.0) -> Session:
        """Grant a lease and keep it alive until the session is closed or lost."""

    async def campaign(
        self, session: Session, key: str, value: bytes, *, unchanged: Mapping[str, bytes] | None = None
    ) -> Claim:
        """Create ``key`` under the session's lease if it is absent.

        Won: the epoch is the new key's create_revision. Lost: the current holder's
        value and epoch (it may be this session's own earlier claim: then ``won`` is True).

        ``unchanged``: keys and the values the caller read there (the partition record that
        names it leader, the cluster record whose incarnation it judged that record by); the
        claim is made in the same transaction only while etcd still holds each of them.
        Refused: ``won`` False, epoch 0, holder empty. A node whose watches are behind etcd
        cannot lead on a designation the manager has replaced (simulation seed ``all``
        100074, session 34: a node cut from etcd, back after an outage had expired every
        lease, claimed the free key on its old designation and led without entries a
        majority had acknowledged since), nor on one made before etcd was restored while it
        has not seen the incarnation raised since (``all`` 50473, session 35).

        A key held under this session's lease while one of those records changed is not a
        win either: it is deleted (on its create revision) and the claim refused. etcd
        restored from a snapshot can hold a key this session made long ago, under a lease
        still alive; led on, it acknowledged writes at an old epoch while a newer term's
        entries existed (``all`` 203747, session 36).
        """

    async def resign(self, key: str, epoch: Epoch, holder: bytes) -> bool:
        """Delete ``key`` if it still holds the claim of ``epoch`` with the value ``holder``;
        return whether it did. The value is compared too: a restored etcd numbers its
        revisions again from the snapshot's, so another node's claim can be created at the
        revision a stale claim of ours had."""

    async def register(self, session: Session, key: str, value: bytes) -> Registered:
        """Put ``key`` under the session's lease (a membership record, a published LSN);
        return the mod revision etcd held the key at before and the write's revision."""

    async def get(self, key: str) -> Entry | None:
        """Read one key (a linearizable read)."""

    async def put(self, key: str, value: bytes) -> int:
        """Write a key without a lease; return the revision."""

    async def read_prefix(self, prefix: str) -> PrefixState:
        """Read every key under ``prefix`` at one revision."""

    async def create(self, key: str, value: bytes) -> bool:
        """Write ``key`` only if it is absent (no lease); return whether it did."""

    async def create_many(self, items: Mapping[str, bytes]) -> tuple[int, frozenset[str]]:
        """Write every key of ``items`` in one transaction if none of them exists (no lease).
        Written: (the transaction's revision, which is each key's create and mod revision,
        an empty set). Not: (0, the keys found present; empty if one was deleted meanwhile).
        One round trip for many creates, where a create then a read of the key for its
        revisions were two per key (issue 49)."""

    async def compare_and_put(self, key: str, value: bytes, mod_revision: int) -> bool:
        """Write ``key`` only if its ``mod_revision`` is still the one read (0: absent);
        return whether it did (optimistic concurrency for read-modify-write)."""

    async def delete(self, key: str, mod_revision: int | None = None) -> bool:
        """Delete ``key`` (only if its ``mod_revision`` is still that one, when given);
        return whether it existed and was deleted."""

    def watch_prefix(
        self,
        prefix: str,
        *,
        reread_every_s: float = 5.0,
        stop: asyncio.Event | None = None,
        held: Callable[[], PrefixState] | None = None,
    ) -> AsyncGenerator[PrefixState, None]:
        """The prefix's state now, then again each time it changes.

        Each state yielded equals a read of the prefix at its revision (never half of a
        transaction), and revisions only grow unless etcd went back in time (restored).
        A state may carry ``changed`` (the keys changed since the state of revision
        ``since``); a consumer that holds that state may take them instead of comparing
        every key. A whole re-read also runs every ``reread_every_s``, so a broken watch
        delays news by at most that. Whole states read are yielded only when changed: changed
        from ``held()``, the state the consumer holds, when given (a consumer that also
        takes states of its own reads, ``WatchedPrefix.refresh``: compared with the last
        state yielded instead, a restored etcd whose state equals that one but not the
        consumer's would never be yielded), else from the last state yielded. Setting
        ``stop`` ends the iteration (after a read in flight): the way to stop a watch from
        another task, since a cancellation can be lost inside the etcd client; the task that
        iterates ends it with ``aclose()`` (an async generator).
        """

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
        """Apply ``puts`` and ``deletes`` in one transaction if ``fence_key`` still holds
        the claim of ``epoch`` made by ``holder`` (the value claimed), and each key of
        ``expect`` still holds the value given (None: the key is absent); return whether it
        did (nothing is changed otherwise). A key may not be both put and deleted
        (:class:`InvalidRequest`).

        ``expect`` makes what a commit was decided on part of the commit: a plan made on
        watches, or on reads made key by key, can be of an etcd that no longer holds it
        (session 62's CI run: after a restore from an older snapshot, a manager's plan on a
        partition the restored etcd did not hold wrote it back, then deleted it and
        tombstoned its copies).

        The holder is compared as well as the epoch because an epoch is a revision, and
        revisions repeat across an etcd wiped and then restored: a manager that claimed
        revision 3 in the empty etcd found the other manager's claim of revision 3 in the
        restored one, and its fence held (simulation seed `etcd` 7539, session 32)."""

    async def close(self) -> None:
        """Close the connection (sessions are not revoked: close them first)."""
