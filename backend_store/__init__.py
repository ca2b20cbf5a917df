"""Durable queue storage: the :class:`Backend` interface and its implementations."""

from .backend import Backend, ChangeListener
from .errors import StoreError
from .types import (
    AckResult,
    Lsn,
    MessageId,
    NewMessage,
    QueueAttributes,
    QueueInfo,
    QueueName,
    QueueStats,
    Receipt,
    ReceiptFailure,
    ReceivedMessage,
    SendResult,
    TenantId,
)
from .url import StoreOptions, open_backend

__all__ = [
    "AckResult",
    "Backend",
    "ChangeListener",
    "Lsn",
    "MessageId",
    "NewMessage",
    "QueueAttributes",
    "QueueInfo",
    "QueueName",
    "QueueStats",
    "Receipt",
    "ReceiptFailure",
    "ReceivedMessage",
    "SendResult",
    "StoreError",
    "StoreOptions",
    "TenantId",
    "open_backend",
]
