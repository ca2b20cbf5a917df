"""What the retention sweep learned of each queue, so that a queue with nothing to drop costs
it two key lookups instead of decoding its record and its oldest message.

At 10,000 queues each holding a message (an inbox per user, most owners offline), a sweep
decoded 10,000 queue records, parsed their attributes and decoded 10,000 message records every
``sweep_interval_s``: 0.23-0.47 s of CPU each time on a 2-core machine, 5-9% of a core held
by a store with nothing to drop (session 67, ``bench/sweep_cost.py``).

The memo keeps, per queue visited, the queue record's bytes at the visit and the moment its
oldest message passes retention. It needs no invalidation: every change to a queue's messages
or attributes rewrites its record (a message added takes ``next_seq`` up, one removed takes
``count`` down, a retention change is in the record), so a queue whose record still has the
bytes remembered holds the same messages under the same retention, and until that moment has
nothing past it. Anything else (other bytes, a record changed in the batch and not yet
written, no entry) is a full visit, as before.

A record is remembered by a 128-bit BLAKE2b digest of its bytes, not the bytes (about 350):
an entry takes about 200 bytes of memory (tracemalloc), 2 MB at 10,000 queues holding
messages.

Writer thread only (the sweep is a write). What the pass before remembered is what a pass
consults; queues it does not visit again (deleted, emptied) are forgotten with it.
"""

from __future__ import annotations

import hashlib


def _digest(record: bytes) -> bytes:
    return hashlib.blake2b(record, digest_size=16).digest()


class SweepMemo:
    def __init__(self) -> None:
        self._last: dict[int, tuple[bytes, int]] = {}
        self._next: dict[int, tuple[bytes, int]] = {}

    def begin(self) -> None:
        """A pass starts from the first queue (one cut short is started again)."""
        self._next = {}

    def end(self) -> None:
        """A pass reached the last queue: what it learned is what the next one consults."""
        self._last, self._next = self._next, {}

    def quiet(self, qid: int, record: bytes, now_ms: int) -> bool:
        """Whether the queue has nothing past retention: its record is as remembered and its
        oldest message was not due yet (then it is remembered for the next pass too)."""
        found = self._last.get(qid)
        if found is None or now_ms >= found[1] or found[0] != _digest(record):
            return False
        self._next[qid] = found
        return True

    def remember(self, qid: int, record: bytes, due_ms: int) -> None:
        """After a visit: ``record``, the record's bytes as this batch leaves them; ``due_ms``,
        when its oldest remaining message passes retention (a millisecond early is safe)."""
        self._next[qid] = (_digest(record), due_ms)
