"""Consecutive single-message sends of one WebSocket connection, as one send-path item.

A producer that sends a frame per message pipelines many of them while the queue's
previous store call is under way; they all go in the next call anyway (see
:class:`push.send_path.SendPath`). A :class:`SendGroup` makes them one item of that call
instead of one each: one entry list, one reply, one usage call and one flush of the
connection's replies, while every request keeps what a user sees of it:

- its own reply: an ``ok`` carrying its own result, or an ``error`` with its own code, under
  its own ``id``, in the order the requests came (a send without ``id`` gets none, as before);
- its own usage: each stored message counts as one ``send`` with its own request's latency
  (from its frame reaching the engine to its result), duplicates as ``deduplicated`` and
  refusals by code, exactly what a request of its own would have recorded;
- its own quota decision: each send is admitted or refused (``quota_exceeded``) alone.

A group takes sends to one queue until the path takes it into a store call
(:attr:`~push.send_path.SendItem.taken`); the connection starts a new group after that, or
for another queue, or after a batch send (so a connection's sends to a queue reach the store
in the order it sent them).
"""

from __future__ import annotations

import time

from backend_store.errors import PushgateError
from backend_store.types import NewMessage, QueueName, TenantId

from .observed import record_group_sends
from .observer import WS, Observer
from .send_path import Allowance, SendItem, SendReply, SendResults

# A request's id as the client gave it (None: answer nothing).
RequestTag = str | int | None


class SendGroup(SendItem):
    """Single-message WebSocket sends to one queue; ``entries[i]`` came with ``ids[i]`` at
    ``times[i]`` (``time.perf_counter()``)."""

    __slots__ = ("ids", "queue", "times")

    def __init__(
        self, queue: QueueName, entry: NewMessage, request_id: RequestTag, started: float, reply: SendReply
    ) -> None:
        entries: list[NewMessage | PushgateError] = [entry]
        # A single send that does not parse never gets here: every entry is valid.
        super().__init__(entries, reply, WS, started, valid=True)
        self.queue = queue
        self.ids: list[RequestTag] = [request_id]
        self.times = [started]

    def add(self, entry: NewMessage, request_id: RequestTag, started: float) -> None:
        """One more send; only while the group is not :attr:`taken`."""
        self.entries.append(entry)
        self.ids.append(request_id)
        self.times.append(started)

    @property
    def requests(self) -> int:
        return len(self.entries)

    def take_quota(self, allowance: Allowance) -> None:
        # Each send is a request of its own: refused ones become their error entry.
        entries = self.entries
        for i, entry in enumerate(entries):
            if isinstance(entry, NewMessage) and (refusal := allowance.take(1)) is not None:
                entries[i] = refusal
                self.valid = False

    def record(self, observer: Observer, tenant: TenantId, queue: QueueName, results: SendResults) -> int:
        return record_group_sends(
            observer, tenant, queue, self.transport, self.entries, self.times, results, time.perf_counter()
        )
