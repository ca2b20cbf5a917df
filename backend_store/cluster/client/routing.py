"""Which partition a request goes to, and receipts that name their partition.

Pure functions (no I/O), shared by the cluster backend and its tests:

- a send with a ``dedupe_id`` goes to ``hash(dedupe_id) % P``, so a retry lands where the
  first attempt did (dedupe is per partition); a FIFO message to ``hash(group_id) % P``, so
  a group's order is one partition's order; other sends spread round robin. The hash is
  CRC-32 of the UTF-8 bytes: stable across processes and versions (never Python's ``hash``).
- a receipt handed to a client is ``"<partition id>.<node receipt>"``; the prefix is
  stripped before the ack, nack or visibility change goes to that partition's leader.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass

from ...types import NewMessage, QueueAttributes, Receipt

PartitionId = int


def stable_hash(text: str) -> int:
    """CRC-32 of the UTF-8 bytes: the same in every process, on every machine."""
    return zlib.crc32(text.encode())


def partition_index(message: NewMessage, attributes: QueueAttributes, round_robin: int) -> int:
    """The partition index (0..P-1) a message is sent to."""
    count = attributes.partitions
    if count == 1:
        return 0
    if attributes.ordering == "fifo" and message.group_id is not None:
        return stable_hash(message.group_id) % count
    if message.dedupe_id is not None:
        return stable_hash(message.dedupe_id) % count
    return round_robin % count


@dataclass(frozen=True, slots=True)
class SendPlan:
    """A batch of sends split by partition index, remembering each entry's place."""

    by_index: dict[int, list[int]]

    def messages_for(self, index: int, messages: Sequence[NewMessage]) -> list[NewMessage]:
        return [messages[i] for i in self.by_index[index]]


def plan_sends(messages: Sequence[NewMessage], attributes: QueueAttributes, round_robin: int) -> SendPlan:
    """Group a batch by partition. Entries without a key share one partition per call (one
    request, one commit), and successive calls rotate through the partitions."""
    by_index: dict[int, list[int]] = {}
    for i, message in enumerate(messages):
        by_index.setdefault(partition_index(message, attributes, round_robin), []).append(i)
    return SendPlan(by_index)


def prefix_receipt(partition: PartitionId, receipt: str) -> Receipt:
    return Receipt(f"{partition}.{receipt}")


def split_receipt(receipt: str) -> tuple[PartitionId, str] | None:
    """``(partition, node receipt)``; None for a receipt this gateway never handed out."""
    head, sep, rest = receipt.partition(".")
    if not sep or not rest or not head.isdigit() or len(head) > 18:
        return None
    return int(head), rest
