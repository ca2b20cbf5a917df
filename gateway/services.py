"""The objects a gateway's routes share, built once per app and passed explicitly.

:class:`GatewayServices` owns the backend, the authenticator, the wake-up hub, the
queue cache and the metrics. Other parts plug in here rather than into globals:

- the push engine (:attr:`GatewayServices.engine`) is the one path to delivery state:
  WebSocket and SSE deliveries, HTTP acks, nacks, visibility changes and long-polls all go
  through it; it is started after the backend and closed before it;
- :attr:`GatewayServices.sends` is the one send path, the engine's: every transport's
  sends reach the store through it, with the quota and the dedupe front applied there;
- :attr:`GatewayServices.observer` is the one observe point every request and delivery
  outcome is reported to (``push/observer.py``), and the store's dead-letter moves and
  expiries too; its sinks are the Prometheus message counts and, when usage is on, the
  usage aggregator;
- :attr:`GatewayServices.usage` is usage recording and the audit log; its flusher is the
  first component, so it is closed last and its final flush sees everything;
- :attr:`GatewayServices.draining` is set when the server starts shutting down, so
  long-polls (and push streams) end at once instead of holding shutdown up.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from backend_store.backend import Backend, MessageEvent, MessageEvents, MetadataWatch
from backend_store.errors import PushgateError
from backend_store.private_files import private_dir, warning_lines
from backend_store.types import QueueName, TenantId
from backend_store.url import open_backend
from push.engine import PushEngine
from push.observer import OK, STORE, Observer, Observers
from push.principal import PrincipalLike
from push.send_path import SendPath
from push.wakeup import WakeupHub

from .auth import api_keys, jwt_keys, tenants
from .auth.authenticator import Authenticator
from .auth.bootstrap import ensure_bootstrap
from .auth.principal import Principal
from .limits import store as limits_store
from .limits.service import Throttling
from .metrics import GatewayMetrics
from .origins import OriginRule
from .queue_cache import QueueCache
from .settings import Settings
from .usage.recording import UsageRecording

log = logging.getLogger("pushgate.gateway")


class Component(Protocol):
    """Something with a life as long as the app's (the push engine, a usage flusher).

    ``drain`` runs when shutdown begins, before the server closes connections (the push
    engine closes WebSockets with 1001 and ends SSE streams there); ``close`` runs last.
    """

    async def start(self) -> None: ...

    async def drain(self) -> None: ...

    async def close(self) -> None: ...


@dataclass(eq=False)
class GatewayServices:
    settings: Settings
    backend: Backend
    authenticator: Authenticator
    hub: WakeupHub
    queues: QueueCache
    metrics: GatewayMetrics
    engine: PushEngine
    # Rate limits, quotas and shared state between gateways (docs/throttling.md).
    throttling: Throttling
    usage: UsageRecording
    # The observe point: outcomes go to every sink (metrics; usage when it is on).
    observer: Observers
    components: list[Component] = field(default_factory=list)
    draining: asyncio.Event = field(default_factory=asyncio.Event)
    # The bootstrap admin key, when start() created one (an empty data directory).
    bootstrap_key: str | None = None
    # Which browser origins may act for a tenant (CORS and WebSocket; docs/browser.md).
    origin_rule: OriginRule = field(init=False)

    def __post_init__(self) -> None:
        self.origin_rule = OriginRule(self.authenticator)

    @classmethod
    def build(cls, settings: Settings, backend: Backend | None = None) -> GatewayServices:
        """Wire the services for ``settings``; nothing is opened until :meth:`start`."""
        if backend is None:
            private_dir(settings.data_dir)
            backend = open_backend(settings.resolved_store_url, settings.store_options())
        authenticator = Authenticator(backend, audience=settings.jwt_audience, keyring=settings.keyring())
        hub = WakeupHub()

        async def recheck(
            principals: Collection[PrincipalLike],
        ) -> dict[PrincipalLike, PrincipalLike | PushgateError]:
            # Every principal push holds came from this authenticator.
            verdicts: dict[PrincipalLike, PrincipalLike | PushgateError] = {}
            for principal, verdict in (
                await authenticator.recheck([p for p in principals if isinstance(p, Principal)])
            ).items():
                verdicts[principal] = verdict
            return verdicts

        usage = UsageRecording.build(
            settings.data_dir, settings.usage_flush_interval_s, settings.gateway_name, settings.usage_dir
        )
        metrics = GatewayMetrics(settings.metrics_queue_series)
        sinks: list[Observer] = [metrics.messages]
        if usage.aggregator is not None:
            sinks.append(usage.aggregator)
        observer = Observers(sinks)
        queues = QueueCache(backend, settings.queue_cache_ttl_s)
        throttling = Throttling(settings, backend, hub, authenticator, metrics, queues)
        # The one send path of every transport: the quota, then the dedupe front and the store.
        sends = SendPath(throttling.dedupe.send, queues.get, observer, quota=throttling.enforcer)
        engine = PushEngine(
            backend,
            hub,
            settings.push,
            recheck=recheck,
            observer=observer,
            sends=sends,
            queue_info=queues.get,
        )
        metrics.waiting_receives.set_function(lambda: len(engine.polls.parked))
        return cls(
            settings=settings,
            backend=backend,
            authenticator=authenticator,
            hub=hub,
            queues=queues,
            metrics=metrics,
            engine=engine,
            throttling=throttling,
            usage=usage,
            observer=observer,
            # The usage flusher first (closed last: its final flush sees everything), then
            # shared state (started before the engine, closed after it).
            components=[throttling, engine] if usage.flusher is None else [usage.flusher, throttling, engine],
        )

    @property
    def sends(self) -> SendPath:
        """The one send path (push/send_path.py): HTTP and WebSocket sends, and the SQS
        API's, reach the store through it (quota, dedupe front, batching, usage)."""
        return self.engine.sends

    def consumers(self, tenant: TenantId, queue: QueueName) -> int:
        """Push consumers (WS/SSE subscriptions) of a queue: ``stats.consumers``."""
        return self.engine.consumers(tenant, queue)

    async def start(self) -> None:
        await self.backend.start()
        self.backend.add_listener(self.hub.notify)
        if isinstance(self.backend, MetadataWatch):
            # Cluster mode: other gateways change keys and queues in etcd; forget our
            # cached copies the moment the watch says so (a revoked key is refused at once).
            self.backend.add_meta_listener(self._metadata_changed)
            self.backend.add_queue_listener(self._queue_changed)
        if isinstance(self.backend, MessageEvents):
            self.backend.add_event_listener(self._store_events)
        await self._warn_of_open_secrets()
        self.bootstrap_key = await ensure_bootstrap(self.backend, self.settings.data_dir)
        if self.bootstrap_key is not None and self.settings.announce_bootstrap:
            # Shown once, on stdout, so an operator can copy it; it is also in a 0600 file.
            print(f"Bootstrap admin key (shown once): {self.bootstrap_key}", file=sys.stdout, flush=True)
        for component in self.components:
            await component.start()

    async def _warn_of_open_secrets(self) -> None:
        """Warn at start of data other local users may read (docs/store.md, "File permissions")."""
        settings = self.settings
        roots = [settings.data_dir] + ([settings.usage_dir] if settings.usage_dir is not None else [])
        for root in roots:
            for line in warning_lines(root):
                log.warning("%s", line)
        keyring = settings.encryption_key_file is not None or bool(settings.encryption_keys)
        if not keyring and await self.authenticator.aws_keys.any_stored():
            log.warning(
                "AWS credentials for the SQS API are stored in clear: SigV4 needs their secrets, and "
                "without an encryption keyring (--encryption-key-file or PUSHGATE_ENCRYPTION_KEYS) they "
                'are kept unsealed in the store (docs/sqs.md, "Credentials")'
            )

    def _metadata_changed(self, namespace: str, key: str) -> None:
        if namespace in (api_keys.NAMESPACE, jwt_keys.NAMESPACE, tenants.NAMESPACE):
            self.authenticator.invalidate()
        elif namespace == limits_store.NAMESPACE:
            self.throttling.limits.forget(key)

    def _queue_changed(self, tenant: TenantId, queue: QueueName) -> None:
        self.queues.invalidate(tenant, queue)
        # New attributes (a shorter delay, a higher limit) may make messages receivable.
        self.hub.notify(tenant, queue)

    def _store_events(self, events: Sequence[MessageEvent]) -> None:
        """Dead-letter moves and expiries this process committed, to the observe point."""
        for e in events:
            self.observer.observe(e.tenant, e.queue, e.kind, STORE, OK, e.count)

    async def drain(self) -> None:
        """Shutdown has begun: end long-polls and push streams now (idempotent)."""
        self.draining.set()
        for component in reversed(self.components):
            try:
                await component.drain()
            except Exception:
                log.exception("error draining %r", component)

    async def close(self) -> None:
        self.draining.set()
        try:
            for component in reversed(self.components):
                try:
                    await component.close()
                except Exception:
                    log.exception("error closing %r", component)
        finally:
            await self.backend.close()
