"""In-flight state kept in memory: receives that write nothing.

A persisted receive rewrites the message's state (receipt, receive count) and moves its
visibility entry, three B-tree writes per message and a commit. A receive for an
at-most-once consumer (``ack=auto``) is deleted a moment later anyway, so
:meth:`MessageOps.receive(in_memory=True)` leaves the message as it is on disk and
records the hold here instead: other receives skip it until the hold ends (acked,
released, or its visibility timeout passed), and its receipt is checked against the hold.

What that means, as RabbitMQ does for unacked deliveries: after a crash a held message is
visible again at once, with the receive count it had on disk (the lost delivery is not
counted); a released one (nack without delay) needs no write at all. Holds are used only
from the writer thread, like everything in ``message_ops``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(slots=True)
class Hold:
    token: bytes
    until_ms: int  # the end of its visibility timeout


class Holds:
    """Messages received in memory, by queue id and seq.

    Changes are made inside a write batch; each one appends its undo to the batch's
    ``on_abort`` list, so a batch that aborts (and is redone) leaves the holds as they were.
    """

    __slots__ = ("_by_queue",)

    def __init__(self) -> None:
        self._by_queue: dict[int, dict[int, Hold]] = {}

    def held(self, qid: int, now_ms: int) -> set[int]:
        """The seqs of a queue held now (expired holds are dropped on the way)."""
        holds = self._by_queue.get(qid)
        if not holds:
            return set()
        for seq in [seq for seq, hold in holds.items() if hold.until_ms <= now_ms]:
            del holds[seq]
        if not holds:
            del self._by_queue[qid]
        return set(holds)

    def get(self, qid: int, seq: int) -> Hold | None:
        holds = self._by_queue.get(qid)
        return None if holds is None else holds.get(seq)

    def put(self, qid: int, seq: int, hold: Hold, on_abort: list[Callable[[], object]]) -> None:
        """Hold a message (or replace its hold)."""
        previous = self._set(qid, seq, hold)
        on_abort.append(functools.partial(self._set, qid, seq, previous))

    def drop(self, qid: int, seq: int, on_abort: list[Callable[[], object]]) -> None:
        previous = self._set(qid, seq, None)
        if previous is not None:
            on_abort.append(functools.partial(self._set, qid, seq, previous))

    def _set(self, qid: int, seq: int, hold: Hold | None) -> Hold | None:
        holds = self._by_queue.setdefault(qid, {})
        previous = holds.pop(seq, None)
        if hold is not None:
            holds[seq] = hold
        elif not holds:
            del self._by_queue[qid]
        return previous

    def __len__(self) -> int:
        return sum(len(holds) for holds in self._by_queue.values())
