"""Sliding window counters in Redis, spent through local shares: most checks never leave the process.

Every unit a request spends has been counted in Redis first. A gateway takes units from a
counter in Redis in chunks (a **share**), spends them on its own requests without asking
Redis again, and gives back what it has not spent after ``LEASE_S``. So the counter in
Redis never lets through more than one sliding window counter would (grants are counted
like requests), and what a gateway spends later than it took is bounded by what it may
hold: ``share_max`` units per counter, ``floor(amount * local_share)``. docs/throttling.md
states the bound this gives (``N`` gateways: at most ``N * share_max`` more in any interval).

- A counter whose ``share_max`` is 0 (small limits: under 100 per window with the default
  1%) is exact: every request asks Redis for its own unit.
- A share's size adapts to this gateway's rate on the counter (what it spent since the
  last answer, over ``REFILL_S``), between 1 and ``share_max``: a quiet counter holds
  little, a busy one asks Redis a few times a second. A share below half its chunk asks
  for more in the background, so a busy counter's requests do not wait.
- What concurrent requests ask of Redis goes in **one script call** per round trip: the
  counters that need units queue up while a call is in flight, and the next call carries
  them all (one ``EVALSHA`` over many keys).
- A refused counter is not asked again before the time its window says it has room
  (at most ``REFUSED_CACHE_S``): a flood of refused requests costs no Redis calls.

Time in Redis is Redis's (``TIME`` in the script), so gateways agree on windows; this
process keeps a mirror of each counter as of its last answer, for the IETF fields.
Only redis-py's public API is used (``register_script``); the script is ours.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple
from urllib.parse import quote

import redis.asyncio as aioredis

from .decision import CountedWindows, Decision, Rule, Window, policy_name
from .errors import STORAGE_ERRORS
from .health import SharedStateHealth
from .url import SharedStateUrl, redis_options
from .window_counter import WindowCounter

log = logging.getLogger("pushgate.throttling")

KEY_PREFIX = "pushgate-rate:"
# The default local share: a gateway may hold up to 1% of a counter's amount.
LOCAL_SHARE = 0.01
# Units held longer than this are given back (not spent).
LEASE_S = 1.0
# A share aims to last this long at the rate it is spent.
REFILL_S = 0.1
# A refused counter answers locally for at most this long before asking Redis again.
REFUSED_CACHE_S = 1.0
# Counters per script call.
MAX_BATCH = 256
# Arguments per counter in the script call.
_ARGS = 6

# KEYS: one hash per counter (fields s: window start in ms, c: current count, p: previous).
# ARGV, six per key: window (ms), amount, want, need, release_start (ms), release.
# For each key: roll to the window holding Redis's now; give back ``release`` units counted
# in the window that started at ``release_start`` (if it is the current or the previous
# one); grant min(want, room) if room >= need, else nothing. Returns, per key,
# {granted, window start, current, previous, now} (integers, ms).
ACQUIRE_SCRIPT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {}
for i = 1, #KEYS do
  local a = (i - 1) * 6
  local window = tonumber(ARGV[a + 1])
  local amount = tonumber(ARGV[a + 2])
  local want = tonumber(ARGV[a + 3])
  local need = tonumber(ARGV[a + 4])
  local release_start = tonumber(ARGV[a + 5])
  local release = tonumber(ARGV[a + 6])
  local start = now - now % window
  local state = redis.call('HMGET', KEYS[i], 's', 'c', 'p')
  local s = tonumber(state[1])
  local c = tonumber(state[2]) or 0
  local p = tonumber(state[3]) or 0
  if s ~= start then
    if s == start - window then p = c else p = 0 end
    c = 0
  end
  if release > 0 then
    if release_start == start then
      c = math.max(0, c - release)
    elseif release_start == start - window then
      p = math.max(0, p - release)
    end
  end
  local granted = 0
  if want > 0 then
    local room = math.floor(amount - c - p * (start + window - now) / window)
    if room >= need then granted = math.min(want, room) end
  end
  c = c + granted
  redis.call('HSET', KEYS[i], 's', start, 'c', c, 'p', p)
  redis.call('PEXPIRE', KEYS[i], 2 * window)
  out[i] = {granted, start, c, p, now}
end
return out
"""


class Share(WindowCounter):
    """One Redis counter as this gateway sees it: a mirror of its window, and the units it holds."""

    __slots__ = (
        "answered_at",
        "chunk",
        "expires",
        "held",
        "held_start_ms",
        "inflight",
        "key",
        "older",
        "prefetch",
        "queued",
        "refused_until",
        "sending",
        "share_max",
        "used",
        "waiters",
    )

    def __init__(self, policy: str, amount: int, window_s: int, now: float, key: str, share_max: int) -> None:
        super().__init__(policy, amount, window_s, now)
        self.key = key
        self.share_max = share_max
        # Units granted and not spent; ``older`` of them were counted in a window before
        # ``held_start_ms`` (spent first, never given back: we no longer know where they count).
        self.held = 0
        self.older = 0
        self.held_start_ms = 0
        self.expires = 0.0
        self.chunk = 1
        self.used = 0
        self.answered_at = now
        self.refused_until = 0.0
        # Requests waiting for the next call: (cost, future of "granted?", None if Redis failed).
        self.waiters: list[tuple[int, asyncio.Future[bool | None]]] = []
        self.sending: list[tuple[int, asyncio.Future[bool | None]]] = []
        self.queued = False
        self.inflight = False
        self.prefetch = False

    def spend(self, cost: int) -> None:
        self.held -= cost
        self.used += cost
        if self.older:
            self.older = max(0, self.older - cost)

    @property
    def idle(self) -> bool:
        return not (self.held or self.waiters or self.queued or self.inflight)


GroupKey = tuple[tuple[str, ...], str]
Outcome = tuple[Share, bool]
# A named tuple built without its generated __new__ (a Python call): half the cost.
_decision = tuple.__new__


class Pending(NamedTuple):
    """A check waiting for Redis: each counter's outcome so far, and the answers it waits for."""

    outcomes: list[Outcome]
    waiting: list[tuple[int, Share, asyncio.Future[bool | None]]]


class SharedBudget:
    """The default strategy on Redis (see the module docstring)."""

    def __init__(
        self,
        url: SharedStateUrl,
        health: SharedStateHealth,
        *,
        local_share: float = LOCAL_SHARE,
        lease_s: float = LEASE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.health = health
        self.local_share = local_share
        self.lease_s = lease_s
        self._clock = clock
        self._client: Any = aioredis.Redis.from_url(url.url, **redis_options(url))
        self._script: Any = self._client.register_script(ACQUIRE_SCRIPT)
        self._groups: dict[GroupKey, tuple[Share, ...]] = {}
        self._queue: list[Share] = []
        self._flusher: asyncio.Task[None] | None = None
        self._sweeper: asyncio.Task[None] | None = None
        # Redis calls made (the benchmark and tests read it).
        self.calls = 0
        health.add_listener(self._health_changed)

    # The check ------------------------------------------------------------------------

    def begin(self, rules: Sequence[Rule], cost: int) -> Decision | Pending:
        """Spend ``cost`` on every window of every rule from what this gateway holds.

        The answer is a :class:`Decision` when no counter needed Redis (no await: the hot
        path), else a :class:`Pending` for :meth:`finish`, the counters that need Redis
        queued for the next script call.
        """
        now = self._clock()
        outcomes: list[Outcome] = []
        waiting: list[tuple[int, Share, asyncio.Future[bool | None]]] | None = None
        for rule in rules:
            group = self._groups.get((rule.identifiers, rule.rate.text))
            if group is None:
                group = self._add(rule, now)
            for share in group:
                held = share.held
                if held >= cost and now < share.expires:
                    held -= cost
                    share.held = held
                    share.used += cost
                    if share.older:
                        share.older = max(0, share.older - cost)
                    if held * 2 < share.chunk and not share.prefetch:
                        # Below half a chunk: ask for the next before this one runs out.
                        share.prefetch = True
                        self._ask(share)
                    outcomes.append((share, True))
                elif now < share.refused_until:
                    outcomes.append((share, False))
                else:
                    future: asyncio.Future[bool | None] = asyncio.get_running_loop().create_future()
                    share.waiters.append((cost, future))
                    share.prefetch = share.share_max > 0
                    self._ask(share)
                    if waiting is None:
                        waiting = []
                    waiting.append((len(outcomes), share, future))
                    outcomes.append((share, False))
        if waiting is None:
            return self._decision(outcomes, cost, now)
        return Pending(outcomes, waiting)

    async def finish(self, pending: Pending, cost: int) -> Decision | None:
        """Wait for the script call that answers ``pending``; None when Redis did not answer."""
        outcomes = pending.outcomes
        for index, share, future in pending.waiting:
            granted = await future
            if granted is None:
                return None
            outcomes[index] = (share, granted)
        return self._decision(outcomes, cost, self._clock())

    def _decision(self, outcomes: list[Outcome], cost: int, now: float) -> Decision:
        counted: CountedWindows = []  # a window with room is built only if read
        allowed = True
        retry_after = 0
        for share, granted in outcomes:
            end = share.end
            if now >= end:
                share.roll(now)
                end = share.end
            window_s = share.window_s
            # The mirror's room, plus what this gateway holds (counted there, not yet spent).
            room = share.amount - share.current - share.previous * (end - now) / window_s + share.held
            if granted and room >= cost:
                counted.append((share, room, end - now))
                continue
            remaining = int(room) if room > 0 else 0
            reset = share.reset_s(now, remaining, cost)
            if not granted:
                allowed = False
                retry_after = max(retry_after, reset)
            counted.append(Window(share.policy, share.amount, window_s, remaining, reset))
        return _decision(Decision, (allowed, counted, retry_after, False))

    def _add(self, rule: Rule, now: float) -> tuple[Share, ...]:
        ids = "/".join(quote(part, safe="") for part in rule.identifiers)
        group = tuple(
            Share(
                policy_name(rule, window.window_s),
                window.amount,
                window.window_s,
                now,
                f"{KEY_PREFIX}{ids}:{window.amount}/{window.window_s}",
                math.floor(window.amount * self.local_share),
            )
            for window in rule.rate.windows
        )
        self._groups[(rule.identifiers, rule.rate.text)] = group
        if self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep_loop())
        return group

    # Calls to Redis -------------------------------------------------------------------

    def _ask(self, share: Share) -> None:
        """Put ``share`` in the next script call (one in flight at a time)."""
        if share.queued or share.inflight:
            return  # a call in flight requeues it when it answers
        share.queued = True
        self._queue.append(share)
        if self._flusher is None:
            self._flusher = asyncio.get_running_loop().create_task(self._flush())

    async def _flush(self) -> None:
        try:
            while self._queue:
                batch, self._queue = self._queue[:MAX_BATCH], self._queue[MAX_BATCH:]
                await self._call(batch)
        finally:
            self._flusher = None

    async def _call(self, batch: list[Share]) -> None:
        now = self._clock()
        keys: list[str] = []
        args: list[int] = []
        wants: list[int] = []
        for share in batch:
            share.queued = False
            share.inflight = True
            share.sending, share.waiters = share.waiters, []
            demand = sum(cost for cost, _ in share.sending)
            release = 0
            if share.held and now >= share.expires:
                # Too old to spend: give back what is known to count in its window.
                release = share.held - share.older
                share.held = share.older = 0
            want = demand
            if share.prefetch:
                share.prefetch = False
                want += max(0, min(share.chunk, share.share_max - share.held))
            need = min((cost for cost, _ in share.sending), default=1)
            keys.append(share.key)
            args += (share.window_s * 1000, share.amount, want, need, share.held_start_ms, release)
            wants.append(want)
        self.calls += 1
        try:
            if self.health.should_try():
                answers = await self._script(keys=keys, args=args)
            else:
                answers = None
        except STORAGE_ERRORS as exc:
            self.health.failed(exc)
            answers = None
        except BaseException:
            self._settle_failed(batch)
            raise
        if answers is None:
            self._settle_failed(batch)
            return
        self.health.succeeded()
        now = self._clock()
        for share, want, answer in zip(batch, wants, answers, strict=True):
            self._settle(share, want, [int(x) for x in answer], now)

    def _settle(self, share: Share, want: int, answer: list[int], now: float) -> None:
        granted, start_ms, current, previous, now_ms = answer
        # The mirror: Redis's window, on this process's clock.
        share.start = now - (now_ms - start_ms) / 1000
        share.end = share.start + share.window_s
        share.current = current
        share.previous = previous
        if granted:
            if share.held and share.held_start_ms != start_ms:
                share.older = share.held
            share.held_start_ms = start_ms
            share.held += granted
            share.expires = now + self.lease_s
        refused = granted < want
        for cost, future in share.sending:
            ok = share.held >= cost
            if ok:
                share.spend(cost)
            else:
                refused = True
            if not future.done():
                future.set_result(ok)
        share.sending = []
        if refused:
            share.refused_until = now + min(REFUSED_CACHE_S, share.wait_s(now, 1))
        # Size the next chunk for REFILL_S at the rate spent since the last answer.
        elapsed = now - share.answered_at
        rate = share.used / elapsed if elapsed > 0 else 0.0
        share.chunk = max(1, min(share.share_max, math.ceil(rate * REFILL_S)))
        share.used = 0
        share.answered_at = now
        share.inflight = False
        if share.waiters or (share.prefetch and share.held * 2 < share.chunk):
            # Requests that came while the call was in flight, or a share spent low meanwhile.
            self._ask(share)
        else:
            share.prefetch = False

    def _settle_failed(self, batch: list[Share]) -> None:
        """Redis did not answer: every waiter learns it (None); nothing is held any more."""
        for share in batch:
            for _, future in share.sending:
                if not future.done():
                    future.set_result(None)
            share.sending = []
            share.inflight = False
            share.prefetch = False
            if share.waiters:
                self._ask(share)

    # Housekeeping ---------------------------------------------------------------------

    def _health_changed(self, up: bool) -> None:
        """Redis went away: what it counted may be gone, so nothing held is spent any more."""
        if up:
            return
        for group in self._groups.values():
            for share in group:
                share.held = share.older = 0
                share.refused_until = 0.0

    async def _sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(self.lease_s)
            self.sweep()

    def sweep(self) -> None:
        """Give back units held past their lease; forget counters idle past both windows."""
        now = self._clock()
        keep: dict[GroupKey, tuple[Share, ...]] = {}
        for key, group in self._groups.items():
            for share in group:
                if share.held and now >= share.expires:
                    self._ask(share)
            if any(not share.idle or now - share.start < 2 * share.window_s for share in group):
                keep[key] = group
        self._groups = keep

    async def clear(self, rule: Rule) -> None:
        """Forget a rule's counters, here and in Redis."""
        group = self._groups.pop((rule.identifiers, rule.rate.text), None)
        if group is None:
            now = self._clock()
            group = self._add(rule, now)
            self._groups.pop((rule.identifiers, rule.rate.text), None)
        await self._client.delete(*(share.key for share in group))

    async def close(self) -> None:
        """Give back what is held (best effort), then close the connection."""
        for task in (self._sweeper, self._flusher):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._sweeper = self._flusher = None
        held = [share for group in self._groups.values() for share in group if share.held]
        if held and self.health.up:
            for share in held:
                share.expires = 0.0  # release it all
            with contextlib.suppress(*STORAGE_ERRORS):
                await self._call(held)
        with contextlib.suppress(*STORAGE_ERRORS):
            await self._client.aclose()

    def __len__(self) -> int:
        return len(self._groups)
