"""Message operations run by the writer: send, receive, ack, nack, extend, and sweeps.

Each operation validates before its first write and raises a ``PushgateError`` only
then, so a failed operation leaves nothing behind in the batch's transaction. (An
operation that breaks that rule, or crashes, makes the writer redo the batch one
operation per transaction: see ``group_commit.py``.)
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import hmac
import itertools
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass

import msgpack

from ..encryption import Keyring
from ..errors import (
    InvalidReceipt,
    InvalidRequest,
    MessageTooLarge,
    PushgateError,
    QueueFull,
    QueueNotFound,
    Unavailable,
)
from ..limits import MAX_DELAY_S
from ..options import DEFAULT_MAX_HELD
from ..types import (
    AckResult,
    MessageId,
    NewMessage,
    QueueAttributes,
    QueueName,
    ReceiptFailure,
    ReceivedMessage,
    SendResult,
)
from . import queue_ops
from .environment import Db, View, Writes
from .holds import STATE, TOKEN, UNTIL, Hold, Holds, QueueHolds
from .keys import (
    RECEIPT_TOKEN_BYTES,
    decode_receipt,
    dedupe_expiry_key,
    dedupe_key,
    encode_receipt,
    expiry_key,
    message_key,
    queue_key,
    read_u64,
    split_visibility_key,
    u64,
    visibility_key,
)
from .queue_ops import attributes_of, find_queue, queue_by_qid, save_queue, stored_record_at
from .records import DeliveryState, MessageRecord, QueueRecord, pack, unpack
from .sweep_memo import SweepMemo
from .visibility import (
    INITIAL,
    add_message,
    add_moved_message,
    index,
    initial_state_of,
    load_state,
    remove_message,
    save_state,
    set_visible_at,
    to_ms,
)

log = logging.getLogger("pushgate.store")
# Looked up once (an Enum member read off its class costs ~0.1 us on Python 3.11: visibility.py).
_MSGS, _STATE, _VIS = Db.MSGS, Db.STATE, Db.VIS
# Queues one sweep transaction visits at most. A sweep of 10,000 queues in one transaction
# held the writer (every send behind it) for 0.3-0.7 s every sweep interval (session 62); in
# transactions of this many, a send waits for one of them, some milliseconds.
SWEEP_QUEUES = 500


@dataclass(slots=True)
class _Receive:
    """One receive call's context, shared by the verdicts on each of its messages."""

    w: Writes
    now: float
    now_ms: int
    tenant: str
    queue: QueueName
    record: QueueRecord
    attrs: QueueAttributes
    fifo: bool
    qid: int
    invisible_until: int
    visible_at: float  # invisible_until in seconds
    retention_cutoff: float
    in_memory: bool
    qh: QueueHolds | None = None  # the queue's holds, when any (holds.py)
    changed: bool = False
    # The dead-letter queue's record, once a message has needed it (None: not looked up, or missing).
    dlq: QueueRecord | None = None
    dlq_looked_up: bool = False

    @classmethod
    def start(
        cls,
        w: Writes,
        now: float,
        tenant: str,
        queue: str,
        visibility_timeout_s: float | None,
        in_memory: bool,
    ) -> _Receive:
        record = find_queue(w, tenant, queue)
        attrs = attributes_of(record)
        now_ms = to_ms(now)
        timeout = attrs.visibility_timeout_s if visibility_timeout_s is None else visibility_timeout_s
        return cls(
            w=w,
            now=now,
            now_ms=now_ms,
            tenant=tenant,
            queue=QueueName(queue),
            record=record,
            attrs=attrs,
            fifo=attrs.ordering == "fifo",
            qid=record.qid,
            invisible_until=now_ms + to_ms(timeout),
            visible_at=(now_ms + to_ms(timeout)) / 1000,
            retention_cutoff=now - attrs.retention_s,
            in_memory=in_memory,
        )

    def dead_letter_queue(self) -> QueueRecord | None:
        if not self.dlq_looked_up and self.attrs.dead_letter_queue is not None:
            self.dlq_looked_up = True
            with contextlib.suppress(QueueNotFound):
                self.dlq = find_queue(self.w, self.tenant, self.attrs.dead_letter_queue)
        return self.dlq

    def finish(self) -> None:
        """Store what changed: this queue's counts, the dead-letter queue's."""
        if self.changed:
            save_queue(self.w, self.tenant, self.queue, self.record)
        if self.dlq is not None and self.attrs.dead_letter_queue is not None:
            save_queue(self.w, self.tenant, self.attrs.dead_letter_queue, self.dlq)
            self.w.touched.add((self.tenant, self.attrs.dead_letter_queue))


class MessageOps:
    """Message operations bound to a keyring (bodies are sealed when one is set)."""

    def __init__(self, keyring: Keyring | None, max_held: int = DEFAULT_MAX_HELD) -> None:
        self.keyring = keyring
        # Message ids: a random per-process prefix and a counter. Unique without a
        # syscall per message (uuid4 reads the kernel's random pool each time).
        self._id_prefix = os.urandom(8).hex()
        self._id_counter = itertools.count(1)
        # With encryption at rest, dedupe keys are keyed hashes: a plain hash of a body
        # would let anyone holding the file confirm a guessed body without the key.
        self._dedupe_secret = keyring.derive(b"pushgate dedupe v1") if keyring else None
        self._holds = Holds(max_held)
        # Whether receives may hold in memory now: only while no other process has the store
        # open (hold_lock.py); set on the event loop, read by the writer.
        self.allow_holds = True
        # Message records are packed by the writer thread only (records.py: MessageRecord.pack).
        self._packer = msgpack.Packer()
        # The sweep's memory of queues with nothing due (sweep_memo.py; writer thread only).
        self._sweep_memo = SweepMemo()

    @property
    def holds(self) -> Holds:
        return self._holds

    def _new_id(self) -> MessageId:
        return MessageId(f"{self._id_prefix}{next(self._id_counter):016x}")

    # Send -----------------------------------------------------------------

    def send_queues(
        self, w: Writes, now: float, tenant: str, sends: Sequence[tuple[str, Sequence[NewMessage]]]
    ) -> list[list[SendResult | PushgateError] | PushgateError]:
        """:meth:`send` to each queue of ``sends``, in one writer operation; a queue this store
        does not hold is that entry's ``QueueNotFound``, raised by :meth:`send` before it
        wrote anything (any other refusal is the whole operation's, as the writer's rule
        wants: group_commit.py, ``_run_op``)."""
        out: list[list[SendResult | PushgateError] | PushgateError] = []
        for queue, messages in sends:
            try:
                out.append(self.send(w, now, tenant, queue, messages))
            except QueueNotFound as exc:
                out.append(exc)
        return out

    def send(
        self, w: Writes, now: float, tenant: str, queue: str, messages: Sequence[NewMessage]
    ) -> list[SendResult | PushgateError]:
        record = find_queue(w, tenant, queue)
        full = w.no_room_for(sum(len(m.body) for m in messages))
        if full is not None:
            raise Unavailable(full)  # before any write: room.py
        attrs = attributes_of(record)
        fifo = attrs.ordering == "fifo"
        now_ms = to_ms(now)
        results: list[SendResult | PushgateError] = []
        keyring, packer = self.keyring, self._packer
        dedupe = attrs.dedupe_window_s > 0
        for message in messages:
            problem = _entry_problem(message)
            if problem is not None:
                results.append(InvalidRequest(problem))
                continue
            if len(message.body) > attrs.max_message_bytes:
                results.append(MessageTooLarge(f"body is larger than {attrs.max_message_bytes} bytes"))
                continue
            token = self._dedupe_token(message, attrs.content_dedupe) if dedupe else None
            if token is not None:
                original = _find_duplicate(w, record.qid, token, now_ms)
                if original is not None:
                    results.append(original)
                    continue
            if attrs.max_messages is not None and record.count >= attrs.max_messages:
                results.append(QueueFull(f"queue holds its maximum of {attrs.max_messages} messages"))
                continue
            seq = record.next_seq
            record.next_seq += 1
            record.count += 1
            record.sent_total += 1
            delay = attrs.delay_s if message.delay_s is None else message.delay_s
            msg_id = self._new_id()
            body = keyring.seal(message.body, sealing_context(tenant, msg_id)) if keyring else message.body
            visible_ms = now_ms + to_ms(delay)
            stored = MessageRecord.pack(
                packer,
                msg_id,
                body,
                keyring is not None,
                message.is_text,
                message.attributes,
                now,
                message.group_id,
                visible_ms,
            )
            add_message(w, record.qid, seq, stored, message.group_id, visible_ms, fifo)
            if token is not None:
                expires_ms = now_ms + to_ms(attrs.dedupe_window_s)
                w.put(Db.DEDUPE, dedupe_key(record.qid, token), pack([seq, msg_id, expires_ms]))
                w.put(Db.DEDUPE_EXP, dedupe_expiry_key(expires_ms, record.qid, token), b"")
            results.append(SendResult(msg_id, seq))  # positional: keywords cost 0.2 us here
        save_queue(w, tenant, queue, record)
        w.touched.add((tenant, queue))
        return results

    # Receive --------------------------------------------------------------

    def receive(
        self,
        w: Writes,
        now: float,
        tenant: str,
        queue: str,
        max_messages: int,
        visibility_timeout_s: float | None,
        in_memory: bool = False,
    ) -> list[ReceivedMessage]:
        """Receive up to ``max_messages``; ``in_memory`` keeps the in-flight state of first
        deliveries in memory instead of writing it (``holds.py``)."""
        r = _Receive.start(w, now, tenant, queue, visibility_timeout_s, in_memory)
        out: list[ReceivedMessage] = []
        holds = self._holds
        qid = r.qid
        self._end_expired_holds(w, qid, r.now_ms)
        qh = r.qh = holds.watch(qid, w.on_abort, create=in_memory)
        # Begin at the skip hint: every entry below it is held (holds.py).
        position = end = _queue_start(qid) if qh is None or qh.start is None else qh.start
        low = _PAST_EVERY_KEY  # the lowest entry put or released during the walk
        seen: set[int] = set()  # taken by this receive (one made visible again stays taken)
        while len(out) < max_messages:
            if qh is not None:
                qh.start = _PAST_EVERY_KEY  # lowered by whatever is put or released meanwhile
            held = _NOTHING_HELD if qh is None else qh.held
            candidates, last = _ready(w, qid, r.now_ms, max_messages - len(out), position, held, seen)
            # One read of the kernel's random pool for the whole batch of receipts.
            tokens = os.urandom(RECEIPT_TOKEN_BYTES * len(candidates)) if candidates else b""
            for i, (visible_ms, seq, initial) in enumerate(candidates):
                seen.add(seq)
                token = tokens[i * RECEIPT_TOKEN_BYTES : (i + 1) * RECEIPT_TOKEN_BYTES]
                message = self._take(r, visible_ms, seq, initial, token)
                if message is not None:
                    out.append(message)
            if qh is None:
                if not candidates:
                    break
                continue  # from the start again, as nothing is held
            round_low = qh.start or _PAST_EVERY_KEY
            low = min(low, round_low)
            if last is None or not candidates:
                if last is not None:
                    end = max(end, last + b"\0")
                break
            end = max(end, last + b"\0")
            # Go on past ``last``, or from an entry put or released behind it (a FIFO
            # promotion, a receive with a zero visibility timeout).
            position = min(last + b"\0", round_low)
        if qh is not None:
            # Everything walked is held or gone now, but what was put or released meanwhile.
            qh.start = min(low, end)
        r.finish()
        return out

    def _take(
        self, r: _Receive, visible_ms: int, seq: int, initial: bool, token: bytes
    ) -> ReceivedMessage | None:
        """The verdict on one visible message: dropped (past retention), moved to the
        dead-letter queue (past max_receives), skipped (unreadable), or delivered (None
        for all but the last). ``initial``: its index entry says it has no state record."""
        w, qid, holds, qh = r.w, r.qid, self._holds, r.qh
        key = message_key(qid, seq)
        try:
            raw = w.get(_MSGS, key)
            if raw is None:
                raise Unavailable("index entry without a message")
            msg = MessageRecord.decode(raw)
            raw_state = None if initial else w.get(_STATE, key)
            # No state record: the message is as its send left it (records.py).
            state = msg.initial_state() if raw_state is None else DeliveryState.decode(raw_state)
            # Where its index entry is (the same, unless a damaged record says otherwise: then
            # the entry found is the one a receive must move, or it would stay behind).
            state.visible_ms = visible_ms
            # (Never held: held messages are not candidates. Holds that ended unacked have
            # had their count written.)
            received = state.receive_count
            if state.sent_at < r.retention_cutoff:
                remove_message(w, qid, seq, state, r.fifo, r.now)
                r.record.count -= 1
                r.changed = True
                w.note(r.tenant, r.queue, "expired")
                return None
            if r.attrs.max_receives is not None and received >= r.attrs.max_receives:
                dlq = r.dead_letter_queue()
                if dlq is not None:
                    self._dead_letter(w, r.now, qid, seq, raw, state, r.fifo, dlq)
                    r.record.count -= 1
                    r.record.dead_lettered_total += 1
                    r.changed = True
                    w.note(r.tenant, r.queue, "dead_lettered")
                    return None
            body = self._open(msg, r.tenant) if msg.sealed else msg.body
        except Unavailable as exc:
            # Skip it rather than stall the queue; the record stays for an operator.
            log.error("queue %s/%s seq %d cannot be delivered: %s", r.tenant, r.queue, seq, exc.detail)
            w.delete(_VIS, visibility_key(qid, visible_ms, seq))
            return None
        if (
            r.in_memory
            and received == 0
            and qh is not None
            and len(qh.held) < holds.max_held
            and self.allow_holds
        ):
            # A first delivery: left as it is on disk, held in memory (holds.py says why).
            holds.hold_first(qh, seq, (token, r.invisible_until, state), w.on_abort)
        else:
            state.receive_count = received + 1
            state.receipt_token = token
            set_visible_at(w, qid, seq, state, r.invisible_until, "i")
        # Positional (keywords cost 0.5 us per message here), in field order: queue, id, seq,
        # receipt, body, is_text, attributes, group_id, sent_at, receive_count, visible_at.
        return ReceivedMessage(
            r.queue,
            msg.id,
            seq,
            encode_receipt(qid, seq, token),
            body,
            msg.is_text,
            msg.attributes,
            state.group_id,
            state.sent_at,
            received + 1,
            r.visible_at,
        )

    def _dead_letter(
        self,
        w: Writes,
        now: float,
        qid: int,
        seq: int,
        raw: bytes,
        state: DeliveryState,
        fifo: bool,
        target: QueueRecord,
    ) -> None:
        """Move a message to the dead-letter queue in the same transaction (so never lost or doubled)."""
        remove_message(w, qid, seq, state, fifo, now)
        new_seq = target.next_seq
        target.next_seq += 1
        target.count += 1
        target.sent_total += 1
        moved = DeliveryState(
            sent_at=state.sent_at, group_id=state.group_id, visible_ms=to_ms(now), moved=True
        )
        # The record is immutable, so its bytes move as they are (sealed bodies stay sealed).
        add_moved_message(w, target.qid, new_seq, raw, moved, attributes_of(target).ordering == "fifo")

    def _dedupe_token(self, message: NewMessage, content_dedupe: bool) -> bytes | None:
        if message.dedupe_id is not None:
            # Hashed so any id fits LMDB's 511-byte key limit.
            return b"d" + self._digest(message.dedupe_id.encode())[:20]
        if content_dedupe:
            return b"h" + self._digest(message.body)[:20]
        return None

    def _digest(self, data: bytes) -> bytes:
        if self._dedupe_secret is None:
            return hashlib.sha256(data).digest()
        return hmac.new(self._dedupe_secret, data, hashlib.sha256).digest()

    def open_body(self, msg: MessageRecord, tenant: str) -> bytes:
        """A stored body in plain bytes (peek); raises Unavailable when its key is missing."""
        return self._open(msg, tenant)

    def _open(self, msg: MessageRecord, tenant: str) -> bytes:
        if not msg.sealed:
            return msg.body
        if self.keyring is None:
            raise Unavailable("message is encrypted and no key is configured")
        return self.keyring.open(msg.body, sealing_context(tenant, msg.id))

    # Ack, nack, extend ---------------------------------------------------------

    def settle(
        self,
        w: Writes,
        now: float,
        tenant: str,
        receipts: Sequence[str],
        queue: str | None,
        nack_delay_s: float | None,
    ) -> AckResult:
        """Ack (``nack_delay_s`` None) or nack receipts; each fails alone with a code.

        A named ``queue`` that does not exist fails the whole call (queue_not_found), as
        every other queue operation does, before anything is written."""
        if queue is not None:
            find_queue(w, tenant, queue)
        now_ms = to_ms(now)
        queues: dict[int, tuple[str, str, QueueRecord] | None] = {}
        failed: list[ReceiptFailure] = []
        done = 0
        for receipt in receipts:
            try:
                qid, seq, state, fifo, in_memory = self._held(
                    w, now_ms, tenant, receipt, queue, queues, check_stored=nack_delay_s is not None
                )
            except PushgateError as exc:
                failed.append(ReceiptFailure(receipt=str(receipt), code=exc.code))
                continue
            found = queues[qid]
            assert found is not None
            if nack_delay_s is None:
                if in_memory:
                    self._holds.end(qid, seq, w.on_abort, receivable=False)
                if not remove_message(w, qid, seq, state, fifo, now):
                    # (Held, so checked here: the delete itself tells, and wrote nothing.)
                    failed.append(ReceiptFailure(receipt=str(receipt), code=InvalidReceipt.code))
                    continue
                found[2].count -= 1
                found[2].acked_total += 1
                if fifo:
                    w.touched.add((found[0], found[1]))
            else:
                if in_memory and nack_delay_s == 0:
                    # Visible on disk already, where it was: only its count is written.
                    self._end_hold(w, qid, seq, receivable=True)
                else:
                    if in_memory:
                        self._holds.end(qid, seq, w.on_abort, receivable=False)
                        # A copy: the hold keeps its state as on disk, should the batch abort.
                        state = dataclasses.replace(state, receive_count=state.receive_count + 1)
                    state.receipt_token = None
                    set_visible_at(w, qid, seq, state, now_ms + to_ms(nack_delay_s), "n")
                w.touched.add((found[0], found[1]))
            done += 1
        if nack_delay_s is None:
            for found in queues.values():
                if found is not None:
                    save_queue(w, *found)
        return AckResult(acked=done, failed=failed)

    def change_visibility(
        self, w: Writes, now: float, tenant: str, queue: str, receipt: str, timeout_s: float
    ) -> None:
        find_queue(w, tenant, queue)
        now_ms = to_ms(now)
        qid, seq, state, _, in_memory = self._held(w, now_ms, tenant, receipt, queue, {})
        if in_memory:
            if timeout_s == 0:
                self._end_hold(w, qid, seq, receivable=True)
                w.touched.add((tenant, queue))
            else:
                hold = self._holds.get(qid, seq)
                assert hold is not None
                moved: Hold = (hold[TOKEN], now_ms + to_ms(timeout_s), hold[STATE])
                self._holds.extend(qid, seq, moved, w.on_abort)
            return
        if timeout_s == 0:
            state.receipt_token = None
            w.touched.add((tenant, queue))
        set_visible_at(w, qid, seq, state, now_ms + to_ms(timeout_s), "i" if timeout_s else "n")

    def _held(
        self,
        w: Writes,
        now_ms: int,
        tenant: str,
        receipt: str,
        queue: str | None,
        queues: dict[int, tuple[str, str, QueueRecord] | None],
        *,
        check_stored: bool = True,
    ) -> tuple[int, int, DeliveryState, bool, bool]:
        """The message a receipt holds, if the receipt is still valid for this caller, and
        whether it is held in memory. ``check_stored=False``: the caller deletes the message
        and learns from the delete whether it was still stored (an ack)."""
        qid, seq, token = decode_receipt(receipt)
        if qid not in queues:
            queues[qid] = queue_by_qid(w, qid)
        found = queues[qid]
        if found is None or found[0] != tenant or (queue is not None and found[1] != queue):
            raise InvalidReceipt("receipt does not belong to this queue")
        fifo = attributes_of(found[2]).ordering == "fifo"
        hold = self._holds.get(qid, seq)
        if hold is not None and hmac.compare_digest(hold[TOKEN], token):
            # Its state as on disk is in the hold (nothing to decode); every delete of a
            # message forgets its hold, so one still held is stored (checked all the same).
            if check_stored and w.get(_MSGS, message_key(qid, seq)) is None:
                raise InvalidReceipt("message already deleted")
            if hold[UNTIL] <= now_ms:
                # Ended: the next receive of the queue writes its count (nothing is written
                # before an error).
                raise InvalidReceipt("receipt expired: the message is visible again")
            return qid, seq, hold[STATE], fifo, True
        # A receipt that is not a hold's was written with the receive: in the state record.
        raw_state = w.get(_STATE, message_key(qid, seq))
        if raw_state is None:
            if w.get(_MSGS, message_key(qid, seq)) is None:
                raise InvalidReceipt("message already deleted")
            # Never received with a written receive: a hold of a process that is gone.
            raise InvalidReceipt("receipt is stale: the message is visible again")
        state = DeliveryState.decode(raw_state)
        if state.receipt_token is None or not hmac.compare_digest(state.receipt_token, token):
            raise InvalidReceipt("receipt is stale: the message was received again")
        if state.visible_ms <= now_ms:
            raise InvalidReceipt("receipt expired: the message is visible again")
        return qid, seq, state, fifo, False

    # Holds that end unacked: their count is written then ---------------------------

    def _end_hold(self, w: Writes, qid: int, seq: int, *, receivable: bool) -> None:
        hold = self._holds.end(qid, seq, w.on_abort, receivable=receivable)
        if hold is not None:
            _write_count(w, qid, seq, hold)

    def _end_expired_holds(self, w: Writes, qid: int, now_ms: int) -> None:
        for seq, hold in self._holds.expire(qid, now_ms, w.on_abort):
            _write_count(w, qid, seq, hold)

    def held_now(self, w: Writes, qid: int, now_ms: int) -> dict[int, Hold]:
        """The messages of a queue held now (holds that ended are counted on the way)."""
        self._end_expired_holds(w, qid, now_ms)
        qh = self._holds.queue(qid)
        return {} if qh is None else qh.held

    def write_held_counts(self, w: Writes, now: float) -> int:
        """End every hold, writing its count (a clean close: only a crash loses counts)."""
        held = self._holds.all_held()
        for qid, seq, _ in held:
            self._end_hold(w, qid, seq, receivable=True)
        return len(held)

    def write_held_as_received(self, w: Writes, now: float) -> int:
        """Write every hold as the in-flight receive it stands for (same receipt, same end):
        what another process opening the store must see (hold_lock.py)."""
        held = self._holds.all_held()
        for qid, seq, _ in held:
            hold = self._holds.end(qid, seq, w.on_abort, receivable=False)
            assert hold is not None
            state = dataclasses.replace(
                hold[STATE], receive_count=hold[STATE].receive_count + 1, receipt_token=hold[TOKEN]
            )
            set_visible_at(w, qid, seq, state, hold[UNTIL], "i")
        return len(held)

    # Queue-wide deletes (the holds of their messages go too) ----------------------

    def purge_queue(self, w: Writes, tenant: str, name: str) -> int:
        self._holds.forget_queue(find_queue(w, tenant, name).qid, w.on_abort)
        return queue_ops.purge_queue(w, tenant, name)

    def delete_queue(self, w: Writes, tenant: str, name: str) -> None:
        self._holds.forget_queue(find_queue(w, tenant, name).qid, w.on_abort)
        queue_ops.delete_queue(w, tenant, name)

    # Sweeps -----------------------------------------------------------------

    def sweep(
        self, w: Writes, now: float, budget: int, start: bytes = b"", queues: int = SWEEP_QUEUES
    ) -> tuple[int, bytes | None]:
        """Drop expired dedupe entries, and messages past retention in up to ``queues`` queues
        holding messages, from the queue id ``start`` on (its 8 bytes; b"": the first); at
        most ``budget`` deletions. Returns what it dropped and the key to go on from (None:
        the last queue was done).

        Queues are found through the messages, not the queue records: a seek past the last
        message of one queue lands on the first message of the next queue holding any, so
        a queue holding none costs nothing (at 10,000 queues most are empty, an inbox whose
        owner is online; reading every record cost a node a sixth of its idle CPU, session
        64)."""
        done = 0
        now_ms = to_ms(now)
        cursor = w.cursor(Db.DEDUPE_EXP)
        expired: list[bytes] = []
        if cursor.first():
            for key in cursor.iternext(keys=True, values=False):
                if read_u64(key) > now_ms or len(expired) >= budget:
                    break
                expired.append(key)
        for key in expired:
            w.delete(Db.DEDUPE_EXP, key)
            qid, token = read_u64(key, 8), key[16:]
            raw = w.get(Db.DEDUPE, dedupe_key(qid, token))
            if raw is not None and unpack(raw)[2] <= now_ms:
                w.delete(Db.DEDUPE, dedupe_key(qid, token))
            done += 1
        memo = self._sweep_memo
        if not start:
            memo.begin()
        messages = w.cursor(_MSGS)
        expiry = w.cursor(Db.EXPIRY)

        def first_moved(qid: int) -> bytes | None:
            """The queue's first ``expiry`` key: its oldest dead-lettered message."""
            if expiry.set_range(expiry_key(qid, 0, 0)) and read_u64(expiry.key()) == qid:
                return bytes(expiry.key())
            return None

        seek = start
        for _ in range(queues):
            if not messages.set_range(seek):
                memo.end()
                return done, None
            qid = read_u64(messages.key())
            key, seek = u64(qid), u64(qid + 1)
            if memo.quiet(
                qid, now_ms, functools.partial(stored_record_at, w), functools.partial(first_moved, qid)
            ):
                continue  # nothing has come due, nor can have since it was last visited
            found = queue_by_qid(w, qid)
            if found is None:
                continue  # no queue owns them (a queue's deletion drops its messages with it)
            tenant, name, record = found
            attrs = attributes_of(record)
            cutoff = now - attrs.retention_s
            fifo = attrs.ordering == "fifo"
            old, oldest_kept = _past_retention(w, record.qid, cutoff, budget - done)
            # Dead-lettered messages keep their original sent_at, out of seq order.
            if expiry.set_range(expiry_key(record.qid, 0, 0)):
                for ekey in expiry.iternext(values=False):
                    key_qid, sent_ms, seq = split_visibility_key(ekey)
                    if key_qid != record.qid:
                        break
                    if sent_ms >= to_ms(cutoff):
                        oldest_kept = sent_ms if oldest_kept is None else min(oldest_kept, sent_ms)
                        break
                    if done + len(old) >= budget:
                        oldest_kept = _CUT_SHORT
                        break
                    moved = load_state(w, record.qid, seq)
                    if moved is not None and all(seq != s for s, _ in old):
                        old.append((seq, moved))
            for seq, state in old:
                self._holds.end(record.qid, seq, w.on_abort, receivable=False)
                remove_message(w, record.qid, seq, state, fifo, now)
            if old:
                record.count -= len(old)
                save_queue(w, tenant, name, record)
                done += len(old)
                w.note(tenant, name, "expired", len(old))
            if oldest_kept is not None and oldest_kept != _CUT_SHORT:
                # The record's bytes as this batch leaves it (unless a later operation of the
                # batch changes it too: then the next pass looks again).
                due_ms = oldest_kept + to_ms(attrs.retention_s) - 1
                memo.remember(queue_key(tenant, name), record, first_moved(qid), due_ms)
            if done >= budget:
                return done, key  # this queue again: the budget may have cut it short
        if messages.set_range(seek):
            return done, seek
        memo.end()
        return done, None


# What _past_retention's second value is when the walk stopped at its limit, not at a young
# message: what is left may be past retention too.
_CUT_SHORT = -1


def _past_retention(
    w: Writes, qid: int, cutoff: float, limit: int
) -> tuple[list[tuple[int, DeliveryState]], int | None]:
    """Up to ``limit`` messages of a queue sent before ``cutoff``, walking in seq order (send
    order, so the walk ends at the first younger one; dead-lettered messages, whose
    ``sent_at`` breaks that order, are found through ``expiry``). A message's state is its
    state record's, or the initial one its record carries. Second: when the first younger
    one was sent (milliseconds; None: there is none, :data:`_CUT_SHORT`: the walk stopped at
    ``limit``)."""
    old: list[tuple[int, DeliveryState]] = []
    if limit <= 0:
        return old, _CUT_SHORT
    prefix = u64(qid)
    cursor = w.cursor(_MSGS)
    if not cursor.set_range(message_key(qid, 0)):
        return old, None
    for key, raw in cursor:
        if key[:8] != prefix:
            break
        if len(old) >= limit:
            return old, _CUT_SHORT
        raw_state = w.get(_STATE, key)
        state = initial_state_of(raw) if raw_state is None else DeliveryState.decode(raw_state)
        if state is None:
            continue  # an unreadable record: left for an operator (docs/store.md)
        if state.sent_at >= cutoff:
            return old, to_ms(state.sent_at)
        old.append((read_u64(key, 8), state))
    return old, None


def _write_count(w: Writes, qid: int, seq: int, hold: Hold) -> None:
    """A held delivery ended without an ack: store its receive, in place (the visibility
    entry stays where it is; the hold's state is a copy of what is on disk)."""
    state = dataclasses.replace(hold[STATE], receive_count=hold[STATE].receive_count + 1)
    save_state(w, qid, seq, state)
    # Its entry, where it is, now says it has a state record (visibility.py).
    index(w, qid, visibility_key(qid, state.visible_ms, seq), b"")


def sealing_context(tenant: str, message_id: str) -> bytes:
    """AES-GCM associated data: a sealed body opens only as the message it was sealed for,
    so bytes copied into another message (or another tenant's queue) do not decrypt. A
    dead-letter move keeps both, so it needs no re-sealing."""
    return f"{tenant}\0{message_id}".encode()


def _entry_problem(message: NewMessage) -> str | None:
    """Why a message cannot be stored, checked before anything is written."""
    if (
        message.delay_s is None
        and message.group_id is None
        and message.dedupe_id is None
        and not message.attributes
    ):
        return None  # the common case, nothing to check
    if message.delay_s is not None and not 0 <= message.delay_s <= MAX_DELAY_S:
        return f"delay_s must be between 0 and {MAX_DELAY_S}"
    try:
        for text in (message.group_id, message.dedupe_id, *message.attributes, *message.attributes.values()):
            if text is not None:
                text.encode()
    except UnicodeEncodeError:
        return "group_id, dedupe_id and attributes must be valid Unicode"
    except (AttributeError, TypeError):
        return "group_id, dedupe_id and attributes must be strings"
    return None


def next_visible_ms(v: View, qid: int, now_ms: int) -> int | None:
    """When the earliest not-yet-visible message of a queue becomes visible."""
    cursor = v.cursor(_VIS)
    if not cursor.set_range(visibility_key(qid, now_ms + 1, 0)):
        return None
    key_qid, visible_ms, _ = split_visibility_key(cursor.key())
    return visible_ms if key_qid == qid else None


_NOTHING_HELD: dict[int, Hold] = {}
_PAST_EVERY_KEY = b"\xff" * 25  # sorts after every visibility key (24 bytes)


def _queue_start(qid: int) -> bytes:
    return visibility_key(qid, 0, 0)


def _ready(
    w: Writes,
    qid: int,
    now_ms: int,
    limit: int,
    position: bytes,
    held: dict[int, Hold],
    seen: set[int],
) -> tuple[list[tuple[int, int, bool]], bytes | None]:
    """(visible_ms, seq, whether it has no state record) of up to ``limit`` receivable
    messages from ``position`` on, in visibility order, skipping held ones and those already
    looked at; and the last visibility key passed (None: no entry visible now from
    ``position`` on)."""
    out: list[tuple[int, int, bool]] = []
    last: bytes | None = None
    cursor = w.cursor(_VIS)
    if not cursor.set_range(position):
        return out, last
    for key, value in cursor:
        key_qid, visible_ms, seq = split_visibility_key(key)
        if key_qid != qid or visible_ms > now_ms:
            break
        last = key
        if seq in held or seq in seen:
            continue
        out.append((visible_ms, seq, value == INITIAL))
        if len(out) >= limit:
            break
    return out, last


def _find_duplicate(w: Writes, qid: int, token: bytes, now_ms: int) -> SendResult | None:
    raw = w.get(Db.DEDUPE, dedupe_key(qid, token))
    if raw is None:
        return None
    seq, msg_id, expires_ms = unpack(raw)
    if expires_ms <= now_ms:
        return None
    return SendResult(id=MessageId(msg_id), seq=seq, duplicate=True)
