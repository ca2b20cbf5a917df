"""The visibility index and FIFO groups: which stored message can be received, and when.

Every receivable message has exactly one entry in ``vis`` keyed by (queue, visible_ms, seq).
In a FIFO queue only the head of each group is receivable; the rest wait in ``groups``
and the next one is promoted when the head is acked or dead-lettered. A head that is
in flight or nacked stays the head, which is what keeps a group strictly ordered with
at most one message in flight.

An entry's value tells whether its message has a ``state`` record: :data:`INITIAL` none (its
state is the initial one its message record carries, records.py), empty: look it up (every
entry written before 2026-11-23 is empty). So a receive of a message as sent reads only its
record. The rule that keeps it true: whatever writes a ``state`` record for an indexed
message puts its entry again (:func:`save_state` writes the record only; its callers do).
"""

from __future__ import annotations

from ..errors import Unavailable
from .environment import Db, View, Writes
from .keys import expiry_key, group_key, group_prefix, message_key, read_u64, visibility_key
from .records import DeliveryState, MessageRecord

# The databases of the hot paths, looked up once: on Python 3.11 reading an Enum member off
# its class costs ~0.1 us (the metaclass's __getattr__ slows every class attribute lookup),
# and a message's life reads them a dozen times.
_MSGS, _STATE, _VIS, _GROUPS = Db.MSGS, Db.STATE, Db.VIS, Db.GROUPS

# The value of an index entry whose message has no state record (module docstring).
INITIAL = b"i"


def to_ms(t: float) -> int:
    return int(t * 1000)


def load_state(v: View, qid: int, seq: int) -> DeliveryState | None:
    """A message's delivery state (a read: any transaction will do): its ``state`` record, or
    while it has none the initial state its message record carries. None: no such message
    (or an old record without a state record, which only damage leaves behind)."""
    key = message_key(qid, seq)
    raw = v.get(_STATE, key)
    if raw is not None:
        return DeliveryState.decode(raw)
    raw = v.get(_MSGS, key)
    return None if raw is None else initial_state_of(raw)


def initial_state_of(raw_record: bytes) -> DeliveryState | None:
    """The initial state a stored message record carries (None: it carries none)."""
    try:
        return MessageRecord.decode(raw_record).initial_state()
    except Unavailable:
        return None


def set_visible_at(w: Writes, qid: int, seq: int, state: DeliveryState, visible_ms: int, kind: str) -> None:
    """Move a receivable message's index entry and save its state."""
    w.delete(_VIS, visibility_key(qid, state.visible_ms, seq))
    state.visible_ms = visible_ms
    state.kind = kind
    index(w, qid, visibility_key(qid, visible_ms, seq), b"")
    save_state(w, qid, seq, state)


def save_state(w: Writes, qid: int, seq: int, state: DeliveryState) -> None:
    """Write a message's ``state`` record (it has one from now on). Only the record: an
    indexed message's caller puts its entry again (:func:`index`), as that says whether
    there is one."""
    w.put(_STATE, message_key(qid, seq), state.encode())
    state.stored = True


def add_message(
    w: Writes, qid: int, seq: int, record: bytes, group_id: str | None, visible_ms: int, fifo: bool
) -> None:
    """Store a sent message and index it; ``record`` carries its initial state (sent now,
    ``group_id``, visible at ``visible_ms``), so it gets no ``state`` record."""
    w.put(_MSGS, message_key(qid, seq), record)
    _add_to_index(w, qid, seq, group_id, visible_ms, fifo, INITIAL)


def add_moved_message(w: Writes, qid: int, seq: int, record: bytes, state: DeliveryState, fifo: bool) -> None:
    """Store a message moved here from another queue (dead-lettered, redriven) under its own
    ``state``, since its record carries the initial state of the queue it was sent to."""
    w.put(_MSGS, message_key(qid, seq), record)
    save_state(w, qid, seq, state)
    if state.moved:
        w.put(Db.EXPIRY, expiry_key(qid, to_ms(state.sent_at), seq), b"")
    _add_to_index(w, qid, seq, state.group_id, state.visible_ms, fifo, b"")


def _add_to_index(
    w: Writes, qid: int, seq: int, group_id: str | None, visible_ms: int, fifo: bool, value: bytes
) -> None:
    """Index a new message (a FIFO message is receivable only as its group's head: the others
    get a state record when promoted)."""
    if fifo:
        group = group_id or ""
        has_head = _group_head(w, qid, group) is not None
        w.put(_GROUPS, group_key(qid, group, seq), b"")
        if has_head:
            return
    index(w, qid, visibility_key(qid, visible_ms, seq), value)


def remove_message(w: Writes, qid: int, seq: int, state: DeliveryState, fifo: bool, now: float) -> bool:
    """Delete a message everywhere; in a FIFO queue promote its group's next message.
    False, with nothing written: it was not stored (already deleted)."""
    key = message_key(qid, seq)
    if not w.delete(_MSGS, key):
        return False
    if state.stored:
        w.delete(_STATE, key)
    w.delete(_VIS, visibility_key(qid, state.visible_ms, seq))
    if state.moved:
        w.delete(Db.EXPIRY, expiry_key(qid, to_ms(state.sent_at), seq))
    if not fifo:
        return True
    group = state.group_id or ""
    was_head = _group_head(w, qid, group) == seq
    w.delete(_GROUPS, group_key(qid, group, seq))
    if not was_head:
        return True
    next_seq = _group_head(w, qid, group)
    if next_seq is None:
        return True
    nxt = load_state(w, qid, next_seq)
    if nxt is None:
        return True
    # The next message becomes receivable now, or when its own delay ends.
    nxt.visible_ms = max(nxt.visible_ms, to_ms(now))
    save_state(w, qid, next_seq, nxt)
    index(w, qid, visibility_key(qid, nxt.visible_ms, next_seq), b"")
    return True


def index(w: Writes, qid: int, key: bytes, value: bytes) -> None:
    """Put a visibility entry (every put goes through here: holds.py's skip hints hear of it);
    ``value``: :data:`INITIAL` if its message has no state record, else empty."""
    w.put(_VIS, key, value)
    listener = w.index_listener
    if listener is not None:
        listener(qid, key)


def _group_head(w: Writes, qid: int, group: str) -> int | None:
    prefix = group_prefix(qid, group)
    cursor = w.cursor(_GROUPS)
    if not cursor.set_range(prefix):
        return None
    key = cursor.key()
    if not key.startswith(prefix) or len(key) != len(prefix) + 8:
        return None
    return read_u64(key, len(prefix))
