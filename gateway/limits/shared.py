"""What gateways tell each other through the broadcaster: wake-ups and stale caches.

Channels (payloads are small JSON objects carrying the sender's ``origin`` id, so a
gateway skips its own):

- ``wakeups``: ``{"o": origin, "q": [[tenant, queue], ...]}``, published by the gateway
  whose commit made messages visible (its backend listener), at most once per event-loop
  turn; a receiving gateway wakes that queue's dispatchers and long-polls (``WakeupHub``).
- ``invalidate``: ``{"o": origin, "kind": "auth" | "limits", "tenant": t}`` after a key,
  JWT key, tenant or limits change (from a gateway, or ``pushgate admin`` with
  ``--redis``); a receiving gateway forgets its cached records at once.

After Redis comes back (a gap in which messages may have been lost), every gateway wakes
every queue it watches and forgets every cached record.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable
from typing import Any

import orjson
import redis.asyncio as aioredis

from backend_store.types import QueueName, TenantId
from push.wakeup import WakeupHub
from throttling import Broadcaster, parse_shared_state_url
from throttling.broadcast import CHANNEL_PREFIX

from .store import LimitsStore

log = logging.getLogger("pushgate.gateway")

WAKEUPS = "wakeups"
INVALIDATE = "invalidate"
ADMIN_ORIGIN = "admin"


class SharedSignals:
    """Bridges this gateway's hub and caches to the broadcaster (one per gateway process)."""

    def __init__(
        self,
        broadcaster: Broadcaster,
        hub: WakeupHub,
        limits: LimitsStore,
        forget_auth: Callable[[], None],
    ) -> None:
        self.origin = uuid.uuid4().hex
        self._broadcaster = broadcaster
        self._hub = hub
        self._limits = limits
        self._forget_auth = forget_auth
        self._pending: dict[tuple[TenantId, QueueName], None] = {}
        self._flush_scheduled = False
        broadcaster.subscribe(WAKEUPS, self._remote_wakeups)
        broadcaster.subscribe(INVALIDATE, self._remote_invalidate)
        broadcaster.on_resync(self._resync)

    # Outgoing ----------------------------------------------------------------

    def local_change(self, tenant: TenantId, queue: QueueName) -> None:
        """Backend listener: a commit here made messages of a queue visible."""
        self._pending[(tenant, queue)] = None
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        queues, self._pending = list(self._pending), {}
        if queues:
            self._broadcaster.publish(WAKEUPS, orjson.dumps({"o": self.origin, "q": queues}))

    def auth_changed(self) -> None:
        """A tenant, API key or JWT key changed through this gateway."""
        self._broadcaster.publish(INVALIDATE, invalidation(self.origin, "auth"))

    def limits_changed(self, tenant: TenantId) -> None:
        """A tenant's limits changed through this gateway."""
        self._broadcaster.publish(INVALIDATE, invalidation(self.origin, "limits", tenant))

    # Incoming ----------------------------------------------------------------

    def _remote_wakeups(self, payload: bytes) -> None:
        doc = orjson.loads(payload)
        if doc.get("o") == self.origin:
            return
        for tenant, queue in doc.get("q", ()):
            self._hub.notify(TenantId(tenant), QueueName(queue))

    def _remote_invalidate(self, payload: bytes) -> None:
        doc = orjson.loads(payload)
        if doc.get("o") == self.origin:
            return
        if doc.get("kind") == "limits":
            tenant = doc.get("tenant")
            self._limits.forget(tenant if isinstance(tenant, str) else None)
        else:
            self._forget_auth()

    def _resync(self) -> None:
        log.info("shared state resynced: waking every watched queue and forgetting cached records")
        self._hub.notify_all()
        self._limits.forget()
        self._forget_auth()


def invalidation(origin: str, kind: str, tenant: str | None = None) -> bytes:
    doc: dict[str, Any] = {"o": origin, "kind": kind}
    if tenant is not None:
        doc["tenant"] = tenant
    return orjson.dumps(doc)


async def announce(redis_url: str, kind: str, tenant: str | None = None) -> bool:
    """Tell running gateways a record changed (``pushgate admin``); False if Redis did not answer."""
    url = parse_shared_state_url(redis_url)
    if url.is_memory:
        return False
    client: Any = aioredis.Redis.from_url(
        url.url, socket_timeout=url.timeout_s, socket_connect_timeout=url.timeout_s
    )
    try:
        await client.publish(CHANNEL_PREFIX + INVALIDATE, invalidation(ADMIN_ORIGIN, kind, tenant))
    except (OSError, TimeoutError, aioredis.RedisError) as exc:
        log.warning("could not tell running gateways through %s: %s", url.display, exc)
        return False
    finally:
        await client.aclose()
    return True
