"""The asyncio shell of a node-protocol :class:`~.connection.Connection` over TCP.

All protocol rules live in the sans-I/O connection; this only moves bytes: socket reads
feed it, its output is written, and the messages it parses come out of :meth:`events`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from .connection import Connection, Event
from .wire import CloseCode

_READ_CHUNK = 256 * 1024
# How long closing waits for the peer before dropping the connection: over TLS, asyncio waits
# for the peer's close_notify (up to 30 s), which a frozen or dead peer never sends; a full
# send buffer to such a peer would wait as long. A node's stop, a gateway's shutdown or a
# leader's re-dial must not wait on it.
CLOSE_TIMEOUT_S = 1.0


class NodeStream:
    def __init__(
        self, connection: Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.connection = connection
        self._reader = reader
        self._writer = writer
        self._flush_scheduled = False
        self.flush()  # our hello

    async def events(self) -> AsyncIterator[Event]:
        """Messages as they arrive, ending with a ``Closed`` event."""
        while not self.connection.closed:
            try:
                data = await self._reader.read(_READ_CHUNK)
            except (ConnectionError, OSError):
                data = b""
            if data:
                self.connection.receive_data(data)
            else:
                self.connection.receive_eof()
            self.flush()  # a Close frame the connection decided to send
            for event in self.connection.events_received():
                yield event

    def flush(self) -> None:
        """Hand what the connection wants to send to the transport (no waiting)."""
        data = self.connection.data_to_send()
        if data and not self._writer.is_closing():
            self._writer.write(data)

    def flush_soon(self) -> None:
        """Flush once the event loop's current round of callbacks has run: the frames of many
        requests (or replies) finishing together go out in one write, not one syscall each."""
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._scheduled_flush)

    def _scheduled_flush(self) -> None:
        self._flush_scheduled = False
        self.flush()

    async def drain(self) -> None:
        """Wait while the transport's buffer is over its high-water mark."""
        with contextlib.suppress(ConnectionError, OSError):
            await self._writer.drain()

    async def close(self, code: CloseCode = CloseCode.NORMAL, detail: str = "") -> None:
        if not self.connection.closed:
            self.connection.close(code, detail)
            self.flush()
        self._writer.close()
        try:
            async with asyncio.timeout(CLOSE_TIMEOUT_S):
                with contextlib.suppress(ConnectionError, OSError):
                    await self._writer.wait_closed()
        except TimeoutError:
            self._writer.transport.abort()
