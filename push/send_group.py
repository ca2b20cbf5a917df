"""Consecutive single-message sends of one WebSocket connection, as one batcher item.

A producer that sends a frame per message pipelines many of them while the queue's
previous store call is under way; they all go in the next call anyway (see
:class:`push.batching.SendBatcher`). A :class:`SendGroup` makes them one item of that call
instead of one each: one entry list, one reply, one usage call and one flush of the
connection's replies, while every request keeps what a user sees of it:

- its own reply: an ``ok`` carrying its own result, or an ``error`` with its own code, under
  its own ``id``, in the order the requests came (a send without ``id`` gets none, as before);
- its own usage: each stored message counts as one ``send`` with its own request's latency
  (from its frame reaching the engine to its result), duplicates as ``deduplicated`` and
  refusals by code, exactly what a request of its own would have recorded.

A group takes sends to one queue until the batcher takes it into a store call
(:attr:`~push.batching.SendItem.taken`); the connection starts a new group after that, or
for another queue, or after a batch send (so a connection's sends to a queue reach the store
in the order it sent them).
"""

from __future__ import annotations

from backend_store.errors import InvalidRequest
from backend_store.types import NewMessage, QueueName

from .batching import SendItem, SendReply

# A request's id as the client gave it (None: answer nothing).
RequestTag = str | int | None


class SendGroup(SendItem):
    """Single-message sends to one queue; ``entries[i]`` came with ``ids[i]`` at ``started[i]``
    (``time.perf_counter()``)."""

    __slots__ = ("ids", "queue", "started")

    def __init__(
        self, queue: QueueName, entry: NewMessage, request_id: RequestTag, started: float, reply: SendReply
    ) -> None:
        entries: list[NewMessage | InvalidRequest] = [entry]
        super().__init__(entries, reply, valid=True)  # a single send that does not parse never gets here
        self.queue = queue
        self.ids: list[RequestTag] = [request_id]
        self.started = [started]

    def add(self, entry: NewMessage, request_id: RequestTag, started: float) -> None:
        """One more send; only while the group is not :attr:`taken`."""
        self.entries.append(entry)
        self.ids.append(request_id)
        self.started.append(started)
