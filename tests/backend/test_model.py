"""Stateful property test: any sequence of queue operations matches a small reference model.

Hypothesis drives send / receive / ack / nack / change-visibility / purge / advance-clock /
reopen / drain against a real store and against :class:`Model`, a few dicts that say what must be
true. At every step it checks that nothing is delivered while invisible, FIFO groups go
strictly in order with one message in flight, receipts work exactly while their message is
held, dedupe answers with the original, dead-lettering neither loses nor doubles a message,
and stats add up; when draining, that nothing was lost or delivered twice.

Queues: ``be`` best effort with dedupe ids; ``ff`` FIFO; ``dl`` best effort with
``max_receives`` 2 into ``dead``. A ``dl`` message received twice and visible again is
*doomed*: the store may move it at any receive, must never hand it out again, and must hold
it in exactly one of ``dl`` and ``dead``.

Time: durations are whole seconds and the clock moves by whole seconds plus 0.37, so a check
never lands exactly on a visibility or dedupe boundary (it would take 100 moves) and the
store's millisecond rounding cannot flip an answer.

``PUSHGATE_MODEL_EXAMPLES`` (default 100, about 20 s) sets how many runs hypothesis makes; raise it
for a longer hunt.

The store is async; the state machine is not. Each run owns an ``asyncio.Runner`` and drives
the store on it, so rules stay plain methods hypothesis can call and shrink.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
)

from backend_store import Backend, NewMessage, QueueName, SendResult, StoreOptions, open_backend
from backend_store.errors import InvalidReceipt

from ..conftest import ManualClock
from .harness import T1

T = TypeVar("T")

BEST_EFFORT = QueueName("be")
FIFO = QueueName("ff")
DEAD_LETTERING = QueueName("dl")
DEAD = QueueName("dead")
RECEIVABLE = (BEST_EFFORT, FIFO, DEAD_LETTERING)
GROUPS = ("a", "b", "c")
DEDUPE_IDS = ("d1", "d2", "d3")
MAX_RECEIVES = 2
DEDUPE_WINDOW_S = 300
VISIBILITY_S = 10
# Half a millisecond more than the store's rounding (it keeps milliseconds).
TIME_TOLERANCE = 0.002
DRAIN_ADVANCE = 10_000.0


def _scratch_dir() -> str | None:
    """Memory-backed when the machine has it: this test checks semantics, not fsync
    (test_crash does), and hypothesis runs and shrinks thousands of steps."""
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None


@dataclass
class ModelMessage:
    id: str
    queue: QueueName
    seq: int
    body: bytes
    group: str | None
    visible_at: float
    receive_count: int = 0
    receipt: str | None = None


@dataclass(frozen=True)
class DedupeEntry:
    id: str
    seq: int
    sent_at: float


class Model:
    """What the store must hold: live messages by id, dedupe ids, and the current time."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.messages: dict[str, ModelMessage] = {}
        self.dedupe: dict[tuple[QueueName, str], DedupeEntry] = {}

    @property
    def now(self) -> float:
        return self.clock.now

    def live(self, queue: QueueName) -> list[ModelMessage]:
        return sorted((m for m in self.messages.values() if m.queue == queue), key=lambda m: m.seq)

    def visible(self, queue: QueueName) -> list[ModelMessage]:
        return [m for m in self.live(queue) if m.visible_at <= self.now]

    def doomed(self, m: ModelMessage) -> bool:
        """Past max_receives and visible again: bound for the dead-letter queue."""
        return m.queue == DEAD_LETTERING and m.receive_count >= MAX_RECEIVES and m.visible_at <= self.now

    def deliverable(self, queue: QueueName) -> list[ModelMessage]:
        return [m for m in self.visible(queue) if not self.doomed(m)]

    def fifo_heads(self) -> dict[str, ModelMessage]:
        """Each FIFO group's oldest live message."""
        heads: dict[str, ModelMessage] = {}
        for m in self.live(FIFO):
            assert m.group is not None
            heads.setdefault(m.group, m)
        return heads

    def available_heads(self) -> dict[str, ModelMessage]:
        """Groups that may hand out a message now: the head is visible (so not in flight)."""
        return {g: m for g, m in self.fifo_heads().items() if m.visible_at <= self.now}

    def holder_of(self, receipt: str) -> ModelMessage | None:
        """The message a receipt currently holds; None when the receipt is spent or stale."""
        for m in self.messages.values():
            if m.receipt == receipt and m.visible_at > self.now:
                return m
        return None

    def original(self, queue: QueueName, dedupe_id: str | None) -> DedupeEntry | None:
        if dedupe_id is None:
            return None
        entry = self.dedupe.get((queue, dedupe_id))
        if entry is None or self.now - entry.sent_at >= DEDUPE_WINDOW_S:
            return None
        return entry


class QueueMachine(RuleBasedStateMachine):
    receipts = Bundle("receipts")

    def __init__(self) -> None:
        super().__init__()
        self.runner = asyncio.Runner()
        self.root = Path(tempfile.mkdtemp(prefix="pushgate-model-", dir=_scratch_dir()))
        self.clock = ManualClock()
        self.model = Model(self.clock)
        self.store: Backend | None = None
        self.bodies = 0

    # Plumbing -------------------------------------------------------------

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.runner.run(coro)

    async def _open(self) -> Backend:
        # No background sweeper: retention is far away and it would race the model.
        options = StoreOptions(clock=self.clock, sweep_interval_s=0)
        store = open_backend(f"lmdb://{self.root / 'store'}", options)
        await store.start()
        return store

    @property
    def s(self) -> Backend:
        assert self.store is not None
        return self.store

    def teardown(self) -> None:
        try:
            if self.store is not None:
                self.drain_and_check()
                self.run(self.s.close())
        finally:
            self.runner.close()
            shutil.rmtree(self.root, ignore_errors=True)

    @initialize()
    def open_store(self) -> None:
        self.store = self.run(self._open())
        common = {"visibility_timeout_s": VISIBILITY_S, "retention_s": 1209600}
        for name, extra in (
            (DEAD, {}),
            (BEST_EFFORT, {"dedupe_window_s": DEDUPE_WINDOW_S}),
            (FIFO, {"ordering": "fifo"}),
            (DEAD_LETTERING, {"max_receives": MAX_RECEIVES, "dead_letter_queue": DEAD}),
        ):
            self.run(self.s.create_queue(T1, name, {**common, **extra}))

    # Rules ----------------------------------------------------------------

    @rule(
        entries=st.lists(
            st.tuples(st.sampled_from([None, 0, 3]), st.sampled_from([None, None, *DEDUPE_IDS])),
            min_size=1,
            max_size=3,
        )
    )
    def send_best_effort(self, entries: list[tuple[int | None, str | None]]) -> None:
        self._send(BEST_EFFORT, [(None, delay, dedupe_id) for delay, dedupe_id in entries])

    @rule(groups=st.lists(st.sampled_from(GROUPS), min_size=1, max_size=3))
    def send_fifo(self, groups: list[str]) -> None:
        self._send(FIFO, [(g, None, None) for g in groups])

    @rule(count=st.integers(1, 3))
    def send_dead_lettering(self, count: int) -> None:
        self._send(DEAD_LETTERING, [(None, None, None)] * count)

    def _send(self, queue: QueueName, entries: list[tuple[str | None, int | None, str | None]]) -> None:
        messages = []
        for group, delay, dedupe_id in entries:
            self.bodies += 1
            body = f"{queue}-{self.bodies}".encode()
            messages.append(NewMessage(body=body, group_id=group, delay_s=delay, dedupe_id=dedupe_id))
        results = self.run(self.s.send(T1, queue, messages))
        assert len(results) == len(messages)
        for message, result in zip(messages, results, strict=True):
            assert isinstance(result, SendResult), result
            original = self.model.original(queue, message.dedupe_id)
            if original is not None:
                assert (result.id, result.seq, result.duplicate) == (original.id, original.seq, True)
                continue
            assert not result.duplicate, "a duplicate outside the dedupe window"
            assert result.id not in self.model.messages
            if message.dedupe_id is not None:
                self.model.dedupe[(queue, message.dedupe_id)] = DedupeEntry(
                    result.id, result.seq, self.model.now
                )
            self.model.messages[result.id] = ModelMessage(
                id=result.id,
                queue=queue,
                seq=result.seq,
                body=message.body,
                group=message.group_id,
                visible_at=self.model.now + (message.delay_s or 0),
            )

    @rule(
        target=receipts,
        queue=st.sampled_from(RECEIVABLE),
        n=st.integers(1, 4),
        timeout=st.sampled_from([1, 5, 30]),
    )
    def receive(self, queue: QueueName, n: int, timeout: int) -> Any:
        now = self.model.now
        got = self.run(self.s.receive(T1, queue, n, visibility_timeout_s=timeout))
        ids = [m.id for m in got]
        assert len(set(ids)) == len(ids), "one receive handed out a message twice"
        assert all(i in self.model.messages and self.model.messages[i].queue == queue for i in ids)

        if queue == FIFO:
            heads = self.model.available_heads()
            groups = [self.model.messages[i].group for i in ids]
            assert len(groups) == len(set(groups)), "two messages of one FIFO group in flight"
            assert set(ids) <= {m.id for m in heads.values()}, "handed out a FIFO message out of turn"
            assert len(got) == min(n, len(heads)), "receive left an available FIFO group behind"
        else:
            deliverable = self.model.deliverable(queue)
            allowed = {m.id for m in deliverable}
            doomed = {m.id for m in self.model.visible(queue)} - allowed
            assert not set(ids) & doomed, "handed out a message past max_receives"
            assert set(ids) <= allowed, "handed out a message that is not visible"
            assert len(got) == min(n, len(deliverable)), "receive left visible messages behind"
            # Oldest-visible first: nothing left behind became visible before what was taken.
            taken = [self.model.messages[i].visible_at for i in ids]
            assert taken == sorted(taken), "not in the order messages became visible"
            left = [m.visible_at for m in deliverable if m.id not in set(ids)]
            if taken and left:
                assert max(taken) <= min(left) + TIME_TOLERANCE, "skipped an older visible message"

        for m in got:
            model = self.model.messages[m.id]
            assert m.body == model.body
            assert m.group_id == model.group
            assert m.seq == model.seq
            assert m.receive_count == model.receive_count + 1
            assert abs(m.visible_at - (now + timeout)) <= TIME_TOLERANCE
            model.receive_count += 1
            model.receipt = m.receipt
            model.visible_at = now + timeout
        return multiple(*[(queue, m.receipt) for m in got])

    @rule(held=receipts)
    def ack(self, held: tuple[QueueName, str]) -> None:
        _, receipt = held
        holder = self.model.holder_of(receipt)
        result = self.run(self.s.ack(T1, [receipt]))
        if holder is None:
            assert result.acked == 0, "a spent or stale receipt deleted a message"
            assert [f.code for f in result.failed] == ["invalid_receipt"]
        else:
            assert (result.acked, result.failed) == (1, []), "a held message's receipt did not work"
            del self.model.messages[holder.id]

    @rule(held=receipts, delay=st.sampled_from([0, 2, 7]))
    def nack(self, held: tuple[QueueName, str], delay: int) -> None:
        _, receipt = held
        holder = self.model.holder_of(receipt)
        result = self.run(self.s.nack(T1, [receipt], delay_s=delay))
        if holder is None:
            assert result.acked == 0, "a spent or stale receipt released a message"
        else:
            assert result.acked == 1
            holder.visible_at = self.model.now + delay
            holder.receipt = None

    @rule(held=receipts, timeout=st.sampled_from([0, 3, 20]))
    def change_visibility(self, held: tuple[QueueName, str], timeout: int) -> None:
        queue, receipt = held
        holder = self.model.holder_of(receipt)
        try:
            self.run(self.s.change_visibility(T1, queue, receipt, timeout))
        except InvalidReceipt:
            assert holder is None, "a held message's receipt was refused"
            return
        assert holder is not None, "a spent or stale receipt changed visibility"
        holder.visible_at = self.model.now + timeout
        if timeout == 0:
            # Visible again at once: the receipt is spent.
            holder.receipt = None

    # Up to just under the dedupe window, so dedupe expiry is reached within one run.
    @rule(seconds=st.sampled_from([0.37, 1.37, 4.37, 12.37, 40.37, 150.37, 299.37]))
    def advance_clock(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @rule()
    def purge_fifo(self) -> None:
        # FIFO only: it has no dedupe ids, whose fate after a purge the contract leaves open.
        live = self.model.live(FIFO)
        assert self.run(self.s.purge_queue(T1, FIFO)) == len(live)
        for m in live:
            del self.model.messages[m.id]

    @rule()
    def reopen(self) -> None:
        self.run(self.s.close())
        self.store = self.run(self._open())

    @precondition(lambda self: len(self.model.messages) > 0)
    @rule()
    def drain_and_check(self) -> None:
        """Let every timeout and delay pass, then take and ack everything: all of it, once."""
        self.clock.advance(DRAIN_ADVANCE)
        for queue in RECEIVABLE:
            seen = self._drain(queue)
            assert len(seen) == len(set(seen)), f"{queue}: a message was delivered twice in the drain"
            expected = self.model.deliverable(queue)
            assert set(seen) == {m.id for m in expected}, f"{queue}: lost or invented messages"
            if queue == FIFO:
                for group in GROUPS:
                    order = [i for i in seen if self.model.messages[i].group == group]
                    assert order == [m.id for m in expected if m.group == group], (
                        f"group {group} out of order"
                    )
            for gone in expected:
                del self.model.messages[gone.id]
        # What is left in the model is every doomed message: each in the DLQ exactly once.
        dead = {self.model.messages[i].body for i in self.model.messages}
        bodies = [body for _, body in self._drain_bodies(DEAD)]
        assert len(bodies) == len(set(bodies)), "a dead-lettered message arrived twice"
        assert set(bodies) == dead, "dead-lettering lost or invented messages"
        self.model.messages.clear()

    def _drain(self, queue: QueueName) -> list[str]:
        return [i for i, _ in self._drain_bodies(queue)]

    def _drain_bodies(self, queue: QueueName) -> list[tuple[str, bytes]]:
        seen: list[tuple[str, bytes]] = []
        while got := self.run(self.s.receive(T1, queue, 100, visibility_timeout_s=30)):
            for m in got:
                if m.id in self.model.messages and queue != DEAD:
                    assert m.body == self.model.messages[m.id].body
            seen += [(m.id, m.body) for m in got]
            result = self.run(self.s.ack(T1, [m.receipt for m in got]))
            assert result.acked == len(got), result.failed
        return seen

    # Invariants -------------------------------------------------------------

    @invariant()
    def stats_add_up(self) -> None:
        if self.store is None:
            return
        totals: dict[QueueName, int] = {}
        for queue in (*RECEIVABLE, DEAD):
            stats = self.run(self.s.get_queue(T1, queue)).stats
            totals[queue] = stats.visible + stats.in_flight + stats.delayed
            if queue == BEST_EFFORT:
                assert stats.visible == len(self.model.visible(queue)), (queue, stats)
        assert totals[BEST_EFFORT] == len(self.model.live(BEST_EFFORT))
        assert totals[FIFO] == len(self.model.live(FIFO))
        # A dead-letter move is atomic: each dl message is in exactly one of the two queues.
        assert totals[DEAD_LETTERING] + totals[DEAD] == len(self.model.live(DEAD_LETTERING)), totals
        assert totals[DEAD_LETTERING] >= len(
            [m for m in self.model.live(DEAD_LETTERING) if not self.model.doomed(m)]
        )


QueueMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get("PUSHGATE_MODEL_EXAMPLES", "100")),
    # Below 100 steps, so the clock never sums to a whole-second boundary (see the module docstring).
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestQueueModel = QueueMachine.TestCase
