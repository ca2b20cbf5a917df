"""One gateway for the console, metrics and alert tests, with a real webhook receiver.

The gateway samples every 0.2 s (so live pages and alerts move within a test's patience),
keeps per-queue metric series for at most ``QUEUE_SERIES`` queues, listens for
token-less scrapes on a second port, and POSTs alert transitions to a local HTTP server
that fails each event's first delivery (so every delivery exercises the retry).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import orjson
import pytest

from gateway.operations import Operations
from tests.conftest import scaled
from tests.gateway.conftest import Api, RunningGateway, api_for, start_gateway

QUEUE_SERIES = 3
_names = itertools.count()


@dataclass
class WebhookReceiver:
    """A real HTTP server on 127.0.0.1; answers 503 to each new body once, then 200."""

    server: ThreadingHTTPServer
    attempts: list[dict[str, Any]] = field(default_factory=list)
    delivered: list[dict[str, Any]] = field(default_factory=list)
    changed: threading.Condition = field(default_factory=threading.Condition)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def wait_for(self, predicate: Any, timeout: float = 10.0) -> list[dict[str, Any]]:
        with self.changed:
            assert self.changed.wait_for(lambda: predicate(self.delivered), scaled(timeout)), self.delivered
            return list(self.delivered)


def _receiver() -> WebhookReceiver:
    seen: set[bytes] = set()
    holder: list[WebhookReceiver] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["content-length"]))
            receiver = holder[0]
            with receiver.changed:
                doc = orjson.loads(body)
                receiver.attempts.append(doc)
                first = body not in seen
                seen.add(body)
                if not first:
                    receiver.delivered.append(doc)
                receiver.changed.notify_all()
            self.send_response(503 if first else 200)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    holder.append(WebhookReceiver(server))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return holder[0]


@pytest.fixture(scope="session")
def webhook() -> Iterator[WebhookReceiver]:
    receiver = _receiver()
    try:
        yield receiver
    finally:
        receiver.server.shutdown()
        receiver.server.server_close()


@pytest.fixture(scope="session")
def ops_gateway(
    tmp_path_factory: pytest.TempPathFactory, webhook: WebhookReceiver
) -> Iterator[RunningGateway]:
    running = start_gateway(
        tmp_path_factory.mktemp("ops-gateway"),
        monitor_interval_s=0.2,
        metrics_queue_series=QUEUE_SERIES,
        metrics_listen="127.0.0.1:0",
        alert_webhook_url=webhook.url,
    )
    try:
        yield running
    finally:
        running.stop()


def operations(gateway: RunningGateway) -> Operations:
    ops: Operations = gateway.app.state.operations
    return ops


@pytest.fixture
def admin(ops_gateway: RunningGateway) -> Iterator[Api]:
    yield from api_for(ops_gateway, ops_gateway.admin_key)


@pytest.fixture
def tenant_admin(ops_gateway: RunningGateway) -> Iterator[Api]:
    """An admin of a fresh tenant (not the operator tenant)."""
    tenant = ops_gateway.make_tenant()
    yield from api_for(ops_gateway, ops_gateway.make_key("admin", tenant))


@pytest.fixture
def qname() -> str:
    return f"cq{next(_names)}-{time.monotonic_ns() % 10**9}"


def wait_until(predicate: Any, timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + scaled(timeout)
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.02)


def wait_sampled(gateway: RunningGateway, *names: str) -> None:
    """Until the monitor's latest sample has these queues (pages show samples at most 1 s old)."""
    sampler = operations(gateway).sampler

    def seen() -> bool:
        present = {q.name for q in sampler.latest.queues}
        return all(name in present for name in names)

    wait_until(seen, what=f"the monitor to sample {names}")


def scrape(url: str, token: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.get(f"{url}/metrics", headers=headers, timeout=scaled(10))


__all__ = ["QUEUE_SERIES", "WebhookReceiver", "operations", "scrape", "wait_sampled", "wait_until"]
