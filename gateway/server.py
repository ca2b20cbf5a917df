"""Running the app under uvicorn: one worker, uvicorn's own TLS, draining on shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import signal
import socket
import sys
import threading
from collections.abc import Callable

import uvicorn
from starlette.applications import Starlette

from backend_store.backend import ReloadsTls
from backend_store.tested_versions import RELEASES, ReleaseCheck
from backend_store.tls_reload import TlsReloader, server_pair_loader

from . import client_noise
from .open_files_watch import OpenFilesWatch
from .services import GatewayServices
from .settings import Settings
from .ws_protocol import websocket_protocol

log = logging.getLogger("pushgate.gateway")


def uvicorn_config(settings: Settings, app: Starlette, releases: ReleaseCheck = RELEASES) -> uvicorn.Config:
    """uvicorn's configuration; ``releases`` says whether uvicorn and ``websockets`` are the
    releases the WebSocket fast path was tested with (gateway/ws_protocol.py)."""
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        workers=1,
        lifespan="on",
        log_level=settings.log_level,
        # An access log line per request costs more than the rest of a small request: opt-in.
        access_log=settings.access_log,
        ssl_certfile=str(settings.tls_cert) if settings.tls_cert else None,
        ssl_keyfile=str(settings.tls_key) if settings.tls_key else None,
        timeout_graceful_shutdown=settings.graceful_timeout_s,
        server_header=False,
        # permessage-deflate cost ~7% of the gateway's CPU on 1 KiB JSON frames and a zlib
        # state per idle connection; off, as Centrifugo ships it (see docs/push.md).
        ws_per_message_deflate=False,
        # uvicorn's sans-I/O protocol, writing once per event-loop round, with a fast path
        # for push's text frames (ws_server_protocol.py); uvicorn's own on another release.
        ws=websocket_protocol(releases),
        ws_ping_interval=settings.ws_ping_interval_s,
        ws_ping_timeout=settings.ws_ping_timeout_s,
    )
    if settings.access_log:
        # uvicorn gives its access logger the server's level (warning by default), which
        # would hide every access line (they are INFO).
        logging.getLogger("uvicorn.access").setLevel(logging.INFO)
    return config


def bind_socket(settings: Settings) -> socket.socket:
    """Listen on the configured address now, so a busy port fails before anything is written."""
    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    # IPPROTO_TCP named, not 0: asyncio's own loop turns Nagle's algorithm off only on a
    # socket that says it is TCP (uvloop does for any), and with it on, a keep-alive
    # client's next request waited 40 ms for a delayed ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((settings.host, settings.port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


# How long a forced stop (a second Ctrl-C) still gives the store to close.
FORCED_CLOSE_S = 2.0


class GatewayServer(uvicorn.Server):
    """uvicorn's server, plus: long-polls and push streams end as soon as shutdown begins.

    uvicorn's shutdown stops accepting, waits for in-flight requests, then runs the
    lifespan shutdown that closes the store. Setting ``draining`` first means a 20 s
    long-poll answers at once (with what it has) instead of holding shutdown up.
    """

    def __init__(self, config: uvicorn.Config, services: GatewayServices, *, announce: bool = False) -> None:
        super().__init__(config)
        self.services = services
        self.announce = announce
        self._quiet: Callable[[], None] = lambda: None
        self.certificate: TlsReloader | None = None
        self._watches: list[asyncio.Task[None]] = []  # while serving

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self._quiet = client_noise.install()
        await super().startup(sockets)
        if self.started:  # (uvicorn calls no shutdown after a failed start: nothing to stop then)
            self._watch_certificate()
            # Every connection is a descriptor: warn while they fill the limit (open_files_watch.py).
            limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
            if limit != resource.RLIM_INFINITY:
                watch = OpenFilesWatch(lambda: len(self.server_state.connections), limit)
                self._watches.append(asyncio.get_running_loop().create_task(watch.run()))
        if self.started and self.announce:
            scheme = "https" if self.services.settings.tls else "http"
            for server in self.servers:
                for sock in server.sockets:
                    host, port = sock.getsockname()[:2]
                    print(f"Pushgate serving on {scheme}://{host}:{port}", file=sys.stdout, flush=True)

    def _watch_certificate(self) -> None:
        """Serve a renewed certificate without a restart (backend_store/tls_reload.py): looked at every
        ``tls_reload_interval_s`` and on SIGHUP, which without TLS does nothing (instead of
        its default, ending the process: ``systemctl reload`` must never stop a gateway)."""
        settings = self.services.settings
        loop = asyncio.get_running_loop()
        if settings.tls_cert is not None and settings.tls_key is not None and self.config.ssl is not None:
            # uvicorn's own context (Config.ssl, made by Config.load before startup).
            self.certificate = TlsReloader(
                (settings.tls_cert, settings.tls_key),
                server_pair_loader(self.config.ssl),
                settings.tls_reload_interval_s,
            )
            self.services.metrics.sources.tls_certificate = self.certificate
            self._watches.append(loop.create_task(self.certificate.run()))
        if threading.current_thread() is threading.main_thread():
            loop.add_signal_handler(signal.SIGHUP, self._reload)

    def _reload(self) -> None:
        """SIGHUP: look at every TLS file now, the listener's and the store connections'."""
        loaded = self.certificate is not None and self.certificate.check()
        backend = self.services.backend
        if isinstance(backend, ReloadsTls):
            loaded = backend.reload_tls() or loaded
        if not loaded:
            log.info("SIGHUP: no TLS file changed")

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for watch in self._watches:
            watch.cancel()
        # Before uvicorn closes connections (WebSockets with its own 1012): push closes
        # them with 1001 and releases their messages, SSE streams and long-polls end.
        await self.services.drain()
        await super().shutdown(sockets)
        if self.force_exit:
            # A second Ctrl-C makes uvicorn skip the lifespan shutdown: the store would stay
            # open and the lifespan task be cancelled at exit, with a CancelledError traceback.
            # Close it anyway, for a moment only (forcing is for a shutdown that hangs).
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(FORCED_CLOSE_S):
                    await self.lifespan.shutdown()
        self._quiet()
