"""Alert rules kept in the store's metadata, so every gateway and ``pushgate admin`` share them."""

from __future__ import annotations

import orjson

from backend_store.backend import MetadataStore
from backend_store.errors import NotFound

from .rules import AlertRule

NAMESPACE = "alerts"
# One key per tenant that was given the default rules (alerts/defaults.py), for good.
DEFAULTS_NAMESPACE = "alerts-defaults"


class RuleStore:
    def __init__(self, backend: MetadataStore) -> None:
        self._backend = backend

    async def put(self, rule: AlertRule) -> None:
        await self._backend.meta_put(NAMESPACE, _key(rule.tenant, rule.id), orjson.dumps(rule.to_dict()))

    async def delete(self, tenant: str, rule_id: str) -> None:
        if not await self._backend.meta_delete(NAMESPACE, _key(tenant, rule_id)):
            raise NotFound(f"alert rule {rule_id!r} not found")

    async def list(self, tenant: str | None = None) -> list[AlertRule]:
        prefix = "" if tenant is None else tenant + "/"
        rules = [
            AlertRule.from_dict(orjson.loads(raw))
            for _, raw in await self._backend.meta_list(NAMESPACE, prefix)
        ]
        return sorted(rules, key=lambda r: (r.tenant, r.created_at, r.id))

    async def defaults_given(self, tenant: str) -> bool:
        return await self._backend.meta_get(DEFAULTS_NAMESPACE, tenant) is not None

    async def mark_defaults_given(self, tenant: str, how: str) -> None:
        await self._backend.meta_put(DEFAULTS_NAMESPACE, tenant, how.encode())


def _key(tenant: str, rule_id: str) -> str:
    # Tenant names are [A-Za-z0-9_-], so "/" cannot be part of one.
    return f"{tenant}/{rule_id}"
