"""Where limits live: the backend's metadata (namespace ``limits``, one document per tenant).

Durable in the store, as tenants and keys are, so ``pushgate admin limits set`` on the
data directory and ``PUT /v1/limits`` on any gateway change the same record. Each
process caches documents for ``cache_ttl_s``; a change made here forgets the entry at
once and calls ``on_change(tenant)`` (the gateway tells other gateways through the
broadcaster, so they forget it too).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from backend_store.backend import MetadataStore
from backend_store.types import TenantId

from ..auth.ttl_cache import TtlCache
from .document import NO_LIMITS, TenantLimits

NAMESPACE = "limits"


class LimitsStore:
    def __init__(
        self,
        backend: MetadataStore,
        *,
        cache_ttl_s: float = 5.0,
        on_change: Callable[[TenantId], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._backend = backend
        self._cache: TtlCache[str, TenantLimits] = TtlCache(cache_ttl_s, 100_000, clock)
        self.on_change = on_change

    def cached(self, tenant: TenantId) -> TenantLimits | None:
        """A tenant's limits if this process holds them fresh (no await: the hot path)."""
        hit, limits = self._cache.get(tenant)
        return limits if hit else None

    async def get(self, tenant: TenantId) -> TenantLimits:
        """A tenant's limits (cached); no document means no limits."""
        limits, _ = await self._cache.load(tenant, lambda: self._read(tenant))
        return limits

    async def _read(self, tenant: TenantId) -> TenantLimits:
        raw = await self._backend.meta_get(NAMESPACE, tenant)
        return NO_LIMITS if raw is None else TenantLimits.from_bytes(raw)

    async def update(self, tenant: TenantId, changes: Any) -> TenantLimits:
        """Merge ``changes`` into the stored document (see :meth:`TenantLimits.merged`)."""
        raw = await self._backend.meta_get(NAMESPACE, tenant)
        current = NO_LIMITS if raw is None else TenantLimits.from_bytes(raw)
        merged = current.merged(changes)
        if merged.empty:
            await self._backend.meta_delete(NAMESPACE, tenant)
        else:
            await self._backend.meta_put(NAMESPACE, tenant, merged.to_bytes())
        self.forget(tenant)
        if self.on_change is not None:
            self.on_change(tenant)
        return merged

    def forget(self, tenant: str | None = None) -> None:
        """Drop a cached document (None: all of them), e.g. when another gateway changed it."""
        if tenant is None:
            self._cache.clear()
        else:
            self._cache.pop(tenant)
