"""Browsers against a real gateway: a static page server on two origins, and a gateway.

A page's origin is scheme, host and port, so one page server on 127.0.0.1:<port> gives
two origins: ``http://localhost:<port>`` (which the test tenant allows) and
``http://127.0.0.1:<port>`` (which it does not). The gateway listens on another port, so
both are cross-origin to it.
"""

from __future__ import annotations

import functools
import http.server
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.gateway.conftest import RunningGateway, start_gateway

PAGES = Path(__file__).parent / "pages"
TENANT = "web"


@dataclass(frozen=True)
class PageServer:
    port: int

    @property
    def allowed(self) -> str:
        """The origin the test tenant lists."""
        return f"http://localhost:{self.port}"

    @property
    def foreign(self) -> str:
        """An origin no tenant lists."""
        return f"http://127.0.0.1:{self.port}"


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass  # pytest output stays readable


@pytest.fixture(scope="session")
def page_server() -> Iterator[PageServer]:
    """Serves tests/browser/pages/ on 127.0.0.1:<free port> until the session ends."""
    handler = functools.partial(_QuietHandler, directory=str(PAGES))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, name="page-server", daemon=True)
    thread.start()
    try:
        yield PageServer(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@dataclass
class WebGateway:
    """A gateway with tenant ``web`` (allowing the page server's ``allowed`` origin) and its key."""

    gateway: RunningGateway
    key: str

    @property
    def url(self) -> str:
        return self.gateway.url


@pytest.fixture(scope="module")
def web(tmp_path_factory: pytest.TempPathFactory, page_server: PageServer) -> Iterator[WebGateway]:
    gateway = start_gateway(tmp_path_factory.mktemp("browser"))
    try:
        # Before any preflight: the preflight's union of origins is cached for a few seconds.
        gateway.call(gateway.services.authenticator.tenants.create(TENANT, [page_server.allowed]))
        # manage: too: the tests create their queues with this key (creating needs manage:).
        key = gateway.make_key("manage:* send:* receive:*", tenant=TENANT)
        yield WebGateway(gateway, key)
    finally:
        gateway.stop()
