"""What the retention sweep learned of each queue, so that a queue with nothing to drop costs
it two key lookups instead of decoding its record and its oldest message.

At 10,000 queues each holding a message (an inbox per user, most owners offline), a sweep
decoded 10,000 queue records, parsed their attributes and decoded 10,000 message records every
``sweep_interval_s``: 0.23-0.47 s of CPU each time on a 2-core machine, 5-9% of a core held
by a store with nothing to drop (session 67, ``bench/sweep_cost.py``).

The memo keeps, per queue visited, the moment its oldest message passes retention, and what
that moment depends on. Only two things can bring it earlier: a lower retention (the queue's
attributes, in its record) and a message older than the oldest one found coming in. A message
sent, or redriven, is sent *now*, so it is never older than one already there (a wall clock
stepped back is the exception: such a message is dropped late by at most the step); one
dead-lettered keeps its original send time, and is therefore indexed in ``expiry``, whose
first key for the queue is its oldest such message. So a queue is passed while:

- its record, read at the key remembered, has the bytes remembered (nothing about it
  changed: the quick check, one key read), or
- its attributes are as remembered and its first ``expiry`` key is too (it took sends,
  acks or receives since: one record decode and one key read). Under sends every queue's
  record changes between passes, and a memo of the record alone visited each in full again
  (``bench/sweep_cost.py --sends``, 10,000 queues each sent to between passes: 0.37-0.65 s
  of CPU a pass with it, 0.20-0.23 s with this, session 68);

and until that moment. A message taken away only makes the oldest younger, so a queue passed
on an old moment is at worst visited early. Anything else (a record changed in the batch and
not yet written, no entry) is a full visit, as before.

A record is remembered by its key and a 128-bit BLAKE2b digest of its bytes, not the bytes
(about 350), and its attributes by one object shared by every queue with the same ones: an entry
takes about 300 bytes of memory, 3 MB at 10,000 queues holding messages. The key spares the
quick check the queue-id index and ``queue_key``'s name checks (its cache of 8,192 keys misses
every time over a sweep of more queues).

Writer thread only (the sweep is a write). What the pass before remembered is what a pass
consults; queues it does not visit again (deleted, emptied) are forgotten with it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .records import QueueRecord, pack


def _digest(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=16).digest()


@dataclass(slots=True, frozen=True)
class _Seen:
    key: bytes  # the queue record's key
    record: bytes  # digest of the queue record's bytes
    attributes: dict[str, Any]  # its attributes (one object per distinct value: SweepMemo._shared)
    first_moved: bytes | None  # its first ``expiry`` key
    due_ms: int


class SweepMemo:
    def __init__(self) -> None:
        self._last: dict[int, _Seen] = {}
        self._next: dict[int, _Seen] = {}
        # One object per distinct attributes, by their encoding (most queues share them).
        self._shared: dict[bytes, dict[str, Any]] = {}

    def begin(self) -> None:
        """A pass starts from the first queue (one cut short is started again)."""
        self._next = {}

    def end(self) -> None:
        """A pass reached the last queue: what it learned is what the next one consults."""
        self._last, self._next = self._next, {}
        live = {id(seen.attributes) for seen in self._last.values()}
        self._shared = {k: a for k, a in self._shared.items() if id(a) in live}

    def quiet(
        self,
        qid: int,
        now_ms: int,
        record_at: Callable[[bytes], bytes | None],
        first_moved: Callable[[], bytes | None],
    ) -> bool:
        """Whether the queue has nothing past retention (then it is remembered for the next
        pass too): its oldest message was not due yet, and neither its retention nor its
        oldest moved-in message can have changed since (module docstring). ``record_at``
        reads the bytes of the record at a key as stored (None: none, or changed in this
        batch); ``first_moved``, the queue's first ``expiry`` key, asked only when its record
        changed."""
        seen = self._last.get(qid)
        if seen is None or now_ms >= seen.due_ms:
            return False
        raw = record_at(seen.key)
        if raw is None:
            return False
        digest = _digest(raw)
        if digest != seen.record:
            # Changed: still this queue (not one made again under its name), with the same
            # attributes and the same oldest moved-in message?
            record = QueueRecord.decode(raw)
            if record.qid != qid or record.attributes != seen.attributes:
                return False
            if first_moved() != seen.first_moved:
                return False
            seen = _Seen(seen.key, digest, seen.attributes, seen.first_moved, seen.due_ms)
        self._next[qid] = seen
        return True

    def remember(self, key: bytes, record: QueueRecord, first_moved: bytes | None, due_ms: int) -> None:
        """After a visit: ``record``, the queue's record as this batch leaves it, at ``key``;
        ``first_moved``, its first ``expiry`` key now; ``due_ms``, when its oldest remaining
        message passes retention (a millisecond early is safe)."""
        attributes = self._shared.setdefault(pack(record.attributes), record.attributes)
        self._next[record.qid] = _Seen(key, _digest(record.encode()), attributes, first_moved, due_ms)
