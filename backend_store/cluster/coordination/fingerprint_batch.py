"""A process's watch checks due together, in one etcd request.

Each watch checks its prefix every couple of seconds (``prefix_fingerprint.py``), and a
process watches several prefixes: a node, manager or gateway six to eight, so a 3-node dev
cluster asked etcd for about 19 fingerprints a second, each a round trip that cost etcd
about 1.1 ms of CPU and the asking process as much on this 2-core VM (session 78: a
cluster's checks were a third of its idle CPU at 10,000 inboxes). The checks now fall due at
the same moments (``prefix_fingerprint.check_due``), and those asked within
:data:`GATHER_S` of each other go as one read-only etcd transaction of ranges: one round
trip, and the same answers, each at the transaction's revision.

A waiter cancelled meanwhile is dropped; a failed read fails every waiter of it (each gets
its own exception); the batch that a closing coordinator abandons fails its waiters too, so
that none waits for an answer no one will give.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

from .coordinator import CoordinatorUnavailable
from .prefix_fingerprint import Fingerprint

# How long the first check due waits for the others of its moment. Their timers are set to
# the same instant, but each loop's clock rounds (uvloop's to the millisecond) and a busy
# loop runs them a turn or two apart; a check 20 ms later changes nothing it can see.
GATHER_S = 0.02
# Prefixes in one transaction, within etcd's default ``--max-txn-ops`` of 128.
MOST_PER_READ = 64

ReadFingerprints = Callable[[Sequence[str]], Awaitable[list[Fingerprint]]]


class FingerprintBatch:
    """``fingerprint(prefix)`` calls made together, answered by one ``read`` of them all."""

    def __init__(self, read: ReadFingerprints, *, gather_s: float = GATHER_S) -> None:
        self._read = read
        self._gather_s = gather_s
        self._due: dict[str, list[asyncio.Future[Fingerprint]]] = {}
        self._gathering: asyncio.Task[None] | None = None  # the batch still taking checks
        # Every batch under way, its read included: asyncio holds tasks only weakly, and a
        # batch collected mid-read would leave its watches waiting for good.
        self._under_way: set[asyncio.Task[None]] = set()

    async def fingerprint(self, prefix: str) -> Fingerprint:
        answer: asyncio.Future[Fingerprint] = asyncio.get_running_loop().create_future()
        self._due.setdefault(prefix, []).append(answer)
        if self._gathering is None:
            task = self._gathering = asyncio.create_task(self._answer(), name="watch checks")
            self._under_way.add(task)
            task.add_done_callback(self._under_way.discard)
        return await answer

    async def _answer(self) -> None:
        due: dict[str, list[asyncio.Future[Fingerprint]]] = {}
        try:
            await asyncio.sleep(self._gather_s)
            due, self._due, self._gathering = self._due, {}, None
            prefixes = [p for p, waiters in due.items() if not all(w.done() for w in waiters)]
            for start in range(0, len(prefixes), MOST_PER_READ):
                some = prefixes[start : start + MOST_PER_READ]
                try:
                    seen = await self._read(some)
                except CoordinatorUnavailable as exc:
                    for prefix in some:
                        _fail(due[prefix], str(exc))
                    continue
                for prefix, fingerprint in zip(some, seen, strict=True):
                    for waiter in due[prefix]:
                        if not waiter.done():
                            waiter.set_result(fingerprint)
        finally:
            if self._gathering is asyncio.current_task():  # cancelled while gathering
                due, self._due, self._gathering = self._due, {}, None
            for waiters in due.values():
                _fail(waiters, "etcd: the watch checks were abandoned")


def _fail(waiters: list[asyncio.Future[Fingerprint]], why: str) -> None:
    for waiter in waiters:
        if not waiter.done():
            waiter.set_exception(CoordinatorUnavailable(why))
