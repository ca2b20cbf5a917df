"""The alert webhook notifier against a real local HTTP server: retries, giving up, dropping."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tests.conftest import scaled
from web_console.alerts import WebhookNotifier


class Failing:
    """Answers every POST with ``status``; counts and times them."""

    def __init__(self, status: int) -> None:
        self.status = status
        self.times: list[float] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["content-length"]))
                outer.times.append(time.monotonic())
                self.send_response(outer.status)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"


@pytest.fixture
def failing() -> Iterator[Failing]:
    server = Failing(500)
    try:
        yield server
    finally:
        server.server.shutdown()
        server.server.server_close()


async def test_gives_up_after_its_attempts_with_growing_backoff(failing: Failing) -> None:
    notifier = WebhookNotifier(failing.url, attempts=4, first_backoff_s=0.05, max_backoff_s=0.1)
    await notifier.start()
    try:
        notifier.enqueue({"alert": {"state": "fired"}})
        async with asyncio.timeout(scaled(10)):
            await notifier.wait_idle()
    finally:
        await notifier.close()
    assert len(failing.times) == 4
    gaps = [b - a for a, b in zip(failing.times, failing.times[1:], strict=False)]
    assert gaps[0] >= 0.05 and gaps[1] >= 0.1 and gaps[2] >= 0.1  # 0.05, 0.1, then capped at 0.1
    assert notifier.outcomes == {"failed": 1}


async def test_an_unreachable_webhook_never_blocks_and_drops_the_oldest() -> None:
    # Nothing listens on port 9 of localhost here (discard): every attempt fails fast.
    notifier = WebhookNotifier("http://127.0.0.1:9/", attempts=1, max_queued=2)
    started = time.monotonic()
    for i in range(5):
        notifier.enqueue({"n": i})  # not started: nothing is sent, the queue fills
    assert time.monotonic() - started < 0.1
    assert notifier.outcomes["dropped"] == 3
    await notifier.start()
    try:
        async with asyncio.timeout(scaled(10)):
            await notifier.wait_idle()
    finally:
        await notifier.close()
    assert notifier.outcomes == {"dropped": 3, "failed": 2}
