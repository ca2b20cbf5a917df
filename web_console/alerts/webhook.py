"""Alert notifications POSTed to a webhook from a background task, with retries and backoff.

Nothing waits for the webhook: :meth:`WebhookNotifier.enqueue` only puts the event in a
bounded queue (the oldest is dropped when it is full). One task delivers them in order;
a failed POST (connection error, timeout, any non-2xx answer) is retried after 0.5, 1,
2, 4... seconds (capped at ``max_backoff_s``) up to ``attempts`` times, then given up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from typing import Any

import httpx
import orjson

log = logging.getLogger("pushgate.alerts")


class WebhookNotifier:
    def __init__(
        self,
        url: str,
        *,
        attempts: int = 5,
        first_backoff_s: float = 0.5,
        max_backoff_s: float = 30.0,
        timeout_s: float = 5.0,
        max_queued: int = 1000,
    ) -> None:
        self.url = url
        self.attempts = attempts
        self.first_backoff_s = first_backoff_s
        self.max_backoff_s = max_backoff_s
        self.timeout_s = timeout_s
        self.outcomes: Counter[str] = Counter()
        self._queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(max_queued)
        self._task: asyncio.Task[None] | None = None
        self._client: httpx.AsyncClient | None = None

    def enqueue(self, event: dict[str, Any]) -> None:
        """Queue an event for delivery; never blocks, never raises."""
        if self._queue.full():
            with contextlib.suppress(asyncio.QueueEmpty):
                self._queue.get_nowait()
                self._queue.task_done()
            self.outcomes["dropped"] += 1
        self._queue.put_nowait(event)

    async def wait_idle(self) -> None:
        """Until everything queued was delivered or given up (tests, shutdown)."""
        await self._queue.join()

    async def start(self) -> None:
        if self._task is None:
            self._client = httpx.AsyncClient(timeout=self.timeout_s)
            self._task = asyncio.create_task(self._run(), name="pushgate-alert-webhook")

    async def drain(self) -> None:
        pass  # queued events get until close to go out

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def _run(self) -> None:
        while True:
            event = await self._queue.get()
            try:
                await self._deliver(event)
            finally:
                self._queue.task_done()

    async def _deliver(self, event: dict[str, Any]) -> None:
        assert self._client is not None
        body = orjson.dumps(event)
        delay = self.first_backoff_s
        for attempt in range(1, self.attempts + 1):
            try:
                response = await self._client.post(
                    self.url, content=body, headers={"content-type": "application/json"}
                )
                if 200 <= response.status_code < 300:
                    self.outcomes["delivered"] += 1
                    return
                problem = f"status {response.status_code}"
            except httpx.HTTPError as exc:
                problem = type(exc).__name__
            if attempt < self.attempts:
                log.info("alert webhook attempt %d failed (%s); retrying in %.1fs", attempt, problem, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.max_backoff_s)
            else:
                log.warning("alert webhook gave up after %d attempts (%s)", attempt, problem)
        self.outcomes["failed"] += 1
