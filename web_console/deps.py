"""What the console needs from the gateway, injected (web_console imports no gateway code)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from backend_store.backend import Backend

from .alerts import AlertEngine
from .monitor import QueueSampler
from .principal import PrincipalLike
from .session import Session


@dataclass(frozen=True, slots=True)
class ConsumerView:
    """One push subscription of a queue, as the queue page lists it."""

    transport: str  # "websocket" or "sse"
    unacked: int
    prefetch: int


@dataclass(eq=False)
class ConsoleDeps:
    """``authenticate`` turns a key or JWT into a principal, or None when it proves nothing
    (store errors are raised); ``consumers`` lists a queue's push subscriptions when the push
    engine can tell (None: counts only); ``drain(node_id, drain)`` asks the cluster's
    managers to drain a node or stop draining it (None: not a cluster); ``audit(session,
    action, target, details)`` records an operator action in the audit log."""

    store: Backend
    authenticate: Callable[[str], Awaitable[PrincipalLike | None]]
    sampler: QueueSampler
    alerts: AlertEngine
    secret: bytes
    secure_cookies: bool
    operator_tenant: str
    consumers: Callable[[str, str], Sequence[ConsumerView]] | None = None
    # Whether a session's credential still stands (its API key not revoked, its JWT signing
    # key not removed, the admin scope still held); None: sessions are not checked again.
    recheck: Callable[[Session], Awaitable[bool]] | None = None
    drain: Callable[[str, bool], Awaitable[None]] | None = None
    audit: Callable[[Session, str, str, Mapping[str, Any]], Awaitable[None]] | None = None
