"""A transport for uvicorn's sans-I/O WebSocket protocol, writing once per event-loop round.

uvicorn hands every frame to the transport as it is sent, and uvloop writes it to the
socket at once: a syscall per frame. A producer pipelining sends gets its ``ok`` replies
in bursts (one per batch the store commits), and a consumer its ``message`` frames in
bursts (one per deal); profiles put those writes at a fifth of the event loop's time when
each message is its own frame. Here the protocol's transport gathers what is written
during one round of the loop and writes it in one call at the end of the round, as a
Redis server answers a pipeline.

Nothing else changes: the bytes and their order are the protocol's, a close writes what is
pending first, and the real transport's flow control (``pause_writing``) applies when the
gathered bytes reach it, in the same round.

The protocol that uses it is :class:`gateway.ws_server_protocol.PushWebSocketProtocol`.
"""

from __future__ import annotations

import asyncio
from typing import Any


class CoalescingTransport(asyncio.Transport):
    """The outgoing side of a transport, gathering the writes of one loop round."""

    def __init__(self, transport: asyncio.Transport) -> None:
        super().__init__()
        self._transport = transport
        self._pending: list[bytes] = []
        self._loop = asyncio.get_running_loop()

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        if not self._pending:
            self._loop.call_soon(self.flush)
        self._pending.append(data if isinstance(data, bytes) else bytes(data))

    def write_many(self, parts: list[bytes]) -> None:
        """Gather ``parts`` (non-empty bytes) for this round's write, in order."""
        if not self._pending:
            self._loop.call_soon(self.flush)
        self._pending.extend(parts)

    def flush(self) -> None:
        """Write what this round gathered (a no-op when it was flushed already)."""
        pending = self._pending
        if not pending:
            return
        self._pending = []
        if not self._transport.is_closing():
            # writelines: one writev for all of it, no copy into one buffer.
            self._transport.writelines(pending)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        self._pending = []
        self._transport.abort()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def pause_reading(self) -> None:
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._transport.resume_reading()

    def is_reading(self) -> bool:
        return self._transport.is_reading()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + sum(map(len, self._pending))
