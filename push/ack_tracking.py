"""A Backend that tells the push engine about acks and nacks made outside push/.

SSE consumers ack over HTTP (``POST /v1/queues/{q}/ack``), which calls the backend
directly. Their stream's credit comes back only if the engine hears of those receipts,
so the gateway's routes use this thin wrapper: it settles the receipts in the engine
(cheap: a dict lookup each) and passes every call through unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from backend_store.backend import Backend, ChangeListener
from backend_store.errors import StoreError
from backend_store.types import (
    AckResult,
    NewMessage,
    QueueInfo,
    QueueName,
    ReceivedMessage,
    SendResult,
    TenantId,
)

Settle = Callable[[Sequence[str]], None]


class AckTrackingBackend:
    """Delegates to ``inner``; ``ack``/``nack``/``change_visibility`` also call ``settle``."""

    def __init__(self, inner: Backend, settle: Settle) -> None:
        self.inner = inner
        self._settle = settle

    def __getattr__(self, name: str) -> Any:
        # Implementation-specific extras (replication, snapshots) pass straight through.
        return getattr(self.inner, name)

    async def start(self) -> None:
        await self.inner.start()

    async def close(self) -> None:
        await self.inner.close()

    async def check_writable(self) -> None:
        await self.inner.check_writable()

    def add_listener(self, listener: ChangeListener) -> None:
        self.inner.add_listener(listener)

    async def create_queue(
        self, tenant: TenantId, name: QueueName, attributes: Mapping[str, Any]
    ) -> tuple[QueueInfo, bool]:
        return await self.inner.create_queue(tenant, name, attributes)

    async def get_queue(self, tenant: TenantId, name: QueueName) -> QueueInfo:
        return await self.inner.get_queue(tenant, name)

    async def list_queues(self, tenant: TenantId) -> list[QueueInfo]:
        return await self.inner.list_queues(tenant)

    async def update_queue(self, tenant: TenantId, name: QueueName, changes: Mapping[str, Any]) -> QueueInfo:
        return await self.inner.update_queue(tenant, name, changes)

    async def delete_queue(self, tenant: TenantId, name: QueueName) -> None:
        await self.inner.delete_queue(tenant, name)

    async def purge_queue(self, tenant: TenantId, name: QueueName) -> int:
        return await self.inner.purge_queue(tenant, name)

    async def send(
        self, tenant: TenantId, queue: QueueName, messages: Sequence[NewMessage]
    ) -> list[SendResult | StoreError]:
        return await self.inner.send(tenant, queue, messages)

    async def receive(
        self, tenant: TenantId, queue: QueueName, max_messages: int, visibility_timeout_s: float | None = None
    ) -> list[ReceivedMessage]:
        return await self.inner.receive(tenant, queue, max_messages, visibility_timeout_s)

    async def ack(
        self, tenant: TenantId, receipts: Sequence[str], queue: QueueName | None = None
    ) -> AckResult:
        self._settle(receipts)
        return await self.inner.ack(tenant, receipts, queue)

    async def nack(
        self, tenant: TenantId, receipts: Sequence[str], delay_s: float = 0, queue: QueueName | None = None
    ) -> AckResult:
        self._settle(receipts)
        return await self.inner.nack(tenant, receipts, delay_s, queue)

    async def change_visibility(
        self, tenant: TenantId, queue: QueueName, receipt: str, timeout_s: float
    ) -> None:
        await self.inner.change_visibility(tenant, queue, receipt, timeout_s)
        if timeout_s == 0:
            # Visible again at once: it is no longer the stream's to count.
            self._settle([receipt])

    async def next_visible_at(self, tenant: TenantId, queue: QueueName) -> float | None:
        return await self.inner.next_visible_at(tenant, queue)

    async def meta_get(self, namespace: str, key: str) -> bytes | None:
        return await self.inner.meta_get(namespace, key)

    async def meta_put(self, namespace: str, key: str, value: bytes, *, only_if_absent: bool = False) -> bool:
        return await self.inner.meta_put(namespace, key, value, only_if_absent=only_if_absent)

    async def meta_delete(self, namespace: str, key: str) -> bool:
        return await self.inner.meta_delete(namespace, key)

    async def meta_list(self, namespace: str, prefix: str = "") -> list[tuple[str, bytes]]:
        return await self.inner.meta_list(namespace, prefix)
