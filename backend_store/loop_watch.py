"""Logs each time this process's event loop was held, and where (nodes, managers).

A node's lease, its replication heartbeats and its answers to them all run on one asyncio
loop: a loop held for a second (a synchronous pass over thousands of queues, a large
message to pack, the process not scheduled on a loaded machine) is a second in which the
node renews nothing and answers nobody, and a held leader's followers, or a held follower's
leader, can give up on it (docs/cluster.md, "Check-quorum"). So a stall must show in the
log with its cause, not only as its effects.

:class:`LoopWatch` schedules a beat on the loop every ``interval_s``; a thread sleeps until
the next beat is overdue by half the threshold, and while the loop stays overdue it samples
the loop thread's Python stack every ``sample_s`` (``sys._current_frames``), which tells a
loop busy in our code (the stack ends in it) from one held elsewhere (the stack ends at the
loop's own frame: its C code, or the process not scheduled at all, when no sample comes).
When the loop runs again, one warning gives how long it was held and the stack seen most
often.

The watch wakes the process about six times a second, where it woke it forty (a beat and a
check every 50 ms): on the 2 vCPU machine of session 67 a wake-up of an idle process costs
100-270 us of CPU, and the watch alone cost each node and manager about 10 ms of CPU a
second, a third of an idle dev cluster's.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import sys
import threading
import time
import traceback

log = logging.getLogger("pushgate.loop")

# Frames of a sampled stack kept in the warning (innermost last).
_FRAMES = 12


class LoopWatch:
    """Warns when the running loop went ``threshold_s`` or more without a beat."""

    def __init__(self, *, threshold_s: float = 0.5, interval_s: float = 0.25, sample_s: float = 0.05) -> None:
        self.threshold_s = threshold_s
        self.interval_s = interval_s
        self.sample_s = sample_s
        self._beat = time.monotonic()
        self._stop = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._handle: asyncio.TimerHandle | None = None
        self._thread: threading.Thread | None = None
        # Stacks sampled during the stall under way (reset at each beat).
        self._samples: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()

    def start(self) -> None:
        """Watch the running loop (call from it)."""
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._beat = time.monotonic()
        self._handle = self._loop.call_later(self.interval_s, self._on_beat)
        self._thread = threading.Thread(target=self._watch, name="loop-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._handle is not None:
            self._handle.cancel()

    def _on_beat(self) -> None:
        now = time.monotonic()
        held = now - self._beat - self.interval_s
        self._beat = now
        with self._lock:
            samples, self._samples = self._samples, collections.Counter()
        if held >= self.threshold_s:
            if samples:
                stack, seen = samples.most_common(1)[0]
                where = f"; in {seen} of {sum(samples.values())} samples:\n{stack}"
            else:
                where = " (no sample: the process itself was not running)"
            log.warning("event loop held for %.2f s%s", held, where)
        assert self._loop is not None
        if not self._stop.is_set():
            self._handle = self._loop.call_later(self.interval_s, self._on_beat)

    def _watch(self) -> None:
        while not self._stop.is_set():
            overdue_at = self._beat + self.interval_s + self.threshold_s / 2
            now = time.monotonic()
            if now < overdue_at:
                self._stop.wait(overdue_at - now)
                continue
            frame = sys._current_frames().get(self._loop_thread)
            if frame is not None:
                stack = "".join(traceback.format_list(traceback.extract_stack(frame)[-_FRAMES:])).rstrip()
                with self._lock:
                    self._samples[stack] += 1
            self._stop.wait(self.sample_s)
