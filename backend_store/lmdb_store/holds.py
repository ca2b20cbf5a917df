"""In-flight state kept in memory: receives that write nothing.

A written receive writes the message's state (receipt, receive count) and moves its
visibility entry: three B-tree writes, where a message received in memory and acked costs
four in its whole life (docs/store.md, "How a message is stored"). A receive with
``in_memory=True`` (:meth:`MessageOps.receive`) leaves a message that was never received
as it is on disk and records a *hold* here instead: other receives skip it until the hold
ends (acked, released, or its visibility timeout passed), and its receipt is checked
against the hold. The rules (docs/store.md, "Receives held in memory"):

- **Only first deliveries are held.** A message whose stored receive count is above 0 is
  received as before, written.
- **Every delivery counts.** A hold stands for one receive. When it ends with an ack the
  message is deleted; when it ends without one (nack, visibility changed to 0, visibility
  timeout) its count is written then, by the operation that ends it (a timeout: by the next
  receive of the queue, which notices it), so the next receive sees it, for
  ``max_receives`` too. ``receive_count`` goes 1, 2, 3... as if every receive had been
  written; a crash loses only the counts of the deliveries held at that moment (a clean
  close writes them).
- **At most ``max_held`` holds per queue.** Beyond it receives are written as before; that
  bounds memory and the walk a receive may make past held entries (see ``start``).

The skip hint (``QueueHolds.start``): a held message keeps its visibility entry at the front
of the index, so a receive would walk past every held entry first. Each queue keeps a key
below which every visibility entry is held (or gone); a receive starts there. Anything that
puts an entry below it (``Writes.index_listener``: a send or nack in the same millisecond, a
FIFO promotion, a clock stepped back) or makes a held entry receivable again (release,
expiry) lowers it: lowering is always safe. Only a receive raises it, to the end of what it
walked, and not past anything put or released while it walked (``MessageOps.receive``).
Replicas apply entries without the listener: a backend node never holds (node_demands.py).

Holds are used only from the writer thread, like everything in ``message_ops`` (stats and
``next_visible_at`` read a count and a heap top from other threads); a batch that aborts
rolls its changes back through ``Writes.on_abort``. Every delete of a message forgets its
hold (ack, retention sweep, purge, queue delete; dead-letter moves, drops past retention
and redrives take only messages that are not held), so a held message is always stored.
"""

from __future__ import annotations

import functools
import heapq
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from ..options import DEFAULT_MAX_HELD
from .keys import visibility_key
from .records import DeliveryState

Undo = list[Callable[[], object]]

# A hold: (receipt token, end of its visibility timeout in ms, the message's state as it is
# on disk). A plain tuple: one is made per delivery, on the writer's hot path. The state is
# what an ack needs to delete the message, and what a hold that ends unacked writes back
# with its count; it does not change on disk while the message is held.
Hold = tuple[bytes, int, DeliveryState]
TOKEN: Final = 0
UNTIL: Final = 1
STATE: Final = 2


@dataclass(slots=True)
class QueueHolds:
    """One queue's holds and skip hint."""

    qid: int
    held: dict[int, Hold] = field(default_factory=dict)
    # (until_ms, seq) of every hold made, lazily pruned: a popped entry whose hold was
    # dropped or moved since is ignored.
    expiries: list[tuple[int, int]] = field(default_factory=list)
    # Every visibility entry of the queue below this key is held (None: walk from the start).
    start: bytes | None = None

    def lower(self, key: bytes) -> None:
        if self.start is not None and key < self.start:
            self.start = key


def _entry_key(qid: int, seq: int, hold: Hold) -> bytes:
    return visibility_key(qid, hold[STATE].visible_ms, seq)


class Holds:
    """Holds by queue id and seq.

    Every change made inside a write batch is journaled (the seq's hold before it); if the
    batch aborts, the journal is rolled back, so the batch can be redone."""

    __slots__ = ("_by_queue", "_journal", "_journal_for", "max_held")

    def __init__(self, max_held: int = DEFAULT_MAX_HELD) -> None:
        self._by_queue: dict[int, QueueHolds] = {}
        self.max_held = max_held
        # The journal of the batch whose on_abort list is ``_journal_for``.
        self._journal: list[tuple[int, int, Hold | None]] = []
        self._journal_for: Undo | None = None

    # Reads ---------------------------------------------------------------------

    def queue(self, qid: int) -> QueueHolds | None:
        return self._by_queue.get(qid)

    def get(self, qid: int, seq: int) -> Hold | None:
        qh = self._by_queue.get(qid)
        return None if qh is None else qh.held.get(seq)

    def held_count(self, qid: int, now_ms: int) -> int:
        """How many messages of a queue are held at ``now_ms``: a hold past its visibility
        timeout is receivable again, though only the next receive ends it."""
        qh = self._by_queue.get(qid)
        if qh is None:
            return 0
        # A copy taken in one C call: the writer thread may change the dict meanwhile.
        holds = list(qh.held.values())
        return sum(1 for hold in holds if hold[UNTIL] > now_ms)

    def next_expiry_ms(self, qid: int) -> int | None:
        """About when the first hold of a queue ends (maybe earlier: the heap keeps entries of
        holds ended since, so a waiter may wake for nothing, never late). Read from other
        threads too, hence no assumption that the heap stays as it was."""
        qh = self._by_queue.get(qid)
        if qh is None or not qh.held:
            return None
        try:
            return qh.expiries[0][0]
        except IndexError:
            return None

    def all_held(self) -> list[tuple[int, int, Hold]]:
        """Every hold, as (qid, seq, hold)."""
        return [(qid, seq, hold) for qid, qh in self._by_queue.items() for seq, hold in qh.held.items()]

    def __len__(self) -> int:
        return sum(len(qh.held) for qh in self._by_queue.values())

    # Changes made inside a write batch (rolled back if it aborts) ------------------

    def hold_first(self, qh: QueueHolds, seq: int, hold: Hold, on_abort: Undo) -> None:
        """Hold a first delivery (nothing held for it before)."""
        self._journaled(on_abort).append((qh.qid, seq, None))
        qh.held[seq] = hold
        self._push_expiry(qh, seq, hold[UNTIL])

    def extend(self, qid: int, seq: int, hold: Hold, on_abort: Undo) -> None:
        """Move a hold's end (change_visibility): the same delivery."""
        qh = self._queue(qid)
        self._journaled(on_abort).append((qid, seq, qh.held.get(seq)))
        qh.held[seq] = hold
        self._push_expiry(qh, seq, hold[UNTIL])

    def end(self, qid: int, seq: int, on_abort: Undo, *, receivable: bool) -> Hold | None:
        """End a hold and return it (None: none). ``receivable``: its message is visible again
        where it is (nack, visibility 0), so the skip hint comes down to it; otherwise the
        message is gone or its visibility entry moves (ack, delete, nack with a delay)."""
        qh = self._by_queue.get(qid)
        if qh is None:
            return None
        hold = qh.held.pop(seq, None)
        if hold is None:
            return None
        self._journaled(on_abort).append((qid, seq, hold))
        if receivable:
            qh.lower(_entry_key(qid, seq, hold))
        self._forget_if_empty(qh)
        return hold

    def expire(self, qid: int, now_ms: int, on_abort: Undo) -> list[tuple[int, Hold]]:
        """End the holds of a queue whose visibility timeout has passed; return them
        (their counts are the caller's to write)."""
        qh = self._by_queue.get(qid)
        if qh is None:
            return []
        ended: list[tuple[int, Hold]] = []
        expiries = qh.expiries
        while expiries and expiries[0][0] <= now_ms:
            _, seq = heapq.heappop(expiries)
            hold = qh.held.get(seq)
            if hold is not None and hold[UNTIL] <= now_ms:
                self.end(qid, seq, on_abort, receivable=True)
                ended.append((seq, hold))
        return ended

    def forget_queue(self, qid: int, on_abort: Undo) -> None:
        """Every message of a queue is gone (purge, delete)."""
        qh = self._by_queue.pop(qid, None)
        if qh is not None:
            qh.start = None
            on_abort.append(functools.partial(self._by_queue.setdefault, qid, qh))

    def indexed(self, qid: int, key: bytes) -> None:
        """A visibility entry was put (``Writes.index_listener``): lower the queue's hint.

        Not rolled back when the batch aborts: a lower hint only costs a longer walk."""
        qh = self._by_queue.get(qid)
        if qh is not None and qh.start is not None and key < qh.start:
            qh.start = key

    def watch(self, qid: int, on_abort: Undo, *, create: bool) -> QueueHolds | None:
        """A queue's holds for a receive that walks it (made when ``create``). The receive
        moves the skip hint; if its batch aborts, the hint is dropped (walk from the start
        once), since what the walk found is undone."""
        qh = self._by_queue.get(qid)
        if qh is None:
            if not create:
                return None
            qh = self._by_queue[qid] = QueueHolds(qid)
        on_abort.append(functools.partial(self._drop_hint, qid))
        return qh

    # Internals ------------------------------------------------------------------

    def _journaled(self, on_abort: Undo) -> list[tuple[int, int, Hold | None]]:
        """The journal of the batch ``on_abort`` belongs to (one rollback registered per batch)."""
        if on_abort is not self._journal_for:
            self._journal_for = on_abort
            self._journal = []
            on_abort.append(functools.partial(self._roll_back, self._journal))
        return self._journal

    def _roll_back(self, journal: list[tuple[int, int, Hold | None]]) -> None:
        for qid, seq, hold in reversed(journal):
            qh = self._queue(qid)
            if hold is None:
                gone = qh.held.pop(seq, None)
                if gone is not None:
                    qh.lower(_entry_key(qid, seq, gone))
            else:
                qh.held[seq] = hold
                heapq.heappush(qh.expiries, (hold[UNTIL], seq))
            self._forget_if_empty(qh)
        journal.clear()
        self._journal_for = None

    def _queue(self, qid: int) -> QueueHolds:
        qh = self._by_queue.get(qid)
        if qh is None:
            qh = self._by_queue[qid] = QueueHolds(qid)
        return qh

    def _push_expiry(self, qh: QueueHolds, seq: int, until_ms: int) -> None:
        if len(qh.expiries) > 2 * len(qh.held) + 64:
            # Mostly entries of holds acked since: rebuild (amortized O(1) per hold).
            qh.expiries = [(h[UNTIL], s) for s, h in qh.held.items()]
            heapq.heapify(qh.expiries)
        else:
            heapq.heappush(qh.expiries, (until_ms, seq))

    def _forget_if_empty(self, qh: QueueHolds) -> None:
        # A queue with a hint keeps it (the next receive starts there).
        if not qh.held and qh.start is None and self._by_queue.get(qh.qid) is qh:
            del self._by_queue[qh.qid]

    def _drop_hint(self, qid: int) -> None:
        qh = self._by_queue.get(qid)
        if qh is not None:
            qh.start = None
