"""Stateful property test: any sequence of queue operations matches a small reference model.

Hypothesis drives send / receive / ack / nack / change-visibility / advance-clock / reopen
against a real store on disk and against :class:`Model`, a few dicts that say what must be
true. It checks, at every step, that nothing is delivered while invisible, FIFO groups
go strictly in order with one message in flight, receipts work exactly while their
message is held, and stats add up; and, when draining, that nothing was lost or doubled.

Time: durations are whole seconds and the clock moves by whole seconds plus 0.37, so a
check never lands exactly on a visibility boundary (it would take 100 moves) and the
store's millisecond rounding cannot flip an answer.

The store is async; the state machine is not. Each run owns an ``asyncio.Runner`` and
drives the store on it, so rules stay plain methods hypothesis can call and shrink.
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
QUEUES = (BEST_EFFORT, FIFO)
GROUPS = ("a", "b", "c")
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


class Model:
    """What the store must hold: live messages by id, and the current time."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.messages: dict[str, ModelMessage] = {}

    @property
    def now(self) -> float:
        return self.clock.now

    def live(self, queue: QueueName) -> list[ModelMessage]:
        return sorted((m for m in self.messages.values() if m.queue == queue), key=lambda m: m.seq)

    def visible(self, queue: QueueName) -> list[ModelMessage]:
        return [m for m in self.live(queue) if m.visible_at <= self.now]

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
        for name, ordering in ((BEST_EFFORT, "best_effort"), (FIFO, "fifo")):
            self.run(
                self.s.create_queue(
                    T1, name, {"ordering": ordering, "visibility_timeout_s": 10, "retention_s": 1209600}
                )
            )

    # Rules ----------------------------------------------------------------

    @rule(
        count=st.integers(1, 3),
        delay=st.sampled_from([None, 0, 3]),
    )
    def send_best_effort(self, count: int, delay: int | None) -> None:
        self._send(BEST_EFFORT, [(None, delay) for _ in range(count)])

    @rule(groups=st.lists(st.sampled_from(GROUPS), min_size=1, max_size=3))
    def send_fifo(self, groups: list[str]) -> None:
        self._send(FIFO, [(g, None) for g in groups])

    def _send(self, queue: QueueName, entries: list[tuple[str | None, int | None]]) -> None:
        messages = []
        for group, delay in entries:
            self.bodies += 1
            messages.append(NewMessage(body=f"{queue}-{self.bodies}".encode(), group_id=group, delay_s=delay))
        results = self.run(self.s.send(T1, queue, messages))
        assert len(results) == len(messages)
        for message, result in zip(messages, results, strict=True):
            assert isinstance(result, SendResult), result
            assert not result.duplicate
            assert result.id not in self.model.messages
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
        queue=st.sampled_from(QUEUES),
        n=st.integers(1, 4),
        timeout=st.sampled_from([1, 5, 30]),
    )
    def receive(self, queue: QueueName, n: int, timeout: int) -> Any:
        now = self.model.now
        got = self.run(self.s.receive(T1, queue, n, visibility_timeout_s=timeout))
        ids = [m.id for m in got]
        assert len(set(ids)) == len(ids), "one receive handed out a message twice"

        if queue == BEST_EFFORT:
            visible = self.model.visible(queue)
            assert len(got) == min(n, len(visible)), "receive left visible messages behind"
            allowed = {m.id for m in visible}
            assert set(ids) <= allowed, "handed out a message that is not visible"
            # Oldest-visible first: nothing left behind became visible before what was taken.
            taken = [self.model.messages[i].visible_at for i in ids]
            assert taken == sorted(taken), "not in the order messages became visible"
            left = [m.visible_at for m in visible if m.id not in set(ids)]
            if taken and left:
                assert max(taken) <= min(left) + TIME_TOLERANCE, "skipped an older visible message"
        else:
            heads = self.model.available_heads()
            groups = [self.model.messages[i].group for i in ids if i in self.model.messages]
            assert len(groups) == len(set(groups)), "two messages of one FIFO group in flight"
            assert set(ids) <= {m.id for m in heads.values()}, "handed out a FIFO message out of turn"
            assert len(got) == min(n, len(heads)), "receive left an available FIFO group behind"

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

    @rule(seconds=st.sampled_from([0.37, 1.37, 4.37, 12.37, 40.37]))
    def advance_clock(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @rule()
    def reopen(self) -> None:
        self.run(self.s.close())
        self.store = self.run(self._open())

    @precondition(lambda self: len(self.model.messages) > 0)
    @rule()
    def drain_and_check(self) -> None:
        """Let every timeout and delay pass, then take and ack everything: all of it, once."""
        self.clock.advance(DRAIN_ADVANCE)
        for queue in QUEUES:
            seen: list[str] = []
            while True:
                got = self.run(self.s.receive(T1, queue, 100, visibility_timeout_s=30))
                if not got:
                    break
                seen += [m.id for m in got]
                for m in got:
                    assert m.body == self.model.messages[m.id].body
                result = self.run(self.s.ack(T1, [m.receipt for m in got]))
                assert result.acked == len(got), result.failed
            assert len(seen) == len(set(seen)), f"{queue}: a message was delivered twice in the drain"
            expected = self.model.live(queue)
            assert set(seen) == {m.id for m in expected}, f"{queue}: lost or invented messages"
            if queue == FIFO:
                for group in GROUPS:
                    order = [i for i in seen if self.model.messages[i].group == group]
                    assert order == [m.id for m in expected if m.group == group], (
                        f"group {group} out of order"
                    )
            for gone in expected:
                del self.model.messages[gone.id]

    # Invariants -------------------------------------------------------------

    @invariant()
    def stats_add_up(self) -> None:
        if self.store is None:
            return
        for queue in QUEUES:
            stats = self.run(self.s.get_queue(T1, queue)).stats
            live = self.model.live(queue)
            assert stats.visible + stats.in_flight + stats.delayed == len(live), (queue, stats)
            if queue == BEST_EFFORT:
                assert stats.visible == len(self.model.visible(queue)), (queue, stats)


QueueMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get("PUSHGATE_MODEL_EXAMPLES", "100")),
    # Below 100 steps, so the clock never sums to a whole-second boundary (see the module docstring).
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestQueueModel = QueueMachine.TestCase
