"""Python client for Pushgate: HTTP send/receive/ack, and push subscriptions over
WebSocket or SSE with automatic reconnect and backoff, in asyncio and blocking flavours.

::

    async with AsyncClient("http://localhost:8080", token) as client:
        await client.send("orders", "hello")
        async with client.subscribe("orders", prefetch=10) as messages:
            async for message in messages:
                ...
                await messages.ack(message)
"""

from .async_client import AsyncClient, AsyncSubscription, AsyncWsProducer
from .backoff import Backoff
from .errors import ConnectionEnded, PushgateError
from .models import Message, SendResult
from .sse import Event, SseParser
from .sync_client import Client, Subscription

__all__ = [
    "AsyncClient",
    "AsyncSubscription",
    "AsyncWsProducer",
    "Backoff",
    "Client",
    "ConnectionEnded",
    "Event",
    "Message",
    "PushgateError",
    "SendResult",
    "SseParser",
    "Subscription",
]
