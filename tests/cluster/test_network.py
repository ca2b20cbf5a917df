"""The partition the cluster tests rely on (``tests/fixtures/tcp_proxy.py``, ``network.py``),
checked against an echo server: if the proxy leaked bytes or closed connections while
partitioned, the partition tests would be testing something milder than a partition."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from backend_store.cluster.protocol.connection import Connection
from tests.conftest import scaled
from tests.fixtures.tcp_proxy import TcpProxy

from .network import hello_of

# Long enough for a leak to show on an idle machine; on correct code it passes however slow.
NOTHING_WITHIN_S = 0.3


@pytest.fixture
async def echo_port() -> AsyncIterator[int]:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()


async def silent(reader: asyncio.StreamReader) -> bool:
    """Nothing arrives (and the stream does not end) within the window."""
    try:
        async with asyncio.timeout(NOTHING_WITHIN_S):
            await reader.read(1)
    except TimeoutError:
        return True
    return False


async def test_a_partition_holds_bytes_both_ways_and_the_heal_delivers_them(echo_port: int) -> None:
    proxy = await TcpProxy(echo_port).start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(b"before ")
        assert await asyncio.wait_for(reader.readexactly(7), scaled(5)) == b"before "
        proxy.partition()
        writer.write(b"during ")
        await writer.drain()
        # A new connection is accepted, then hears nothing: not refused, not closed.
        late_reader, late_writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        late_writer.write(b"late")
        assert await silent(reader)
        assert await silent(late_reader)
        proxy.heal()
        assert await asyncio.wait_for(reader.readexactly(7), scaled(5)) == b"during "
        assert await asyncio.wait_for(late_reader.readexactly(4), scaled(5)) == b"late"
        proxy.cut()  # and a cut ends them
        assert await asyncio.wait_for(reader.read(), scaled(5)) == b""
        writer.close()
        late_writer.close()
    finally:
        await proxy.close()


async def test_a_partition_of_one_peer_leaves_the_others_through(echo_port: int) -> None:
    proxy = await TcpProxy(echo_port, identify=hello_of).start()
    try:
        streams: dict[str, tuple[asyncio.StreamReader, asyncio.StreamWriter]] = {}
        for node in ("n0", "n1"):
            reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
            writer.write(Connection(node).data_to_send())  # its hello names it
            streams[node] = reader, writer
        proxy.partition({"n0"})
        for node, (_, writer) in streams.items():
            writer.write(f"from {node}".encode())
        # The echo server sends the hello back, then the payload: n1 is through, n0 held.
        assert (await asyncio.wait_for(streams["n1"][0].readuntil(b"from n1"), scaled(5))).endswith(
            b"from n1"
        )
        assert await silent(streams["n0"][0])
        proxy.heal()
        assert (await asyncio.wait_for(streams["n0"][0].readuntil(b"from n0"), scaled(5))).endswith(
            b"from n0"
        )
        for _, writer in streams.values():
            writer.close()
    finally:
        await proxy.close()
