"""``--metrics-listen HOST:PORT``: ``GET /metrics`` without a token, on an address of its own.

For a private network where Prometheus cannot hold a token. A tiny HTTP/1.1 server on
asyncio streams (one request per connection, then close): it answers ``GET /metrics``
and ``404`` to anything else, and shares nothing with the main port but the registry.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from backend_store.errors import ConfigurationError

log = logging.getLogger("pushgate.gateway")

_MAX_HEADER_BYTES = 16 * 1024


def parse_listen(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:9100`` for IPv6) -> (host, port)."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigurationError(f"--metrics-listen must be HOST:PORT, not {value!r}")
    return host.strip("[]"), int(port)


class MetricsListener:
    """A component (start/drain/close) serving ``render()`` at ``/metrics``."""

    def __init__(self, listen: str, render: Callable[[], Awaitable[tuple[bytes, str]]]) -> None:
        self.host, self.port = parse_listen(listen)
        self.render = render
        self._server: asyncio.Server | None = None

    @property
    def bound_port(self) -> int:
        """The port actually bound (PORT 0 picks a free one)."""
        assert self._server is not None and self._server.sockets
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, self.host, self.port)
        log.info("metrics listener on %s:%d", self.host, self.bound_port)

    async def drain(self) -> None:
        if self._server is not None:
            self._server.close()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(10):
                head = await reader.readuntil(b"\r\n\r\n")
            if len(head) > _MAX_HEADER_BYTES:
                raise ValueError("headers too large")
            method, path, *_ = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
            path = path.split("?", 1)[0]
            if method in ("GET", "HEAD") and path == "/metrics":
                body, content_type = await self.render()
                status = "200 OK"
            else:
                body, content_type, status = b"not found\n", "text/plain; charset=utf-8", "404 Not Found"
            writer.write(
                f"HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\n"
                f"content-length: {len(body)}\r\nconnection: close\r\n\r\n".encode()
            )
            if method != "HEAD":
                writer.write(body)
            await writer.drain()
        except (TimeoutError, ValueError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
            pass  # a broken or idle client: just close
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
