"""Pub/sub between gateway processes: memory (one process) or Redis, chosen by URL.

Delivery is at most once and fire-and-forget, as Redis pub/sub is: a message published
while a subscriber is disconnected is lost. So subscribers treat it as a hint (a
wake-up, "your caches are stale") backed by a slower truth (the safety poll, the cache
TTL), and :meth:`Broadcaster.on_resync` tells them when a gap may have happened (Redis
came back), so they can treat everything as changed.

``publish`` never blocks and never raises: it queues the message, and one background
task sends everything queued in one pipeline per loop turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from collections.abc import Callable
from typing import Any, Protocol

import redis.asyncio as aioredis

from .errors import STORAGE_ERRORS
from .health import SharedStateHealth
from .url import SharedStateUrl, redis_options

log = logging.getLogger("pushgate.throttling")

MessageCallback = Callable[[bytes], None]
ResyncCallback = Callable[[], None]
CHANNEL_PREFIX = "pushgate:"
# Messages waiting for Redis past this are dropped (oldest first): a hint that old is useless.
MAX_OUTBOX = 10_000


class Broadcaster(Protocol):
    """Channels of bytes between processes. Subscribe before :meth:`start`."""

    def subscribe(self, channel: str, callback: MessageCallback) -> None:
        """Call ``callback(payload)`` on the event loop for each message on ``channel``."""

    def on_resync(self, callback: ResyncCallback) -> None:
        """Call ``callback()`` after messages may have been lost (a reconnect)."""

    def publish(self, channel: str, payload: bytes) -> None:
        """Queue ``payload`` for every subscriber of ``channel`` (this process's too)."""

    async def start(self) -> None: ...

    async def close(self) -> None: ...


class MemoryBroadcaster:
    """Subscribers in this process only (one gateway, or tests)."""

    def __init__(self) -> None:
        self._subscribers: defaultdict[str, list[MessageCallback]] = defaultdict(list)

    def subscribe(self, channel: str, callback: MessageCallback) -> None:
        self._subscribers[channel].append(callback)

    def on_resync(self, callback: ResyncCallback) -> None:
        return None  # nothing is ever lost in process

    def publish(self, channel: str, payload: bytes) -> None:
        loop = asyncio.get_running_loop()
        for callback in self._subscribers.get(channel, ()):
            loop.call_soon(_deliver, callback, payload)

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        self._subscribers.clear()


class RedisBroadcaster:
    """Redis pub/sub: one connection subscribed to every channel, one pipeline per send batch."""

    def __init__(self, url: SharedStateUrl, health: SharedStateHealth) -> None:
        self.url = url
        self.health = health
        self._subscribers: defaultdict[str, list[MessageCallback]] = defaultdict(list)
        self._resync: list[ResyncCallback] = []
        self._outbox: list[tuple[str, bytes]] = []
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        # Bounded calls for publishing; the subscriber's connection blocks on reads by design.
        self._client: Any = aioredis.Redis.from_url(url.url, **redis_options(url))
        self._sub_client: Any = aioredis.Redis.from_url(url.url, **redis_options(url, bounded_reads=False))
        # Set once the subscription is live (tests and start-up wait on it).
        self.subscribed = asyncio.Event()
        self.dropped = 0

    def subscribe(self, channel: str, callback: MessageCallback) -> None:
        self._subscribers[channel].append(callback)

    def on_resync(self, callback: ResyncCallback) -> None:
        self._resync.append(callback)

    def publish(self, channel: str, payload: bytes) -> None:
        if len(self._outbox) >= MAX_OUTBOX:
            del self._outbox[: len(self._outbox) // 2]
            self.dropped += 1
        self._outbox.append((CHANNEL_PREFIX + channel, payload))
        self._wake.set()

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._send_loop()), loop.create_task(self._read_loop())]
        # Give the subscription a moment so the first wake-ups are not missed; an
        # unreachable Redis does not hold start-up (the read loop keeps retrying).
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.url.timeout_s * 4):
                await self.subscribed.wait()

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        for client in (self._client, self._sub_client):
            with contextlib.suppress(*STORAGE_ERRORS):
                await client.aclose()

    async def _send_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            if not self._outbox:
                continue
            batch, self._outbox = self._outbox, []
            if not self.health.should_try():
                self.dropped += len(batch)
                continue
            try:
                async with self._client.pipeline(transaction=False) as pipe:
                    for channel, payload in batch:
                        pipe.publish(channel, payload)
                    await pipe.execute()
            except STORAGE_ERRORS as exc:
                self.dropped += len(batch)
                self.health.failed(exc)
            else:
                self.health.succeeded()

    async def _read_loop(self) -> None:
        lost = False
        channels = [CHANNEL_PREFIX + c for c in self._subscribers]
        while True:
            pubsub = self._sub_client.pubsub(ignore_subscribe_messages=True)
            try:
                if channels:
                    await pubsub.subscribe(*channels)
                self.subscribed.set()
                self.health.succeeded()
                if lost:
                    lost = False
                    for callback in self._resync:
                        _call(callback)
                while True:
                    if not channels:
                        await asyncio.Event().wait()  # nothing to read; wait for close()
                    message = await pubsub.get_message(timeout=1.0)
                    if message is not None and message.get("type") == "message":
                        self._dispatch(message["channel"], message["data"])
            except STORAGE_ERRORS as exc:
                lost = True
                self.subscribed.clear()
                self.health.failed(exc)
            finally:
                with contextlib.suppress(*STORAGE_ERRORS):
                    await pubsub.aclose()
            await asyncio.sleep(self.health.retry_interval_s)

    def _dispatch(self, channel: bytes, payload: bytes) -> None:
        name = channel.decode()[len(CHANNEL_PREFIX) :]
        for callback in self._subscribers.get(name, ()):
            _deliver(callback, payload)


def _deliver(callback: MessageCallback, payload: bytes) -> None:
    try:
        callback(payload)
    except Exception:
        log.exception("broadcast subscriber failed")


def _call(callback: ResyncCallback) -> None:
    try:
        callback()
    except Exception:
        log.exception("resync callback failed")


def open_broadcaster(url: SharedStateUrl, health: SharedStateHealth) -> Broadcaster:
    """The broadcaster for a shared-state URL."""
    if url.is_memory:
        return MemoryBroadcaster()
    return RedisBroadcaster(url, health)
