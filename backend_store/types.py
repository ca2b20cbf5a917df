"""Records exchanged with a :class:`~backend_store.backend.Backend`.

Times are Unix epoch seconds as floats everywhere. The per-message records (``NewMessage``,
``SendResult``, ``ReceivedMessage``) are plain, not frozen, dataclasses: treat them as
read-only; a frozen one cost four times as much to build, on every message.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NewType

TenantId = NewType("TenantId", str)
QueueName = NewType("QueueName", str)
MessageId = NewType("MessageId", str)
Receipt = NewType("Receipt", str)
Lsn = NewType("Lsn", int)
# A partition leader's term: only grows. It is the create_revision of its etcd leader key
# behind the cluster's incarnation (docs/cluster.md, "Metadata survives etcd"): an etcd
# restored from a snapshot counts revisions again from an older point, and the incarnation,
# raised when etcd is found to have gone back, keeps every new epoch above every fence. One
# integer on the wire and in stores (incarnation * 2**40 + revision), so a cluster that never
# restored etcd (incarnation 0) has the epochs it always had.
Epoch = NewType("Epoch", int)
EPOCH_REVISION_BITS = 40


def make_epoch(incarnation: int, revision: int) -> Epoch:
    """The epoch of a leader key created at ``revision`` in the cluster's ``incarnation``."""
    if not 0 <= revision < 1 << EPOCH_REVISION_BITS or incarnation < 0:
        raise ValueError(f"no epoch for incarnation {incarnation}, revision {revision}")
    return Epoch((incarnation << EPOCH_REVISION_BITS) | revision)


def epoch_incarnation(epoch: int) -> int:
    return epoch >> EPOCH_REVISION_BITS


def epoch_revision(epoch: int) -> int:
    """The etcd revision of the leader key an epoch was made from (what etcd compares)."""
    return epoch & ((1 << EPOCH_REVISION_BITS) - 1)


@dataclass(frozen=True, slots=True)
class QueueAttributes:
    """A queue's attributes with docs/api.md's defaults; see :mod:`backend_store.attributes` for bounds."""

    max_message_bytes: int = 262144
    max_messages: int | None = None
    visibility_timeout_s: float = 30
    retention_s: float = 345600
    delay_s: float = 0
    receive_wait_s: float = 0
    max_receives: int | None = None
    dead_letter_queue: str | None = None
    ordering: str = "best_effort"
    dedupe_window_s: float = 300
    content_dedupe: bool = False
    replication_factor: int = 1
    replication_mode: str = "sync"
    # Cluster mode: how many partitions the queue is spread over (docs/cluster.md).
    partitions: int = 1

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


@dataclass(frozen=True, slots=True)
class QueueStats:
    visible: int = 0
    in_flight: int = 0
    delayed: int = 0
    oldest_age_s: float | None = None
    consumers: int = 0
    sent_total: int = 0
    acked_total: int = 0
    dead_lettered_total: int = 0

    def to_dict(self) -> dict[str, Any]:
        # Spelled out: a page of queues and a partition's counts encode thousands at a time.
        return {
            "visible": self.visible,
            "in_flight": self.in_flight,
            "delayed": self.delayed,
            "oldest_age_s": self.oldest_age_s,
            "consumers": self.consumers,
            "sent_total": self.sent_total,
            "acked_total": self.acked_total,
            "dead_lettered_total": self.dead_lettered_total,
        }


@dataclass(frozen=True, slots=True)
class QueueInfo:
    tenant: TenantId
    name: QueueName
    created_at: float
    attributes: QueueAttributes
    stats: QueueStats = field(default_factory=QueueStats)


@dataclass(slots=True)
class NewMessage:
    """A message to send. ``body`` is raw bytes; ``is_text`` says it came as UTF-8 text."""

    body: bytes
    is_text: bool = True
    attributes: dict[str, str] = field(default_factory=dict)
    group_id: str | None = None
    dedupe_id: str | None = None
    delay_s: float | None = None


@dataclass(slots=True)
class SendResult:
    id: MessageId
    seq: int
    duplicate: bool = False


@dataclass(slots=True)
class ReceivedMessage:
    """A message handed to one consumer, invisible to others until ``receipt`` expires."""

    queue: QueueName
    id: MessageId
    seq: int
    receipt: Receipt
    body: bytes
    is_text: bool
    attributes: dict[str, str]
    group_id: str | None
    sent_at: float
    receive_count: int
    visible_at: float


@dataclass(frozen=True, slots=True)
class ReceiptFailure:
    receipt: str
    code: str


@dataclass(frozen=True, slots=True)
class AckResult:
    acked: int
    failed: list[ReceiptFailure] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class LogEntry:
    """One committed batch as replicated: its LSN, the epoch of the leader that wrote it, and
    its mutations (an opaque record only the store that wrote it knows how to apply)."""

    lsn: Lsn
    epoch: Epoch
    record: bytes


@dataclass(slots=True)
class PeekedMessage:
    """A message as peek shows it: no receipt, nothing changed. ``state`` is
    ``visible``, ``delayed`` or ``in_flight``."""

    queue: QueueName
    id: MessageId
    seq: int
    body: bytes
    is_text: bool
    attributes: dict[str, str]
    group_id: str | None
    sent_at: float
    receive_count: int
    state: str


@dataclass(frozen=True, slots=True)
class StorageUsage:
    """How full a store's file is: ``used_bytes`` of ``map_size`` now, which may grow to ``max_map_size``."""

    used_bytes: int
    map_size: int
    max_map_size: int

    @property
    def used_ratio(self) -> float:
        """Use of the largest map the store may grow to (what a "map full" error is about)."""
        return self.used_bytes / self.max_map_size if self.max_map_size else 0.0
