"""The interface the gateway and the delivery engine use to reach storage, by role.

Two implementations, picked by URL (:func:`backend_store.url.open_backend`):
``lmdb:///path`` (embedded, the default) and ``cluster://etcd-host:port,...``. Either is a
:class:`Backend`: one storage with two roles, each its own protocol, so a part of the gateway
is typed by the role it uses and reads alone:

- :class:`QueueStore`: queues and messages (the push engine, the send path, long-polls, the
  queue cache, the quota's count);
- :class:`MetadataStore`: a small key-value store of opaque values per namespace (tenants,
  API keys, JWT and AWS keys, limits documents, alert state, SQS tags and move tasks).

Optional capabilities (standing receives, receives held in memory, receipt shards, dead
letters, storage stats, metadata watches, message events, cluster status) are small protocols
below, checked with ``isinstance``; backend nodes use :class:`ReplicaStore`.

Contract, for every implementation:

- **Durability.** A method that returns normally has its effect on disk (fsynced;
  in sync replication, on a majority of replicas). Errors are :class:`PushgateError`
  subclasses with a stable ``code``; anything else is a bug.
- **Atomicity.** Each call is atomic. ``send`` of a batch is atomic per entry: each
  entry gets its own result or error, in order. A dead-letter move is atomic.
- **At-least-once.** A received message is invisible until its receipt is acked,
  nacked or its visibility timeout ends; then it is visible again with
  ``receive_count`` one higher. A receipt stops working as soon as its message is
  visible again, so a stale receipt never deletes a message someone else holds.
- **Ordering.** ``best_effort`` queues hand out visible messages in the order they
  became visible (send order, unless delayed or redelivered). ``fifo`` queues hand
  out each ``group_id``'s messages strictly in send order with at most one in
  flight per group; different groups proceed in parallel.
- **Dedupe.** A send whose ``dedupe_id`` (or body hash with ``content_dedupe``) was
  seen within ``dedupe_window_s`` stores nothing and returns the original id and
  seq with ``duplicate=True``.
- **Tenancy.** Every queue belongs to one tenant; a call never sees another
  tenant's queues or receipts.
- **Metadata.** Each metadata call is atomic and durable as above; ``meta_put`` with
  ``only_if_absent`` stores only a new key (a compare-and-set two writers can race on).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from .commit_stats import CommitStats
from .errors import PushgateError
from .types import (
    AckResult,
    Epoch,
    LogEntry,
    Lsn,
    NewMessage,
    PeekedMessage,
    QueueInfo,
    QueueName,
    ReceivedMessage,
    SendResult,
    StorageUsage,
    TenantId,
)

# Called on the event loop after a commit that made messages of a queue visible
# now or later (a send, a nack, a release), except where a standing receive took them all
# in that commit (see StandingReceive). Cheap and synchronous: it only wakes.
ChangeListener = Callable[[TenantId, QueueName], None]


@runtime_checkable
class QueueStore(Protocol):
    """Queues and messages; see the module docstring for the contract."""

    def add_listener(self, listener: ChangeListener) -> None:
        """Register a wake-up callback (see :data:`ChangeListener`)."""

    # Queues ---------------------------------------------------------------

    async def create_queue(
        self, tenant: TenantId, name: QueueName, attributes: Mapping[str, Any]
    ) -> tuple[QueueInfo, bool]:
        """Create a queue; return it and whether it was created.

        Creating a queue that exists with the same attributes returns it with
        ``False``; with different ones it raises :class:`QueueExists`.
        """

    async def get_queue(self, tenant: TenantId, name: QueueName) -> QueueInfo:
        """Return a queue with fresh stats, or raise :class:`QueueNotFound`."""

    async def list_queues(
        self, tenant: TenantId, *, after: str = "", limit: int | None = None, prefix: str = ""
    ) -> list[QueueInfo]:
        """Return the tenant's queues sorted by name, with stats: a page of up to ``limit``
        (None: all) whose names come after ``after`` and start with ``prefix``."""

    async def update_queue(self, tenant: TenantId, name: QueueName, changes: Mapping[str, Any]) -> QueueInfo:
        """Change mutable attributes; ``ordering`` is immutable."""

    async def delete_queue(self, tenant: TenantId, name: QueueName) -> None:
        """Delete a queue and all its messages. Receipts of it stop working."""

    async def purge_queue(self, tenant: TenantId, name: QueueName) -> int:
        """Delete every message of a queue (visible, delayed and in flight); return how many."""

    # Messages -------------------------------------------------------------

    async def send(
        self, tenant: TenantId, queue: QueueName, messages: Sequence[NewMessage]
    ) -> list[SendResult | PushgateError]:
        """Store messages; one result or error per entry, in order.

        A missing queue raises :class:`QueueNotFound` for the whole call.
        """

    async def receive(
        self,
        tenant: TenantId,
        queue: QueueName,
        max_messages: int,
        visibility_timeout_s: float | None = None,
    ) -> list[ReceivedMessage]:
        """Take up to ``max_messages`` visible messages and make them invisible.

        Never waits: long-polling is the caller's job, driven by listeners.
        Messages past ``max_receives`` are moved to the dead-letter queue instead.
        """

    async def ack(
        self, tenant: TenantId, receipts: Sequence[str], queue: QueueName | None = None
    ) -> AckResult:
        """Delete the messages of valid receipts; list the others with a code.

        With ``queue`` given, receipts of other queues fail with ``invalid_receipt``, and
        a ``queue`` that does not exist raises ``QueueNotFound`` (so does nack).
        """

    async def nack(
        self,
        tenant: TenantId,
        receipts: Sequence[str],
        delay_s: float = 0,
        queue: QueueName | None = None,
    ) -> AckResult:
        """Make the messages of valid receipts visible again after ``delay_s``."""

    async def change_visibility(
        self, tenant: TenantId, queue: QueueName, receipt: str, timeout_s: float
    ) -> None:
        """Keep a received message invisible for ``timeout_s`` from now.

        ``QueueNotFound`` if the queue does not exist, else ``InvalidReceipt`` for a bad receipt."""

    async def next_visible_at(self, tenant: TenantId, queue: QueueName) -> float | None:
        """When the earliest not-yet-visible message of a queue becomes visible (None: none).

        Messages visible now are not counted (receive them); nor are FIFO messages
        waiting behind their group's head (they wait for an ack, not for time).
        """


@runtime_checkable
class MetadataStore(Protocol):
    """Tenants, API keys, JWT and AWS keys, limits, alert state, SQS tags and move tasks:
    opaque bytes per namespace, each call atomic and durable. Names are Unicode without NUL, a
    namespace is non-empty and has no ``/`` (the cluster's keys are paths), and a namespace and
    key together fit in 400 bytes."""

    async def meta_get(self, namespace: str, key: str) -> bytes | None:
        """Return a metadata value, or None."""

    async def meta_put(self, namespace: str, key: str, value: bytes, *, only_if_absent: bool = False) -> bool:
        """Store a value; with ``only_if_absent``, store it only if the key is new. Return whether stored."""

    async def meta_delete(self, namespace: str, key: str) -> bool:
        """Delete a value; return whether it existed."""

    async def meta_list(self, namespace: str, prefix: str = "") -> list[tuple[str, bytes]]:
        """Return ``(key, value)`` pairs of a namespace whose key starts with ``prefix``, sorted."""


@runtime_checkable
class Backend(QueueStore, MetadataStore, Protocol):
    """One storage in both roles, as a URL opens it, with the life cycle they share."""

    async def start(self) -> None:
        """Open storage and start background work (writer, sweeper). Idempotent."""

    async def close(self) -> None:
        """Finish queued writes, stop background work and close storage."""

    async def check_writable(self) -> None:
        """Commit a no-op write; raise :class:`Unavailable` if storage cannot take writes."""


DeliverCallback = Callable[[list[ReceivedMessage]], None]


@runtime_checkable
class StandingReceive(Protocol):
    """Optional capability: receive as part of the commit that makes messages visible.

    A dispatcher waiting for messages registers a demand; the next batch that sends (or
    nacks) into the queue also receives up to ``max_messages`` for it in the same
    transaction, and ``deliver`` is called on the caller's event loop once that batch is
    committed. Send-to-push then costs one commit instead of two. A demand is served at
    most once; the caller owns what it is handed (and releases what it cannot use).

    One commit, one signal: a delivery short of ``max_messages`` took everything the queue
    had visible at that commit (on a cluster: on that partition), so the delivery is the
    commit's wake-up and no change listener is called for that queue (there is nothing left
    to find); after a full delivery the listeners are called as usual, just before it.
    """

    def set_demand(
        self,
        tenant: TenantId,
        queue: QueueName,
        max_messages: int,
        visibility_timeout_s: float | None,
        deliver: DeliverCallback,
        in_memory: bool = False,
    ) -> None:
        """Register (or replace) the queue's demand; call on the event loop. ``in_memory``:
        receive as :meth:`InMemoryReceive.receive_in_memory` does."""

    def clear_demand(self, tenant: TenantId, queue: QueueName, deliver: DeliverCallback) -> None:
        """Withdraw the demand registered with ``deliver``, if it is still waiting."""


@runtime_checkable
class EarlyChanges(Protocol):
    """Optional capability: hear of a queue's new messages as the commit that makes them
    visible begins, before it ends (embedded stores only).

    For telling *other processes* that share the store (the Redis wake-ups between gateways
    on one data directory): their receive waits for the commit anyway (LMDB has one writer
    at a time) and syncs the file with its own commit, so they deliver nothing that is not
    on disk, and the wake-up's trip through Redis overlaps this commit's fsyncs instead of
    following them. Never for this process's own receives: they would run before the
    commit's standing receives are served. A commit that fails has woken them for nothing
    (an empty receive). Listeners are called on the store's event loop.
    """

    def add_early_listener(self, listener: ChangeListener) -> None: ...


@runtime_checkable
class InMemoryReceive(Protocol):
    """Optional capability: a receive that keeps in-flight state in memory, writing nothing
    for a first delivery (embedded stores only: replicas must agree, so a cluster never holds).

    For push subscriptions, which ack (or, with ``ack=auto``, delete) what they are handed
    within moments: the receive's writes, and often its commit, are saved. Messages never
    received before are held as after a ``receive`` (other receives skip them; their
    receipts ack, nack and change visibility as usual) until acked, released, or their
    visibility timeout passes; at most a bounded number per queue, the rest are written.
    Redeliveries are written. Every delivery counts toward ``receive_count`` and
    ``max_receives`` as with ``receive``: a held one's count is written when it ends without
    an ack. After a crash, messages held at that moment are visible again at once, with the
    receive count they had on disk (that delivery is not counted); a clean ``close`` writes
    those counts too. A process holds only while no other process has the store open
    (docs/store.md, "Receives held in memory").
    """

    async def receive_in_memory(
        self,
        tenant: TenantId,
        queue: QueueName,
        max_messages: int,
        visibility_timeout_s: float | None = None,
    ) -> list[ReceivedMessage]:
        """Receive up to ``max_messages`` visible messages, holding them in memory."""


@runtime_checkable
class ReceiptShards(Protocol):
    """Optional capability: which shard settles a receipt, where a backend has several that
    commit independently (a cluster's partitions, each with its own leader). The push
    engine batches acks and nacks per shard, so a slow or unreachable shard holds up only
    its own receipts. A backend without it is one shard (the embedded store: one writer)."""

    def receipt_shard(self, receipt: str) -> int | None:
        """The receipt's shard; None for a receipt that names none (the backend refuses it).
        Pure and cheap: called for every receipt an ack or nack carries."""


@runtime_checkable
class ReplicaStore(Protocol):
    """Optional capability: one partition replica's log, for backend nodes to replicate.

    The store knows no peers; a node layer ships entries between stores. Contract:

    - Every committed write batch is one :class:`LogEntry`: the next LSN (no gaps), the
      store's current epoch, and a record that :meth:`apply_replicated` on another replica
      reproduces exactly.
    - **Fencing in storage.** The store keeps the highest epoch it has seen, in the same
      transaction as the data: :meth:`raise_epoch` and applied entries move it up, never
      down; anything older is refused with :class:`~backend_store.errors.StaleEpoch`, so a
      deposed leader can never have its batches acknowledged by a fenced replica.
    - Applied entries must follow the log without a gap
      (:class:`~backend_store.errors.ReplicationGap` otherwise: resend from
      :attr:`last_lsn`, or re-seed from a :meth:`snapshot` when the leader has trimmed them).
    - :meth:`truncate_after` rolls back entries past an LSN (the unacknowledged tail of a
      deposed leader) and keeps the fence.
    """

    @property
    def last_lsn(self) -> Lsn:
        """The LSN of the newest committed entry (0: none)."""

    @property
    def epoch(self) -> Epoch:
        """The highest epoch this replica has seen (0: none)."""

    @property
    def last_entry(self) -> tuple[Lsn, Epoch | None]:
        """:attr:`last_lsn` and the epoch of its entry (None: no such entry is logged), read
        together: consistent even while a commit is being made current."""

    async def read_replication_log(self, after: Lsn, limit: int = 1000) -> list[LogEntry]:
        """Committed entries with LSN > ``after``, oldest first, at most ``limit``."""

    async def first_retained_lsn(self) -> Lsn | None:
        """The oldest entry still kept (None: the log is empty)."""

    async def apply_replicated(self, entries: Sequence[LogEntry], epoch: Epoch | None = None) -> Lsn:
        """Apply a leader's entries in order; return the new last LSN.

        ``epoch`` is the sending leader's term (default: the newest entry's): it is what the
        fence is checked against and raised to, since a new leader also ships entries of
        earlier terms. A stale sender, entry epochs out of order or a gap anywhere refuses
        the whole call before anything is written. The entries go in one commit, or in
        several where room is short (the LMDB store's reserve); a commit that fails leaves
        the ones before it applied: a prefix of the leader's log, each commit durable.
        """

    async def raise_epoch(self, epoch: Epoch) -> Epoch:
        """Start term ``epoch`` here (a new leader, or a follower told of one); refuse an older one.

        Entries this store writes from then on carry ``epoch``.
        """

    async def truncate_after(self, lsn: Lsn, epoch: Epoch | None = None) -> int:
        """Undo and drop the entries after ``lsn``; return how many.

        With ``epoch`` (the term of the leader whose log conflicts with ours), an older term
        is refused with :class:`~backend_store.errors.StaleEpoch` and the fence rises to it
        in the same transaction. Raises :class:`~backend_store.errors.ReplicationGap` if the
        entries can no longer be undone (trimmed): the replica must be re-seeded.
        """

    def ship_early(
        self, offer: Callable[[LogEntry], None] | None, lost: Callable[[Lsn], None] | None
    ) -> None:
        """Hand each new entry to ``offer`` before its own commit, from the thread that
        writes it, so a leader can ship it while it fsyncs; ``lost(lsn)`` when that commit
        then fails (the entry may be on followers: the leader must end its term). None
        stops it."""

    def hold_log_from(self, lsn: Lsn | None) -> None:
        """Keep entries from ``lsn`` on (the slowest follower's need); None releases the hold."""

    async def snapshot(self, target: Path) -> None:
        """Write a consistent copy of the whole store (data, log, fence) to ``target``."""


@runtime_checkable
class DeadLetters(Protocol):
    """Optional capability: look at a queue without changing it, and redrive dead letters."""

    async def peek(self, tenant: TenantId, queue: QueueName, max_messages: int) -> list[PeekedMessage]:
        """Up to ``max_messages`` messages in seq order; no receipt, no receive count, nothing changes."""

    async def redrive(self, tenant: TenantId, queue: QueueName, to: QueueName, max_messages: int) -> int:
        """Move up to ``max_messages`` visible messages of ``queue`` to ``to``; return how many.

        Exactly once: a message leaves ``queue`` in the same atomic step that stores it in
        ``to``, so a repeated call, or one cut short by a crash, never moves a message twice.
        """


@runtime_checkable
class StorageStats(Protocol):
    """Optional capability: how full the store is. Embedded stores: their own file, at once.
    The cluster: the fullest partition environment any node published (seconds old)."""

    async def storage_usage(self) -> StorageUsage:
        """Bytes used, the current map size and the largest it may grow to."""

    def commit_stats(self) -> CommitStats | None:
        """Group-commit batch sizes and commit durations (None before start)."""


MetaListener = Callable[[str, str], None]


@runtime_checkable
class MetadataWatch(Protocol):
    """Optional capability: hear of metadata and queue changes made anywhere (distributed
    backends, whose metadata other gateways change). Listeners are called on the event loop,
    after the change is visible to reads; the gateway drops its cached copies there."""

    def add_meta_listener(self, listener: MetaListener) -> None:
        """``listener(namespace, key)`` after a metadata value was written or deleted."""

    def add_queue_listener(self, listener: ChangeListener) -> None:
        """``listener(tenant, queue)`` after a queue was created, changed or deleted."""

    def watched_queue(self, tenant: TenantId, name: QueueName) -> QueueInfo | None:
        """The queue as the watch holds it: its name, creation time and attributes, with its
        stats left empty (:meth:`Backend.get_queue` gathers those, from every partition on a
        cluster). None when the watch holds no record of it: no such queue, or one created
        elsewhere a moment ago that the watch has not shown yet. No I/O."""


@dataclass(frozen=True, slots=True)
class MessageEvent:
    """Something that happened to ``count`` messages of a queue inside the store, with no
    caller asking for it: ``kind`` is ``dead_lettered`` (moved to the queue's dead-letter
    queue after ``max_receives``; ``queue`` is the source) or ``expired`` (dropped past
    ``retention_s``)."""

    tenant: TenantId
    queue: QueueName
    kind: str
    count: int


DEAD_LETTERED = "dead_lettered"
EXPIRED = "expired"
# Called on the event loop after a commit, with that commit's events (never empty).
EventListener = Callable[[Sequence[MessageEvent]], None]


@runtime_checkable
class MessageEvents(Protocol):
    """Optional capability: report dead-letter moves and expiries after they commit.

    Each event is reported once, by the process whose commit made it (the gateway whose
    receive found the message past ``max_receives``, or whose sweeper dropped it), so
    gateways sharing one store count each move once between them.
    """

    def add_event_listener(self, listener: EventListener) -> None:
        """Register ``listener`` for the events of every later commit."""


@runtime_checkable
class ReloadsTls(Protocol):
    """Optional capability: a backend that dials its storage over TLS (``cluster://`` with
    ``tls_*``) loads renewed certificate files without a restart. It looks by itself every
    few seconds; ``reload_tls`` looks at once (a gateway's SIGHUP) and says whether it loaded."""

    def reload_tls(self) -> bool: ...


@runtime_checkable
class ClusterStatus(Protocol):
    """Optional capability: the cluster's nodes and partitions (distributed backends)."""

    async def cluster_status(self) -> Mapping[str, Any]:
        """API.md's ``GET /v1/cluster`` document: ``{"nodes": [{"id", "address", "state", "lag"}],
        "partitions": [{"queue", "index", "leader", "followers", "epoch", "lsn"}]}``."""


@runtime_checkable
class QueuePlacements(Protocol):
    """Optional capability: the partitions a queue on shared partitions lives on, by index
    (docs/cluster.md section 12), for pages that show a queue's partitions; None for a queue
    with partitions of its own (the status document names those by queue) or unknown here."""

    def placement_of(self, tenant: TenantId, name: QueueName) -> tuple[int, ...] | None: ...


__all__ = [
    "Backend",
    "ChangeListener",
    "ClusterStatus",
    "DeadLetters",
    "DeliverCallback",
    "EventListener",
    "InMemoryReceive",
    "MessageEvent",
    "MessageEvents",
    "MetaListener",
    "MetadataStore",
    "MetadataWatch",
    "PushgateError",
    "QueuePlacements",
    "QueueStore",
    "ReceiptShards",
    "ReplicaStore",
    "StandingReceive",
    "StorageStats",
]
