"""Turns a request into rate-limit rules and a refusal into its error; checks quotas.

Rules of a request, each its own counter (all must allow it):

- the tenant's rate for the operation (``"tenant-send"``), shared by all its credentials;
- ``per_key``: the credential's own counter (``"key-send"``), keyed by API key id or JWT ``sub``;
- ``per_queue``: the queue's own counter (``"queue-send"``), for send and receive.

A refusal is ``RateLimitedWithFields`` (429 ``rate_limited``) with ``Retry-After`` and the IETF fields; an
allowed request's :class:`~throttling.Decision` gives the same fields for its response.
Quotas (``max_queues``, ``max_stored_messages``) are ``QuotaExceeded`` (409).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from backend_store.backend import QueueStore
from backend_store.errors import QuotaExceeded, Unavailable
from backend_store.types import QueueName, TenantId
from push.principal import Operation
from push.send_path import Allowance
from throttling import ALLOWED, Decision, Limiter, Rule, SharedStateUnavailable

from ..errors import RateLimitedWithFields
from .document import TenantLimits
from .headers import Fields, rate_limit_fields
from .store import LimitsStore

# How old the stored-message count behind max_stored_messages may be. Counting means
# reading every queue's stats, so it is done at most this often per tenant; sends in
# between are added locally. The quota can therefore overshoot by what other gateways
# store within this time.
STORED_COUNT_TTL_S = 1.0
# Requests' rules kept (by tenant, credential, operation and queue); all dropped when full.
MAX_CACHED_RULES = 100_000


class Enforcer:
    """Rate limits and quotas of one gateway process."""

    def __init__(
        self,
        limits: LimitsStore,
        limiter: Limiter,
        backend: QueueStore,
        *,
        on_refused: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limits = limits
        self.limiter = limiter
        self.backend = backend
        self._on_refused = on_refused
        self._clock = clock
        self._stored: dict[TenantId, tuple[float, int]] = {}
        # Each request's rules, kept with the limits document they came from (a changed or
        # re-read document is another object: the rules are built again). Saves building
        # them on every request, and the limiter remembers a tuple's counters by its
        # identity (throttling/local_counters.py; docs/throttling.md, "Figures").
        self._rules: dict[tuple[str, str, str, str | None], tuple[TenantLimits, tuple[Rule, ...]]] = {}

    # Rates -----------------------------------------------------------------

    async def decide(
        self, tenant: TenantId, subject: str, op: Operation, queue: QueueName | None = None
    ) -> Decision:
        """Count a request; the decision says whether it may go on (never raises a refusal).

        Raises :class:`Unavailable` when Redis is down and the limiter fails closed.
        """
        limits = self.limits.cached(tenant) or await self.limits.get(tenant)
        key = (tenant, subject, op, queue)
        entry = self._rules.get(key)
        if entry is None or entry[0] is not limits:
            if len(self._rules) >= MAX_CACHED_RULES:
                self._rules.clear()
            entry = self._rules[key] = (limits, rules_for(limits, tenant, subject, op, queue))
        rules = entry[1]
        if not rules:
            return ALLOWED
        try:
            decision = await self.limiter.check(rules)
        except SharedStateUnavailable as exc:
            raise Unavailable(exc.detail) from None
        if not decision.allowed and self._on_refused is not None:
            self._on_refused(op)
        return decision

    async def check(
        self, tenant: TenantId, subject: str, op: Operation, queue: QueueName | None = None
    ) -> Fields:
        """Count a request; raise a 429 (with the IETF fields) if refused, else return its
        fields (for :func:`.headers.with_fields`)."""
        decision = await self.decide(tenant, subject, op, queue)
        if not decision.allowed:
            raise self._refusal(op, decision)
        return rate_limit_fields(decision)

    async def admit(
        self, tenant: TenantId, subject: str, op: Operation, queue: QueueName | None = None
    ) -> None:
        """:meth:`check` for a request that shows no fields when allowed (a WebSocket frame,
        an SSE stream's start): the decision's windows are read only for a refusal."""
        decision = await self.decide(tenant, subject, op, queue)
        if not decision.allowed:
            raise self._refusal(op, decision)

    @staticmethod
    def _refusal(op: Operation, decision: Decision) -> RateLimitedWithFields:
        return RateLimitedWithFields(
            f"rate limit for {op} exceeded; retry after {decision.retry_after_s} s",
            decision.retry_after_s,
            rate_limit_fields(decision),
        )

    # Quotas ----------------------------------------------------------------

    async def check_new_queue(self, tenant: TenantId, name: QueueName) -> None:
        """Before creating a queue: :class:`QuotaExceeded` at ``max_queues`` (an existing name passes)."""
        limit = (await self.limits.get(tenant)).max_queues
        if limit is None:
            return
        names = {info.name for info in await self.backend.list_queues(tenant)}
        if name not in names and len(names) >= limit:
            raise QuotaExceeded(f"the tenant has {len(names)} queues, its quota (max_queues is {limit})")

    async def allowance(self, tenant: TenantId) -> Allowance | None:
        """What the tenant may still store under ``max_stored_messages`` (None: no such
        quota): the send path (push/send_path.py) asks once per store call and refuses
        each request that would pass it."""
        limit = (await self.limits.get(tenant)).max_stored_messages
        if limit is None:
            return None
        return Allowance(await self._stored_count(tenant), limit)

    def stored(self, tenant: TenantId, added: int) -> None:
        """``added`` messages were stored: keep the cached count current until its next read."""
        entry = self._stored.get(tenant)
        if entry is not None:
            self._stored[tenant] = (entry[0], entry[1] + added)

    async def _stored_count(self, tenant: TenantId) -> int:
        entry = self._stored.get(tenant)
        now = self._clock()
        if entry is not None and now - entry[0] < STORED_COUNT_TTL_S:
            return entry[1]
        infos = await self.backend.list_queues(tenant)
        count = sum(i.stats.visible + i.stats.in_flight + i.stats.delayed for i in infos)
        self._stored[tenant] = (now, count)
        return count


def rules_for(
    limits: TenantLimits, tenant: TenantId, subject: str, op: Operation, queue: QueueName | None
) -> tuple[Rule, ...]:
    """The counters a request passes through (see the module docstring)."""
    rules: list[Rule] = []
    rate = limits.tenant.get(op)
    if rate is not None:
        rules.append(Rule(f"tenant-{op}", rate, ("t", tenant, op)))
    rate = limits.per_key.get(op)
    if rate is not None:
        rules.append(Rule(f"key-{op}", rate, ("k", tenant, subject, op)))
    rate = limits.per_queue.get(op) if queue is not None else None
    if rate is not None and queue is not None:
        rules.append(Rule(f"queue-{op}", rate, ("q", tenant, queue, op)))
    return tuple(rules)
