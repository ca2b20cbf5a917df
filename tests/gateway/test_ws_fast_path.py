"""The WebSocket fast path (gateway/ws_frames.py, gateway/ws_server_protocol.py): frames cut
and built here must be the frames ``websockets`` would read and write, whatever way the
bytes arrive, and everything that is not a whole text message must still reach
``websockets`` and uvicorn, in order.

The server tests use ``websockets``' own sans-I/O client over a raw socket, so the test
decides exactly how the bytes are cut into TCP writes.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import orjson
import pytest
from websockets.client import ClientProtocol
from websockets.frames import Frame, Opcode
from websockets.typing import Subprotocol
from websockets.uri import parse_uri

from gateway.ws_frames import FrameSplitter, text_frame_header, text_payload, unmask
from gateway.ws_server_protocol import Inbox, PushWebSocketProtocol
from tests.conftest import scaled
from tests.gateway.conftest import RunningGateway

OP_BINARY, OP_CONT, OP_PING, OP_PONG, OP_TEXT = (
    Opcode.BINARY,
    Opcode.CONT,
    Opcode.PING,
    Opcode.PONG,
    Opcode.TEXT,
)


def client_frames(*frames: Frame) -> list[bytes]:
    """Each frame as a client sends it (masked)."""
    return [frame.serialize(mask=True) for frame in frames]


@pytest.mark.parametrize("length", [0, 1, 125, 126, 65535, 65536])
def test_text_frame_header_is_what_websockets_writes(length: int) -> None:
    payload = b"x" * length
    assert text_frame_header(length) + payload == Frame(OP_TEXT, payload).serialize(mask=False)


@pytest.mark.parametrize("chunk", [1, 3, 7, 1000, 1 << 20])
def test_the_splitter_cuts_any_cutting_of_a_stream_into_the_same_frames(chunk: int) -> None:
    texts = [b"", b"hello", b"y" * 200, "é".encode() * 40000]
    frames = [
        *client_frames(*(Frame(OP_TEXT, text) for text in texts)),
        *client_frames(
            Frame(OP_PING, b"p"),
            Frame(OP_TEXT, b"part", fin=False),
            Frame(OP_CONT, b" two"),
            Frame(OP_BINARY, b"\x00\x01"),
        ),
    ]
    stream = b"".join(frames)
    splitter = FrameSplitter(max_size=1 << 20)
    cut: list[bytes] = []
    for start in range(0, len(stream), chunk):
        cut.extend(splitter.feed(stream[start : start + chunk]))
    assert cut == frames and splitter.buffered == 0
    # Whole text messages are unmasked here; a ping, a fragment, a binary frame are not.
    assert [text_payload(frame) for frame in cut] == [*texts, None, None, None, None]
    # cut() (what the protocol uses) finds the same frames and the same text messages.
    splitter = FrameSplitter(max_size=1 << 20)
    spans_cut: list[bytes] = []
    payloads: list[bytes | None] = []
    for start in range(0, len(stream), chunk):
        data, spans = splitter.cut(stream[start : start + chunk])
        for first, mask_at, end in spans:
            spans_cut.append(data[first:end])
            payloads.append(unmask(data, mask_at, end) if mask_at >= 0 else None)
    assert spans_cut == frames and payloads == [*texts, None, None, None, None]


def test_a_frame_announcing_too_much_turns_the_splitter_into_a_pass_through() -> None:
    small, large = client_frames(Frame(OP_TEXT, b"ok"), Frame(OP_TEXT, b"z" * 300))
    splitter = FrameSplitter(max_size=100)
    assert splitter.feed(small + large[:50]) == [small, large[:50]]
    assert splitter.passthrough
    assert splitter.feed(large[50:]) == [large[50:]]


class RawClient:
    """``websockets``' sans-I/O client protocol over a raw socket."""

    def __init__(self, sock: socket.socket, protocol: ClientProtocol) -> None:
        self.sock = sock
        self.protocol = protocol
        self.loop = asyncio.get_running_loop()
        self.frames: list[Frame] = []

    @classmethod
    async def open(cls, gateway: RunningGateway) -> RawClient:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        url = f"ws://127.0.0.1:{gateway.port}/v1/ws"
        protocol = ClientProtocol(parse_uri(url), subprotocols=[Subprotocol("pushgate.v1")], max_size=None)
        client = cls(sock, protocol)
        await client.loop.sock_connect(sock, ("127.0.0.1", gateway.port))
        request = client.protocol.connect()
        request.headers["Authorization"] = f"Bearer {gateway.admin_key}"
        client.protocol.send_request(request)
        await client.write(b"".join(client.protocol.data_to_send()))
        while not client.protocol.events_received():
            client.protocol.receive_data(await client.loop.sock_recv(sock, 65536))
        return client

    async def write(self, data: bytes) -> None:
        await self.loop.sock_sendall(self.sock, data)

    async def read_until(self, done: Any) -> list[Frame]:
        """Frames from the server until ``done(frames)`` or the connection closes."""
        async with asyncio.timeout(scaled(5)):
            while not done(self.frames) and self.protocol.close_rcvd is None:
                data = await self.loop.sock_recv(self.sock, 1 << 20)
                if not data:
                    self.protocol.receive_eof()
                    break
                self.protocol.receive_data(data)
                self.frames.extend(e for e in self.protocol.events_received() if isinstance(e, Frame))
        return self.frames

    def close(self) -> None:
        self.sock.close()


def ping_frame(request_id: Any) -> bytes:
    return orjson.dumps({"op": "ping", "id": request_id})


async def test_pipelined_frames_cut_anywhere_are_answered_in_order(gateway: RunningGateway) -> None:
    client = await RawClient.open(gateway)
    try:
        stream = b"".join(
            [
                *client_frames(*(Frame(OP_TEXT, ping_frame(i)) for i in range(30))),
                # A control frame and a fragmented message between them: websockets' path.
                *client_frames(Frame(OP_PING, b"keepalive")),
                *client_frames(
                    Frame(OP_TEXT, ping_frame("frag")[:10], fin=False),
                    Frame(OP_CONT, ping_frame("frag")[10:]),
                ),
                *client_frames(*(Frame(OP_TEXT, ping_frame(i)) for i in range(30, 60))),
            ]
        )
        # Cut into pieces that split headers, masks and payloads.
        for start in range(0, len(stream), 5):
            await client.write(stream[start : start + 5])
        frames = await client.read_until(lambda got: len(got) >= 62)
        # The text frames took the fast path: the connection cut its stream into frames.
        [protocol] = [
            p for p in gateway.server.server_state.connections if isinstance(p, PushWebSocketProtocol)
        ]
        assert protocol.splitter is not None and not protocol.splitter.passthrough
    finally:
        client.close()
    pongs = [orjson.loads(f.data)["id"] for f in frames if f.opcode is OP_TEXT]
    assert pongs == [*range(30), "frag", *range(30, 60)]
    assert [f.data for f in frames if f.opcode is OP_PONG] == [b"keepalive"]


async def test_a_text_frame_that_is_not_utf8_closes_with_1007(gateway: RunningGateway) -> None:
    client = await RawClient.open(gateway)
    try:
        await client.write(b"".join(client_frames(Frame(OP_TEXT, ping_frame(1)))))
        await client.read_until(lambda got: len(got) >= 1)
        await client.write(b"".join(client_frames(Frame(OP_TEXT, b"\xff\xfe"))))
        await client.read_until(lambda got: False)
    finally:
        client.close()
    assert [orjson.loads(f.data)["id"] for f in client.frames if f.opcode is OP_TEXT] == [1]
    assert client.protocol.close_rcvd is not None
    assert client.protocol.close_rcvd.code == 1007


async def test_texts_the_fast_path_queued_reach_asgi_receive_as_events() -> None:
    # The push handler takes them as strings (TextSource); any other app's receive() gets
    # the websocket.receive events uvicorn would have queued, in order with the others.
    inbox = Inbox()
    inbox.put_nowait("hello")
    inbox.put_nowait({"type": "websocket.disconnect", "code": 1000})
    assert await inbox.get() == {"type": "websocket.receive", "text": "hello"}
    assert await inbox.get() == {"type": "websocket.disconnect", "code": 1000}
    assert inbox.empty()
