"""Durable queue storage: the :class:`Backend` interface and its implementations."""

from .backend import Backend, ChangeListener
from .errors import PushgateError
from .options import StoreOptions
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
from .url import open_backend

__all__ = [
    "AckResult",
    "Backend",
    "ChangeListener",
    "Lsn",
    "MessageId",
    "NewMessage",
    "PushgateError",
    "QueueAttributes",
    "QueueInfo",
    "QueueName",
    "QueueStats",
    "Receipt",
    "ReceiptFailure",
    "ReceivedMessage",
    "SendResult",
    "StoreOptions",
    "TenantId",
    "open_backend",
]
