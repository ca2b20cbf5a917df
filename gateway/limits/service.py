"""The throttling component of a gateway: shared state, limits, enforcer, signals, metrics.

Built by :meth:`gateway.services.GatewayServices.build` from :class:`~gateway.settings.Settings`
(``redis_url``, ``redis_fail``, ``rate_limit_strategy``, ``limits_cache_ttl_s``) and started
with the app, after the backend.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TYPE_CHECKING

from prometheus_client import Counter, Gauge

from backend_store.backend import Backend, EarlyChanges
from backend_store.types import QueueName
from push.principal import Operation, PrincipalLike
from push.wakeup import WakeupHub
from throttling import SharedState

from ..auth.principal import Principal
from ..metrics_catalog import help_of
from ..queue_cache import QueueCache
from .dedupe_front import DedupeFront
from .enforcer import Enforcer
from .shared import SharedSignals
from .store import LimitsStore

if TYPE_CHECKING:
    from ..auth.authenticator import Authenticator
    from ..metrics import GatewayMetrics
    from ..settings import Settings


class Throttling:
    def __init__(
        self,
        settings: Settings,
        backend: Backend,
        hub: WakeupHub,
        authenticator: Authenticator,
        metrics: GatewayMetrics,
        queues: QueueCache,
    ) -> None:
        self.state = SharedState(
            settings.redis_url,
            fail_closed=settings.redis_fail == "closed",
            strategy=settings.strategy,
        )
        self._backend = backend
        self.limits = LimitsStore(backend, cache_ttl_s=settings.limits_cache_ttl_s)
        # Metrics of this part, on the app's registry (no edit of gateway/metrics.py needed).
        self.refused = Counter(
            "pushgate_rate_limited",
            help_of("pushgate_rate_limited"),
            ("op",),
            registry=metrics.registry,
        )
        self.redis_up = Gauge(
            "pushgate_shared_state_up",
            help_of("pushgate_shared_state_up"),
            registry=metrics.registry,
        )
        self.state.health.add_listener(lambda up: self.redis_up.set(1 if up else 0))
        self.enforcer = Enforcer(
            self.limits, self.state.limiter, backend, on_refused=lambda op: self.refused.labels(op).inc()
        )
        self.dedupe_hits = Counter(
            "pushgate_dedupe_front_hits",
            help_of("pushgate_dedupe_front_hits"),
            registry=metrics.registry,
        )
        self.dedupe = DedupeFront(self.state.cache, queues, backend, self.dedupe_hits.inc)
        # Only a shared store has other gateways to talk to.
        self.signals: SharedSignals | None = None
        if self.state.shared:
            self.signals = SharedSignals(self.state.broadcaster, hub, self.limits, authenticator.invalidate)
            self.limits.on_change = self.signals.limits_changed
            authenticator.on_change = self.signals.auth_changed

    def rate_check(
        self, principal: PrincipalLike, op: Operation, queue: str | None
    ) -> Awaitable[object] | None:
        """push's :data:`~push.principal.RateCheck`: None when no rule counts the request,
        else the enforcer's check (which returns, or raises a 429 error; an allowed frame or
        stream shows no header fields, so none are built)."""
        limits = self.limits.cached(principal.tenant)
        if (
            limits is not None
            and limits.tenant.get(op) is None
            and limits.per_key.get(op) is None
            and (queue is None or limits.per_queue.get(op) is None)
        ):
            # No rule counts this request (rules_for would find none): no coroutine, no
            # await, nothing built (it runs once per WebSocket send frame).
            return None
        # Every principal push holds came from this gateway's authenticator.
        subject = principal.subject if isinstance(principal, Principal) else ""
        name = None if queue is None else QueueName(queue)
        return self.enforcer.admit(principal.tenant, subject, op, name)

    @property
    def fail_closed_and_down(self) -> bool:
        return self.state.limiter.fail_closed and not self.state.health.up

    def ready_detail(self) -> dict[str, object]:
        """For ``/readyz``."""
        return self.state.detail()

    async def start(self) -> None:
        await self.state.start()
        if self.signals is not None:
            # Other gateways on this data directory: told as the commit begins (their
            # receive waits for it), else once it is done.
            if isinstance(self._backend, EarlyChanges):
                self._backend.add_early_listener(self.signals.local_change)
            else:
                self._backend.add_listener(self.signals.local_change)

    async def drain(self) -> None:
        return None

    async def close(self) -> None:
        await self.state.close()
