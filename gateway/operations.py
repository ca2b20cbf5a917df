"""Operations wiring: the monitor, alerts, metrics sources, the metrics listener and their routes.

:func:`build_operations` is called once by the app factory, after the push engine is
in place (its consumer counts and stats feed the monitor and the metrics). It gets the
store as opened, not a wrapper around it, so optional capabilities (peek and redrive,
storage use, commit figures) are seen for what they are.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Mount

from backend_store.backend import Backend, ClusterStatus, StorageStats
from backend_store.errors import Forbidden, InvalidRequest, Unauthorized
from backend_store.types import QueueName, TenantId
from web_console.alerts import AlertEngine, RuleStore, SharedAlerts, WebhookNotifier
from web_console.app import build_console
from web_console.deps import ConsoleDeps, ConsumerView
from web_console.monitor import DepthHistory, MonitorSources, QueueSampler
from web_console.session import Session

from .auth.bootstrap import write_secret_file
from .auth.principal import Credential, Principal
from .cluster_operator import cluster_operator_for
from .metrics import CONTENT_TYPE_LATEST
from .metrics_listener import MetricsListener
from .routes.access import authenticate, require
from .routes.endpoint import route
from .routes.operator import OperatorRoutes
from .services import GatewayServices
from .usage.audit import AuditAction, audit_request

# A scrape reads queue stats no older than this (several Prometheus servers scraping at
# once share one read of the store).
SCRAPE_MAX_AGE_S = 1.0
CONSOLE_SECRET_FILE = "console-secret"


def console_secret(data_dir: Path) -> bytes:
    """The key console session cookies are signed with: one per data directory, kept in a
    0600 file, so sessions survive a restart and every gateway on the directory agrees."""
    path = data_dir / CONSOLE_SECRET_FILE
    try:
        secret = path.read_text().strip()
    except FileNotFoundError:
        secret = secrets.token_urlsafe(48)
        try:
            # Exclusive: of gateways starting together on one directory, one secret wins.
            write_secret_file(path, secret + "\n", exclusive=True)
        except FileExistsError:
            secret = path.read_text().strip()
    if len(secret) < 32:  # damaged: a new secret (every session ends)
        secret = secrets.token_urlsafe(48)
        write_secret_file(path, secret + "\n")
    return secret.encode()


@dataclass(eq=False)
class Operations:
    sampler: QueueSampler
    alerts: AlertEngine
    notifier: WebhookNotifier | None
    listener: MetricsListener | None

    async def render_metrics(self, services: GatewayServices, tenant: str | None = None) -> tuple[bytes, str]:
        """A scrape; ``tenant`` limits the tenant-labelled series to that tenant's."""
        await self.sampler.fresh(SCRAPE_MAX_AGE_S)
        return services.metrics.render(tenant), CONTENT_TYPE_LATEST


def build_operations(
    services: GatewayServices,
    store: Backend,
    push_stats: Callable[[], Mapping[str, Any]] | None = None,
    push_subscriptions: Callable[[TenantId, QueueName], Sequence[tuple[str, int, int]]] | None = None,
) -> tuple[Operations, list[BaseRoute]]:
    """Build the operator parts, register them as components, and return their routes."""
    settings = services.settings

    async def tenants() -> list[str]:
        return [t.name for t in await services.authenticator.tenants.list_all()]

    history = DepthHistory()
    # On cluster://, drains and their progress for the console (gateway/cluster_operator.py).
    cluster = cluster_operator_for(store)
    cluster_source = (
        cluster.status
        if cluster is not None
        else store.cluster_status
        if isinstance(store, ClusterStatus)
        else None
    )
    messages = services.metrics.messages
    sampler = QueueSampler(
        MonitorSources(
            backend=store,
            tenants=tenants,
            # Read at call time: the push engine sets services.consumers when it is built.
            consumers=lambda tenant, queue: services.consumers(tenant, queue),
            delivered=lambda tenant, queue: messages.count(tenant, queue, "delivered"),
            # A distributed store reports its nodes (the nodes page, node alerts, cluster metrics).
            cluster=cluster_source,
        ),
        interval_s=settings.monitor_interval_s,
        min_gap_s=min(0.5, settings.monitor_interval_s),
        history=history,
    )
    notifier = WebhookNotifier(settings.alert_webhook_url) if settings.alert_webhook_url else None
    # Firing alerts and their history are shared through the store's metadata: with several
    # gateways on one store, each transition is recorded (and POSTed) by one of them.
    # A fresh store gives the operator tenant the default rules (web_console/alerts/defaults.py).
    alerts = AlertEngine(
        RuleStore(store),
        history,
        notifier=notifier,
        shared=SharedAlerts(store),
        rates=sampler.rates,
        defaults_for=settings.operator_tenant,
    )
    sampler.listeners.append(alerts.on_sample)
    ops = Operations(sampler, alerts, notifier, None)

    sources = services.metrics.sources
    sources.snapshot = lambda: sampler.latest
    sources.alerts = alerts
    sources.push_stats = push_stats
    if isinstance(store, StorageStats):
        sources.commit_stats = store.commit_stats

    if settings.metrics_listen:
        ops.listener = MetricsListener(settings.metrics_listen, lambda: ops.render_metrics(services))
        services.components.append(ops.listener)
    if notifier is not None:
        services.components.append(notifier)
    if cluster is not None:
        # Started before the sampler (its first sample shows drain requests); a map change
        # (a leader or replica moved) brings the next sample forward for live pages.
        cluster.on_change(sampler.poke)
        services.components.append(cluster)
    services.components.append(sampler)

    async def metrics(request: Request) -> Response:
        principal = await authenticate(services, request)
        require(principal, "metrics")
        # The operator tenant's keys see every tenant; another tenant's keys see its own series.
        own = None if principal.tenant == settings.operator_tenant else principal.tenant
        body, content_type = await ops.render_metrics(services, own)
        return Response(body, media_type=content_type)

    async def console_login(token: str) -> Principal | None:
        try:
            return await services.authenticator.authenticate(token)
        except (Unauthorized, Forbidden, InvalidRequest):  # the token proves nothing
            return None

    def session_principal(session: Session) -> Principal:
        via: Credential | None = (
            "api_key" if session.via == "api_key" else "jwt" if session.via == "jwt" else None
        )
        return Principal(
            TenantId(session.tenant),
            frozenset({"admin"}),
            session.subject,
            via=via,
            kid=session.kid,
            key_id=session.key_id,
        )

    async def console_recheck(session: Session) -> bool:
        principal = session_principal(session)
        verdict = (await services.authenticator.recheck([principal]))[principal]
        return isinstance(verdict, Principal) and "admin" in verdict.scopes

    async def console_audit(session: Session, action: str, target: str, details: Mapping[str, Any]) -> None:
        principal = session_principal(session)
        await audit_request(
            services.usage.audit, principal, AuditAction(action), target, details, source="console"
        )

    console = build_console(
        ConsoleDeps(
            store=store,
            authenticate=console_login,
            sampler=sampler,
            alerts=alerts,
            secret=console_secret(settings.data_dir),
            secure_cookies=settings.tls,
            operator_tenant=settings.operator_tenant,
            recheck=console_recheck,
            drain=None if cluster is None else cluster.set_drain,
            audit=console_audit,
            consumers=None
            if push_subscriptions is None
            else lambda tenant, queue: [
                ConsumerView(*sub) for sub in push_subscriptions(TenantId(tenant), QueueName(queue))
            ],
        )
    )

    routes = [
        *OperatorRoutes(services, store, alerts).routes(),
        route("/metrics", metrics, "GET", services.metrics),
        # "/console" (no slash) is redirected to "/console/" by the router (redirect_slashes).
        Mount("/console", app=console),
    ]
    return ops, routes
