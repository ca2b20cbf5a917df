"""Which protocol serves the gateway's WebSockets: the fast path on the tested releases of
uvicorn and ``websockets``, uvicorn's public one on any other.

The fast path (:class:`gateway.ws_server_protocol.PushWebSocketProtocol`) subclasses
uvicorn's private sans-I/O protocol and reads ``websockets``' parser state
(:mod:`gateway.ws_websockets_internals`): it needs both libraries at a release it was tested
with. On any other, the gateway serves WebSockets with uvicorn's own ``websockets-sansio``
protocol, unmodified; the connection reaches the same Starlette route and the same push
handler, which without the fast path's scope extensions sends and receives through ASGI
(``push/transport.py``, ``push/ws_handler.py``). One warning in the log names the release and
what it costs (:class:`backend_store.tested_versions.ReleaseCheck`).

The two modules that hold the internals are imported only here and only after the check, so
a release that moved or removed them never fails an import.
"""

from __future__ import annotations

import asyncio

from backend_store.tested_versions import RELEASES, ReleaseCheck, VersionRange

# What uvicorn.Config(ws=...) takes for its public sans-I/O protocol.
PUBLIC_PROTOCOL = "websockets-sansio"

_FALLBACK = (
    "WebSockets run on uvicorn's public websockets-sansio protocol instead, "
    "at 15-50% more gateway CPU per message with a frame per message"
)

TESTED_UVICORN = VersionRange(
    "uvicorn",
    "0.54",
    "0.55",
    "gateway/ws_server_protocol.py subclasses uvicorn's private WebSocketsSansIOProtocol "
    "and uses its attributes (queue, read_paused, conn, transport, handshake state)",
    _FALLBACK,
)
TESTED_WEBSOCKETS = VersionRange(
    "websockets",
    "17.4",
    "17.5",
    "gateway/ws_websockets_internals.py reads the state of websockets' frame parser "
    "(a generator's code object, its buffer, current_size, parser_exc)",
    _FALLBACK,
)


def websocket_protocol(releases: ReleaseCheck = RELEASES) -> type[asyncio.Protocol] | str:
    """The fast path's protocol class if uvicorn and ``websockets`` are both tested releases,
    else :data:`PUBLIC_PROTOCOL` (each untested one warned about, once per ``releases``)."""
    # Both asked, so each untested release is named.
    tested = [releases.tested(TESTED_UVICORN), releases.tested(TESTED_WEBSOCKETS)]
    if not all(tested):
        return PUBLIC_PROTOCOL
    from .ws_server_protocol import PushWebSocketProtocol

    return PushWebSocketProtocol
