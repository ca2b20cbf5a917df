"""Dead-letter inspection and redrive: peek (a read) and redrive (a writer operation).

Redrive moves messages from a dead-letter queue back to a source queue in one write
transaction: each message is removed from the dead-letter queue and stored in the
target in the same commit, so a crash leaves either both effects or neither, and a
repeated call cannot move a message twice (it is no longer in the dead-letter queue).
"""

from __future__ import annotations

from collections.abc import Callable

from ..errors import InvalidRequest, Unavailable
from ..types import MessageId, PeekedMessage, QueueName
from .environment import Db, View, Writes
from .holds import Hold
from .keys import message_key, u64, visibility_key
from .message_ops import _ready
from .queue_ops import attributes_of, find_queue, save_queue
from .records import DeliveryState, MessageRecord, QueueRecord
from .visibility import add_moved_message, load_state, remove_message, to_ms

# Opens a stored (maybe sealed) body: (record, tenant) -> plain bytes.
Opener = Callable[[MessageRecord, str], bytes]


def peek(
    v: View, tenant: str, queue: str, max_messages: int, now: float, opener: Opener
) -> list[PeekedMessage]:
    """Up to ``max_messages`` of a queue's messages in seq order (visible, delayed or in flight).

    Nothing changes: no receive count, no receipt, no visibility move.
    """
    record = find_queue(v, tenant, queue)
    qid = record.qid
    prefix = u64(qid)
    out: list[PeekedMessage] = []
    cursor = v.cursor(Db.MSGS)
    if not cursor.set_range(message_key(qid, 0)):
        return out
    now_ms = to_ms(now)
    for key, raw in cursor:
        if not key.startswith(prefix) or len(out) >= max_messages:
            break
        try:
            msg = MessageRecord.decode(raw)
            raw_state = v.get(Db.STATE, key)
            # No state record: the message is as its send left it (records.py).
            state = msg.initial_state() if raw_state is None else DeliveryState.decode(raw_state)
            body = opener(msg, tenant)
        except Unavailable:
            continue  # unreadable (damaged, or without its key): receive skips it too
        if state.kind == "i" and state.visible_ms > now_ms:
            where = "in_flight"
        elif state.visible_ms > now_ms:
            where = "delayed"
        else:
            where = "visible"
        out.append(
            PeekedMessage(
                queue=QueueName(queue),
                id=MessageId(msg.id),
                seq=int.from_bytes(key[8:16], "big"),
                body=body,
                is_text=msg.is_text,
                attributes=msg.attributes,
                group_id=state.group_id,
                sent_at=state.sent_at,
                receive_count=state.receive_count,
                state=where,
            )
        )
    return out


def redrive(
    w: Writes,
    now: float,
    tenant: str,
    source: str,
    to: str,
    max_messages: int,
    held_now: Callable[[Writes, int, int], dict[int, Hold]],
) -> int:
    """Move up to ``max_messages`` visible messages of ``source`` to ``to``; return how many.

    Each moved message keeps its id, body, attributes and group, and starts afresh in
    the target (sent now, receive count 0), as a new send would. In-flight messages of
    the dead-letter queue stay (someone holds their receipt, on disk or in memory: ``held_now``);
    a full target stops the move.
    """
    if source == to:
        raise InvalidRequest("redrive needs a target queue other than the dead-letter queue")
    src = find_queue(w, tenant, source)
    dst = find_queue(w, tenant, to)
    src_fifo = attributes_of(src).ordering == "fifo"
    dst_attrs = attributes_of(dst)
    dst_fifo = dst_attrs.ordering == "fifo"
    now_ms = to_ms(now)
    moved = 0
    seen: set[int] = set()
    held = held_now(w, src.qid, now_ms)
    while moved < max_messages:
        start = visibility_key(src.qid, 0, 0)
        candidates, _ = _ready(w, src.qid, now_ms, max_messages - moved, start, held, seen)
        if not candidates:
            break
        for _, seq, _ in candidates:
            seen.add(seq)
            if dst_attrs.max_messages is not None and dst.count >= dst_attrs.max_messages:
                return _finish(w, tenant, source, src, to, dst, moved)
            state = load_state(w, src.qid, seq)
            raw = w.get(Db.MSGS, message_key(src.qid, seq))
            if state is None or raw is None:
                continue
            remove_message(w, src.qid, seq, state, src_fifo, now)
            src.count -= 1
            new_seq = dst.next_seq
            dst.next_seq += 1
            dst.count += 1
            dst.sent_total += 1
            fresh = DeliveryState(sent_at=now, group_id=state.group_id, visible_ms=now_ms)
            # The record's bytes move as they are: a sealed body is bound to its tenant and
            # id, both unchanged, so it stays readable without re-sealing.
            add_moved_message(w, dst.qid, new_seq, raw, fresh, dst_fifo)
            moved += 1
            if moved >= max_messages:
                break
    return _finish(w, tenant, source, src, to, dst, moved)


def _finish(
    w: Writes, tenant: str, source: str, src: QueueRecord, to: str, dst: QueueRecord, moved: int
) -> int:
    if moved:
        save_queue(w, tenant, source, src)
        save_queue(w, tenant, to, dst)
        w.touched.add((tenant, to))
    return moved
