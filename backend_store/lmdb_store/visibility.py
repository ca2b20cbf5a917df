"""The visibility index and FIFO groups: which stored message can be received, and when.

Every receivable message has exactly one entry in ``vis`` keyed by (queue, visible_ms, seq).
In a FIFO queue only the head of each group is receivable; the rest wait in ``groups``
and the next one is promoted when the head is acked or dead-lettered. A head that is
in flight or nacked stays the head, which is what keeps a group strictly ordered with
at most one message in flight.
"""

from __future__ import annotations

from .environment import Db
from .group_commit import Writes
from .keys import group_key, group_prefix, message_key, read_u64, visibility_key
from .records import MessageRecord


def to_ms(t: float) -> int:
    return int(t * 1000)


def set_visible_at(w: Writes, qid: int, seq: int, record: MessageRecord, visible_ms: int, kind: str) -> None:
    """Move a receivable message's index entry (the record is saved by the caller)."""
    w.delete(Db.VIS, visibility_key(qid, record.visible_ms, seq))
    record.visible_ms = visible_ms
    record.kind = kind
    w.put(Db.VIS, visibility_key(qid, visible_ms, seq), b"")


def add_message(w: Writes, qid: int, seq: int, record: MessageRecord, fifo: bool) -> None:
    """Store a new message and index it (a FIFO message is receivable only as its group's head)."""
    w.put(Db.MSGS, message_key(qid, seq), record.encode())
    if fifo:
        group = record.group_id or ""
        has_head = _group_head(w, qid, group) is not None
        w.put(Db.GROUPS, group_key(qid, group, seq), b"")
        if has_head:
            return
    w.put(Db.VIS, visibility_key(qid, record.visible_ms, seq), b"")


def remove_message(w: Writes, qid: int, seq: int, record: MessageRecord, fifo: bool, now: float) -> None:
    """Delete a message everywhere; in a FIFO queue promote its group's next message."""
    w.delete(Db.MSGS, message_key(qid, seq))
    w.delete(Db.VIS, visibility_key(qid, record.visible_ms, seq))
    if not fifo:
        return
    group = record.group_id or ""
    was_head = _group_head(w, qid, group) == seq
    w.delete(Db.GROUPS, group_key(qid, group, seq))
    if not was_head:
        return
    next_seq = _group_head(w, qid, group)
    if next_seq is None:
        return
    raw = w.get(Db.MSGS, message_key(qid, next_seq))
    if raw is None:
        return
    nxt = MessageRecord.decode(raw)
    # The next message becomes receivable now, or when its own delay ends.
    nxt.visible_ms = max(nxt.visible_ms, to_ms(now))
    w.put(Db.MSGS, message_key(qid, next_seq), nxt.encode())
    w.put(Db.VIS, visibility_key(qid, nxt.visible_ms, next_seq), b"")


def _group_head(w: Writes, qid: int, group: str) -> int | None:
    prefix = group_prefix(qid, group)
    cursor = w.cursor(Db.GROUPS)
    if not cursor.set_range(prefix):
        return None
    key = cursor.key()
    if not key.startswith(prefix) or len(key) != len(prefix) + 8:
        return None
    return read_u64(key, len(prefix))
