"""The simulation's clock and processes: an asyncio loop on virtual time, and the processes on it.

:class:`VirtualLoop` is an ordinary asyncio event loop whose clock is a number the loop moves
itself: when nothing is ready it jumps to the next timer instead of waiting, so a minute of
cluster life takes as long as the callbacks in it. There is no I/O (the network is
simulated, :mod:`.network`), no thread and no wall clock, so one seed always gives the same
sequence of callbacks: production code that runs on asyncio (the manager, replication, the
node protocol, the gateway's map) runs on it unchanged.

A :class:`Process` is one simulated OS process (a node, a manager, a gateway): the tasks it
started, whether it is alive, frozen (SIGSTOP) or dead (SIGKILL), and its own clock (which
may run fast or slow: clock skew). Killing one cancels its tasks, after cutting everything it
can reach (its connections, its etcd calls), so the cleanup its code runs on the way out has
no effect outside, as with SIGKILL. Freezing one holds whatever it sends or receives until it
thaws; the simulation's own models (the node) also stop at their next await.
"""

from __future__ import annotations

import asyncio
import contextvars
import heapq
import itertools
import zlib
from asyncio import events
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar, TypeVarTuple

T = TypeVar("T")
_Ts = TypeVarTuple("_Ts")


class SimulationStuck(RuntimeError):
    """Nothing is scheduled and nothing is ready: every process waits for ever."""


class VirtualLoop(asyncio.BaseEventLoop):
    """An asyncio loop on virtual time. ``after_step`` runs once per loop iteration (the
    invariants' hook: nothing runs between two iterations).

    Every task belongs to the process whose task created it (a task factory), so killing a
    process reaches the tasks that production code (the manager, replication) starts itself."""

    def __init__(self) -> None:
        super().__init__()
        self._now = 0.0
        self._clock_resolution = 1e-9
        self.step_hooks: list[Callable[[], None]] = []
        self._timers: list[tuple[float, int, asyncio.TimerHandle]] = []
        self._sequence = itertools.count()
        self.owners: dict[asyncio.Task[Any], Process] = {}
        self.spawning: Process | None = None
        self.set_task_factory(_owned_task)  # type: ignore[arg-type]  # typeshed wants a positional-only context

    def time(self) -> float:
        return self._now

    # The scheduler: asyncio's own, with the timer heap holding ``(when, seq, handle)``
    # tuples (compared in C, in the order they were set) instead of handles compared in
    # Python: the simulation sets a timer for nearly everything it does.

    def call_at(
        self,
        when: float,
        callback: Callable[[*_Ts], object],
        *args: *_Ts,
        context: contextvars.Context | None = None,
    ) -> asyncio.TimerHandle:
        timer: Any = events.TimerHandle(when, callback, args, self, context)
        heapq.heappush(self._timers, (when, next(self._sequence), timer))
        timer._scheduled = True
        return timer  # type: ignore[no-any-return]

    def _run_once(self) -> None:
        ready: Any = self._ready  # type: ignore[attr-defined]  # BaseEventLoop's, untyped in typeshed
        timers = self._timers
        if not ready and not self._stopping:  # type: ignore[attr-defined]
            while timers and timers[0][2].cancelled():
                heapq.heappop(timers)
            if not timers:
                raise SimulationStuck("no timer is set and nothing is ready")
            if timers[0][0] > self._now:
                self._now = timers[0][0]
        self.after_step()
        end = self._now + self._clock_resolution
        while timers and timers[0][0] < end:
            # A timer within the clock's resolution runs now, as asyncio's do, and the clock
            # moves to its time: real time moves on, and a loop that waits for the rest of a
            # deadline 1e-13 s away must see it pass (it spun at one instant for good, session 39).
            self._now = max(self._now, timers[0][0])
            timer: Any = heapq.heappop(timers)[2]
            if not timer._cancelled:
                timer._scheduled = False
                ready.append(timer)
        for _ in range(len(ready)):
            handle = ready.popleft()
            if not handle._cancelled:
                handle._run()

    def after_step(self) -> None:
        for hook in self.step_hooks:
            hook()

    def _write_to_self(self) -> None:
        pass

    def owner(self) -> Process | None:
        """The process whose task is running now (None: a plain callback)."""
        task = asyncio.current_task(self)
        return self.owners.get(task) if task is not None else None


def _owned_task(
    loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any], context: Any = None
) -> asyncio.Task[Any]:
    task: asyncio.Task[Any] = asyncio.Task(coro, loop=loop, context=context)
    assert isinstance(loop, VirtualLoop)
    owner = loop.spawning
    if owner is None:
        parent = asyncio.current_task(loop)
        owner = loop.owners.get(parent) if parent is not None else None
    if owner is not None:
        owner.adopt(loop, task)
    return task


class Process:
    """One simulated process. ``name`` is its host name on the network (a restarted process
    gets a new :class:`Process` with the same name and a higher ``incarnation``)."""

    def __init__(self, name: str, incarnation: int = 0, *, clock_rate: float = 1.0) -> None:
        self.name = name
        self.incarnation = incarnation
        self.alive = True
        self.frozen = False
        self._thawed = asyncio.Event()
        self._thawed.set()
        self._tasks: list[asyncio.Task[Any]] = []
        self._on_kill: list[Callable[[], None]] = []
        self._on_thaw: list[Callable[[], None]] = []
        # Clock skew: this process's clock runs at ``clock_rate`` times real (virtual) time.
        self.clock_rate = clock_rate
        self._clock_base = asyncio.get_running_loop().time()
        self._local_base = 0.0

    def __repr__(self) -> str:
        return f"<{self.name}#{self.incarnation}>"

    # Time --------------------------------------------------------------------------

    def clock(self) -> float:
        """This process's monotonic clock (skewed by ``clock_rate``)."""
        now = asyncio.get_running_loop().time()
        return self._local_base + (now - self._clock_base) * self.clock_rate

    def set_clock_rate(self, rate: float) -> None:
        self._local_base = self.clock()
        self._clock_base = asyncio.get_running_loop().time()
        self.clock_rate = rate

    def local_to_real(self, seconds: float) -> float:
        """How long ``seconds`` of this process's clock take in virtual time."""
        return seconds / self.clock_rate

    async def sleep(self, seconds: float) -> None:
        """Sleep ``seconds`` of this process's clock; a frozen process wakes when it thaws."""
        await asyncio.sleep(self.local_to_real(seconds))
        await self.awake()

    async def awake(self) -> None:
        """Return at once, or when a frozen process thaws (never, if it dies frozen)."""
        if self.frozen:
            await self._thawed.wait()

    # Tasks ------------------------------------------------------------------------------

    def spawn(self, coro: Coroutine[Any, Any, T], name: str = "") -> asyncio.Task[T]:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, VirtualLoop)
        loop.spawning = self
        try:
            return loop.create_task(coro, name=f"{self.name}: {name}")
        finally:
            loop.spawning = None

    def adopt(self, loop: VirtualLoop, task: asyncio.Task[Any]) -> None:
        if not self.alive:
            task.cancel()  # a dead process starts nothing (its cleanup may try)
        loop.owners[task] = self
        task.add_done_callback(lambda t: loop.owners.pop(t, None))
        self._tasks.append(task)
        if len(self._tasks) > 256:
            self._tasks = [t for t in self._tasks if not t.done()]

    def on_kill(self, callback: Callable[[], None]) -> None:
        """``callback()`` when the process dies (before its tasks are cancelled)."""
        self._on_kill.append(callback)

    def on_thaw(self, callback: Callable[[], None]) -> None:
        self._on_thaw.append(callback)

    # Faults ------------------------------------------------------------------------------

    def kill(self) -> None:
        """SIGKILL: everything outside is cut first, then the tasks are cancelled."""
        if not self.alive:
            return
        self.alive = False
        for callback in self._on_kill:
            callback()
        self._on_kill.clear()
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        self._thawed.set()  # its tasks unwind (their effects go nowhere)

    def freeze(self) -> None:
        if self.alive and not self.frozen:
            self.frozen = True
            self._thawed.clear()

    def thaw(self) -> None:
        if self.frozen:
            self.frozen = False
            self._thawed.set()
            callbacks, self._on_thaw = self._on_thaw, []
            for callback in callbacks:
                callback()


class Trace:
    """Every notable event of a run: the last ``keep`` in full (printed on a failure), and a
    running digest of all of them (two runs of a seed must give the same digest)."""

    def __init__(self, keep: int = 400) -> None:
        self.keep = keep
        self._ring: list[tuple[float, str, str]] = []
        self._start = 0
        self.count = 0
        self._digest = 0

    def add(self, now: float, actor: str, text: str) -> None:
        self.count += 1
        # CRC-32, not hash(): the same in every process whatever PYTHONHASHSEED is.
        self._digest = zlib.crc32(f"{now:.9f}|{actor}|{text}\n".encode(), self._digest)
        item = (now, actor, text)
        if len(self._ring) < self.keep:
            self._ring.append(item)
        else:
            self._ring[self._start] = item
            self._start = (self._start + 1) % self.keep

    def last(self, n: int | None = None) -> list[tuple[float, str, str]]:
        items = self._ring[self._start :] + self._ring[: self._start]
        return items if n is None else items[-n:]

    @property
    def digest(self) -> str:
        return f"{self._digest:08x}-{self.count}"
