"""Alert state shared by every gateway on one store, through the store's metadata.

Several gateways on one store each sample the same queues and evaluate the same rules, so
each would see every transition. What makes one of them *the* one that records it is a
claim in the store, atomic there:

- **fire**: ``meta_put(only_if_absent=True)`` of ``alerts-active/<tenant>/<rule>/<subject>``:
  exactly one gateway creates the key, and only that one writes the history entry, logs
  the transition and POSTs the webhook; the others adopt the firing state quietly;
- **resolve**: ``meta_delete`` of the same key: exactly one gateway deletes it;
- the **history** (``alerts-history``, the last ``keep`` transitions) is written by the
  claiming gateway and read by all, so ``GET /v1/alerts`` and the console show the same
  history whichever gateway answers, and it survives restarts.

A gateway that starts (or restarts) adopts what is active in the store at its first
sample: an alert still firing is not fired again.
"""

from __future__ import annotations

import secrets
from typing import Any

import orjson

from backend_store.backend import MetadataStore
from backend_store.errors import PushgateError

ACTIVE = "alerts-active"
HISTORY = "alerts-history"


def active_key(tenant: str, rule_id: str, subject: str) -> str:
    # Tenant names and rule ids hold no "/", so the first two "/" split them off the subject.
    return f"{tenant}/{rule_id}/{subject}"


class SharedAlerts:
    """The claims and the history in the store's metadata (see the module docstring)."""

    def __init__(self, backend: MetadataStore, keep: int = 200) -> None:
        self._backend = backend
        self.keep = keep

    async def active(self) -> dict[tuple[str, str], dict[str, Any]]:
        """What is firing, by (rule id, subject): the claimed alert documents."""
        out: dict[tuple[str, str], dict[str, Any]] = {}
        for _, raw in await self._backend.meta_list(ACTIVE):
            doc = orjson.loads(raw)
            out[(doc["rule_id"], doc["subject"])] = doc
        return out

    async def claim_fired(self, alert: dict[str, Any]) -> bool:
        """True for the one gateway whose claim created the alert."""
        key = active_key(alert["tenant"], alert["rule_id"], alert["subject"])
        return await self._backend.meta_put(ACTIVE, key, orjson.dumps(alert), only_if_absent=True)

    async def claim_resolved(self, tenant: str, rule_id: str, subject: str) -> bool:
        """True for the one gateway whose delete ended the alert."""
        return await self._backend.meta_delete(ACTIVE, active_key(tenant, rule_id, subject))

    async def append(self, event: dict[str, Any]) -> None:
        """Add a transition to the history and drop the oldest past ``keep``."""
        # Sortable by time: zero-padded seconds, then a random tail for ties.
        key = f"{event['at']:020.6f}-{secrets.token_hex(4)}"
        await self._backend.meta_put(HISTORY, key, orjson.dumps(event))
        entries = await self._backend.meta_list(HISTORY)
        for old, _ in entries[: max(0, len(entries) - self.keep)]:
            try:
                await self._backend.meta_delete(HISTORY, old)
            except PushgateError:
                break  # trimmed at the next transition

    async def history(self) -> list[dict[str, Any]]:
        """The kept transitions, oldest first."""
        return [orjson.loads(raw) for _, raw in await self._backend.meta_list(HISTORY)]
