"""A real gateway on an ephemeral port, run by uvicorn in a background thread, and httpx clients.

One gateway per test module (start-up opens LMDB and bootstraps a tenant); tests keep
apart by using fresh queue names (the ``qname`` fixture) and their own tenants.
Tenants and keys are made through the gateway's own authenticator, on its event loop.

With ``PUSHGATE_TEST_STORE=cluster`` the ``gateway`` fixtures (here and in tests/push) serve
on the session's dev cluster instead (``cluster://``, queues replicated three times, sync;
the admin key is the one the dev cluster's gateway bootstrapped). ``scripts/test`` runs the
whole gateway and push suites that way, but for tests marked ``embedded_only``.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from backend_store.backend import Backend
from backend_store.tested_versions import ReleaseCheck
from gateway.app import create_app
from gateway.server import GatewayServer, bind_socket, uvicorn_config
from gateway.services import GatewayServices
from gateway.settings import Settings
from tests.conftest import scaled
from tests.fixtures.dev_cluster import StoreTarget

T = TypeVar("T")
_names = itertools.count()


class RunningGateway:
    """A gateway serving on 127.0.0.1:<free port> until :meth:`stop`."""

    def __init__(
        self,
        settings: Settings,
        backend: Backend | None = None,
        port: int = 0,
        admin_key: str | None = None,
        releases: ReleaseCheck | None = None,
    ) -> None:
        """``releases``: the installed releases the gateway chooses its WebSocket protocol by
        (gateway/ws_protocol.py); a check that reports an untested uvicorn takes the public doors."""
        self.settings = settings
        self._admin_key = admin_key
        app = create_app(settings, backend=backend)
        self.app = app  # the Starlette app, typed (uvicorn's config holds any ASGI app)
        self.services: GatewayServices = app.state.services
        self.server = GatewayServer(uvicorn_config(settings, app, releases or ReleaseCheck()), self.services)
        # The product's own listening socket (a given port: a restart on the same address). On
        # this thread's asyncio loop a keep-alive client's every request after its first
        # waited 40 ms for a delayed ACK until that socket said it was TCP (gateway/server.py).
        self._sock = bind_socket(replace(settings, host="127.0.0.1", port=port))
        self.port: int = self._sock.getsockname()[1]
        scheme = "https" if settings.tls else "http"
        self.url = f"{scheme}://127.0.0.1:{self.port}"
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="gateway", daemon=True)
        self.error: BaseException | None = None

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self.server.serve(sockets=[self._sock]))
        except BaseException as exc:  # surfaced by start()/stop() in the test thread
            self.error = exc
        finally:
            self.loop.close()

    def start(self) -> RunningGateway:
        self._thread.start()
        deadline = time.monotonic() + scaled(15)
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"gateway did not start: {self.error!r}")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join(scaled(30))
        self._sock.close()
        if self.error is not None:
            raise self.error

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine on the gateway's loop (the store's callers must share its loop)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(scaled(10))

    @property
    def admin_key(self) -> str:
        key = self.services.bootstrap_key or self._admin_key
        assert key is not None, "the gateway's data directory was not empty"
        return key

    def make_key(self, scopes: str, tenant: str = "default") -> str:
        _, token = self.call(self.services.authenticator.api_keys.create(tenant, scopes))
        return token

    def make_tenant(self, name: str | None = None) -> str:
        name = name or f"t{next(_names)}-{time.monotonic_ns() % 10**6}"
        self.call(self.services.authenticator.tenants.create(name))
        return name


@dataclass
class Api:
    """An httpx client with a token, and helpers that assert nothing (tests do)."""

    client: httpx.Client

    def put_queue(self, name: str, **attributes: Any) -> httpx.Response:
        return self.client.put(f"/v1/queues/{name}", json=attributes)

    def send(self, queue: str, body: str = "hello", **fields: Any) -> httpx.Response:
        return self.client.post(f"/v1/queues/{queue}/messages", json={"body": body, **fields})

    def receive(self, queue: str, **params: Any) -> httpx.Response:
        return self.client.post(f"/v1/queues/{queue}/receive", json={"wait_s": 0, **params})

    def ack(self, queue: str, receipts: list[str]) -> httpx.Response:
        return self.client.post(f"/v1/queues/{queue}/ack", json={"receipts": receipts})


def start_gateway(
    data_dir: Path,
    port: int = 0,
    target: StoreTarget | None = None,
    releases: ReleaseCheck | None = None,
    **changes: Any,
) -> RunningGateway:
    target = target or StoreTarget()
    if target.url is not None:
        changes["store_url"] = target.url
    settings = Settings(data_dir=data_dir, log_level="warning", graceful_timeout_s=5, **changes)
    return RunningGateway(settings, port=port, admin_key=target.admin_key, releases=releases).start()


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, store_target: StoreTarget) -> Iterator[RunningGateway]:
    running = start_gateway(tmp_path_factory.mktemp("gateway"), target=store_target)
    try:
        yield running
    finally:
        running.stop()


def api_for(gateway: RunningGateway, token: str | None) -> Iterator[Api]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with httpx.Client(base_url=gateway.url, headers=headers, timeout=scaled(30), verify=False) as client:
        yield Api(client)


@pytest.fixture
def admin(gateway: RunningGateway) -> Iterator[Api]:
    """A client holding the bootstrap admin key of tenant ``default``."""
    yield from api_for(gateway, gateway.admin_key)


@pytest.fixture
def anon(gateway: RunningGateway) -> Iterator[Api]:
    yield from api_for(gateway, None)


@pytest.fixture
def qname() -> str:
    """A queue name no other test uses."""
    return f"q{next(_names)}-{time.monotonic_ns() % 10**9}"


def problem_code(response: httpx.Response, status: int) -> str:
    """Check a problem document's shape and status; return its code."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    doc = response.json()
    assert set(doc) >= {"type", "title", "status", "detail", "code"}
    assert doc["status"] == status
    code: str = doc["code"]
    return code
