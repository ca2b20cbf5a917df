"""The visibility index and FIFO groups: which stored message can be received, and when.

Every receivable message has exactly one entry in ``vis`` keyed by (queue, visible_ms, seq).
In a FIFO queue only the head of each group is receivable; the rest wait in ``groups``
and the next one is promoted when the head is acked or dead-lettered. A head that is
in flight or nacked stays the head, which is what keeps a group strictly ordered with
at most one message in flight.
"""

from __future__ import annotations

from .environment import Db, View, Writes
from .keys import expiry_key, group_key, group_prefix, message_key, read_u64, visibility_key
from .records import DeliveryState


def to_ms(t: float) -> int:
    return int(t * 1000)


def load_state(v: View, qid: int, seq: int) -> DeliveryState | None:
    """A message's delivery state (a read: any transaction will do)."""
    raw = v.get(Db.STATE, message_key(qid, seq))
    return None if raw is None else DeliveryState.decode(raw)


def set_visible_at(w: Writes, qid: int, seq: int, state: DeliveryState, visible_ms: int, kind: str) -> None:
    """Move a receivable message's index entry and save its state."""
    w.delete(Db.VIS, visibility_key(qid, state.visible_ms, seq))
    state.visible_ms = visible_ms
    state.kind = kind
    _index(w, qid, visibility_key(qid, visible_ms, seq))
    w.put(Db.STATE, message_key(qid, seq), state.encode())


def add_message(w: Writes, qid: int, seq: int, record: bytes, state: DeliveryState, fifo: bool) -> None:
    """Store a new message and index it (a FIFO message is receivable only as its group's head)."""
    key = message_key(qid, seq)
    w.put(Db.MSGS, key, record)
    w.put(Db.STATE, key, state.encode())
    if state.moved:
        w.put(Db.EXPIRY, expiry_key(qid, to_ms(state.sent_at), seq), b"")
    if fifo:
        group = state.group_id or ""
        has_head = _group_head(w, qid, group) is not None
        w.put(Db.GROUPS, group_key(qid, group, seq), b"")
        if has_head:
            return
    _index(w, qid, visibility_key(qid, state.visible_ms, seq))


def remove_message(w: Writes, qid: int, seq: int, state: DeliveryState, fifo: bool, now: float) -> None:
    """Delete a message everywhere; in a FIFO queue promote its group's next message."""
    key = message_key(qid, seq)
    w.delete(Db.MSGS, key)
    w.delete(Db.STATE, key)
    w.delete(Db.VIS, visibility_key(qid, state.visible_ms, seq))
    if state.moved:
        w.delete(Db.EXPIRY, expiry_key(qid, to_ms(state.sent_at), seq))
    if not fifo:
        return
    group = state.group_id or ""
    was_head = _group_head(w, qid, group) == seq
    w.delete(Db.GROUPS, group_key(qid, group, seq))
    if not was_head:
        return
    next_seq = _group_head(w, qid, group)
    if next_seq is None:
        return
    nxt = load_state(w, qid, next_seq)
    if nxt is None:
        return
    # The next message becomes receivable now, or when its own delay ends.
    nxt.visible_ms = max(nxt.visible_ms, to_ms(now))
    w.put(Db.STATE, message_key(qid, next_seq), nxt.encode())
    _index(w, qid, visibility_key(qid, nxt.visible_ms, next_seq))


def _index(w: Writes, qid: int, key: bytes) -> None:
    """Put a visibility entry (every put goes through here: holds.py's skip hints hear of it)."""
    w.put(Db.VIS, key, b"")
    listener = w.index_listener
    if listener is not None:
        listener(qid, key)


def _group_head(w: Writes, qid: int, group: str) -> int | None:
    prefix = group_prefix(qid, group)
    cursor = w.cursor(Db.GROUPS)
    if not cursor.set_range(prefix):
        return None
    key = cursor.key()
    if not key.startswith(prefix) or len(key) != len(prefix) + 8:
        return None
    return read_u64(key, len(prefix))
