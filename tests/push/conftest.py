"""A real gateway (uvicorn on an ephemeral port, embedded LMDB) with push settings made
small enough for tests, plus async helpers: HTTP through httpx, WebSockets through the
``websockets`` library, SSE through httpx streaming. Nothing is mocked.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import itertools
import time
import weakref
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import httpx
import orjson
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from backend_store.tested_versions import ReleaseCheck
from push.engine import PushEngine
from push.settings import PushSettings
from tests.conftest import scaled
from tests.fixtures.dev_cluster import StoreTarget
from tests.gateway.conftest import RunningGateway, start_gateway

# Small enough to keep the suite quick, never so small that one round trip on a loaded
# machine (seconds, with CPU and fsync hogs beside it) outlasts a window a test relies on:
# a client must authenticate and resume within these, so they are seconds (docs/testing.md).
TEST_SETTINGS = PushSettings(
    auth_timeout_s=2.0,
    ping_interval_s=0.3,
    sse_retry_ms=100,
    sse_resume_grace_s=2.0,
    send_buffer_bytes=256 * 1024,
    write_timeout_s=1.0,
    watchdog_interval_s=0.1,
    recheck_interval_s=0.5,
    max_frame_bytes=64 * 1024,
    safety_poll_s=1.0,
)
_names = itertools.count()


def engine_of(gateway: RunningGateway) -> PushEngine:
    return gateway.services.engine


def start_push_gateway(
    tmp: Any,
    port: int = 0,
    target: StoreTarget | None = None,
    releases: ReleaseCheck | None = None,
    **settings: Any,
) -> RunningGateway:
    """A gateway whose engine is built with :data:`TEST_SETTINGS` changed by ``settings``."""
    return start_gateway(tmp, port, target, releases, push=replace(TEST_SETTINGS, **settings))


# A uvicorn release the WebSocket fast path was not tested with.
UNTESTED_UVICORN = "0.99.0"
# The doors a WebSocket comes in by (gateway/ws_protocol.py), by what the gateway is told is
# installed: the installed releases (the fast path), or an untested uvicorn (its public
# protocol, reaching the same push handler): what any release but the tested ones runs.
WEBSOCKET_DOORS: dict[str, Callable[[], ReleaseCheck]] = {
    "fast-path": ReleaseCheck,
    "public-doors": lambda: ReleaseCheck(
        lambda d: UNTESTED_UVICORN if d == "uvicorn" else importlib.metadata.version(d)
    ),
}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A module marked ``websocket_doors`` runs its tests on both doors."""
    if "websocket_doors" in metafunc.fixturenames and metafunc.definition.get_closest_marker(
        "websocket_doors"
    ):
        metafunc.parametrize("websocket_doors", list(WEBSOCKET_DOORS), indirect=True, scope="module")


@pytest.fixture(scope="module")
def websocket_doors(request: pytest.FixtureRequest) -> ReleaseCheck:
    """What a test's gateways choose their WebSocket protocol by (the fast path unless the
    module is marked ``websocket_doors``, which runs each test on both)."""
    return WEBSOCKET_DOORS[getattr(request, "param", "fast-path")]()


@pytest.fixture(scope="module")
def gateway(
    tmp_path_factory: pytest.TempPathFactory, store_target: StoreTarget, websocket_doors: ReleaseCheck
) -> Iterator[RunningGateway]:
    running = start_push_gateway(
        tmp_path_factory.mktemp("push"), target=store_target, releases=websocket_doors
    )
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def qname() -> str:
    return f"pq{next(_names)}-{time.monotonic_ns() % 10**9}"


@dataclass
class Http:
    """Async HTTP helpers holding one token."""

    client: httpx.AsyncClient

    async def queue(self, name: str, **attributes: Any) -> str:
        response = await self.client.put(f"/v1/queues/{name}", json=attributes)
        assert response.status_code in (200, 201), response.text
        return name

    async def send(self, queue: str, body: str = "hello", **fields: Any) -> dict[str, Any]:
        response = await self.client.post(f"/v1/queues/{queue}/messages", json={"body": body, **fields})
        assert response.status_code == 201, response.text
        result: dict[str, Any] = response.json()
        return result

    async def send_many(self, queue: str, bodies: list[str], **fields: Any) -> None:
        for start in range(0, len(bodies), 100):
            batch = [{"body": b, **fields} for b in bodies[start : start + 100]]
            response = await self.client.post(f"/v1/queues/{queue}/messages", json={"messages": batch})
            assert response.status_code == 200, response.text
            assert all("error" not in r for r in response.json()["results"])

    async def ack(self, queue: str, receipts: list[str]) -> dict[str, Any]:
        response = await self.client.post(f"/v1/queues/{queue}/ack", json={"receipts": receipts})
        assert response.status_code == 200, response.text
        result: dict[str, Any] = response.json()
        return result

    async def stats(self, queue: str) -> dict[str, Any]:
        response = await self.client.get(f"/v1/queues/{queue}")
        assert response.status_code == 200, response.text
        stats: dict[str, Any] = response.json()["stats"]
        return stats

    async def token(self, scope: str | None = None, ttl_s: float = 900) -> str:
        body: dict[str, Any] = {"ttl_s": ttl_s}
        if scope is not None:
            body["scope"] = scope
        response = await self.client.post("/v1/tokens", json=body)
        assert response.status_code == 201, response.text
        token: str = response.json()["token"]
        return token


@pytest.fixture
async def http(gateway: RunningGateway) -> AsyncIterator[Http]:
    headers = {"Authorization": f"Bearer {gateway.admin_key}"}
    async with httpx.AsyncClient(base_url=gateway.url, headers=headers, timeout=scaled(30)) as client:
        yield Http(client)


def ws_url(gateway: RunningGateway, query: str = "") -> str:
    return gateway.url.replace("http", "ws", 1) + "/v1/ws" + (f"?{query}" if query else "")


def ws_connect(gateway: RunningGateway, token: str | None = None, **kwargs: Any) -> Any:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return connect(
        ws_url(gateway, kwargs.pop("query", "")),
        subprotocols=kwargs.pop("subprotocols", ["pushgate.v1"]),
        additional_headers=headers,
        open_timeout=scaled(10),
        **kwargs,
    )


async def send_frame(ws: ClientConnection, **fields: Any) -> None:
    await ws.send(orjson.dumps(fields).decode())


# Frames that came while request() waited for its reply (a delivery may overtake the ok
# of the nack that caused it), kept for the next recv_frame / deliveries of that socket.
_STASHED: weakref.WeakKeyDictionary[ClientConnection, deque[dict[str, Any]]] = weakref.WeakKeyDictionary()


async def _next_frame(ws: ClientConnection) -> dict[str, Any]:
    stash = _STASHED.get(ws)
    if stash:
        return stash.popleft()
    frame: dict[str, Any] = orjson.loads(await ws.recv())
    return frame


async def recv_frame(ws: ClientConnection, timeout: float = 5.0) -> dict[str, Any]:
    async with asyncio.timeout(scaled(timeout)):
        return await _next_frame(ws)


async def request(ws: ClientConnection, **fields: Any) -> dict[str, Any]:
    """Send a frame with an id and return its reply; other frames wait for the next read."""
    await send_frame(ws, **fields)
    skipped: list[dict[str, Any]] = []
    try:
        while True:
            frame = await recv_frame(ws)
            if frame.get("id") == fields.get("id") and frame["op"] in ("ok", "error", "pong"):
                return frame
            skipped.append(frame)
    finally:
        if skipped:
            _STASHED.setdefault(ws, deque()).extendleft(reversed(skipped))


async def deliveries(ws: ClientConnection, count: int, timeout: float = 10.0) -> list[dict[str, Any]]:
    """Read frames until ``count`` messages arrived (from message or messages frames)."""
    got: list[dict[str, Any]] = []
    async with asyncio.timeout(scaled(timeout)):
        while len(got) < count:
            frame = await _next_frame(ws)
            if frame["op"] == "message":
                got.append(frame["message"])
            elif frame["op"] == "messages":
                got.extend(frame["messages"])
    return got


async def nothing_more(ws: ClientConnection, within: float = 0.3) -> None:
    """Assert that no delivery arrives within a short window (a wait on the socket, not a sleep)."""
    try:
        async with asyncio.timeout(within):
            while True:
                frame = orjson.loads(await ws.recv())
                assert frame["op"] not in ("message", "messages"), f"unexpected delivery {frame}"
    except TimeoutError:
        pass


async def closed_with(ws: ClientConnection, timeout: float = 5.0) -> int:
    """Read until the server closes; return the close code."""
    async with asyncio.timeout(scaled(timeout)):
        try:
            async for _ in ws:
                pass
        except ConnectionClosed:
            pass
    assert ws.close_code is not None
    return ws.close_code


async def poll(predicate: Any, timeout: float = 5.0, what: str = "condition") -> None:
    deadline = time.monotonic() + scaled(timeout)
    while not await predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


class SseReader:
    """Events of one SSE response, parsed as a browser's EventSource does, by a reader task
    (so a timed-out wait never cancels the line iterator midway)."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self.comments: list[str] = []
        self.retry: list[str] = []
        self.events: asyncio.Queue[dict[str, str] | None] = asyncio.Queue()
        # Error responses are read whole by the test instead.
        self.task = (
            asyncio.get_running_loop().create_task(self._read()) if response.status_code == 200 else None
        )

    async def _read(self) -> None:
        fields: dict[str, str] = {}
        try:
            async for line in self.response.aiter_lines():
                if not line:
                    if "data" in fields or "event" in fields:
                        fields.setdefault("event", "message")
                        self.events.put_nowait(fields)
                    fields = {}
                elif line.startswith(":"):
                    self.comments.append(line[1:].strip())
                else:
                    name, _, value = line.partition(":")
                    value = value[1:] if value.startswith(" ") else value
                    if name == "retry":
                        self.retry.append(value)
                    else:
                        fields[name] = value
        except httpx.HTTPError:
            pass
        finally:
            self.events.put_nowait(None)

    async def next(self, timeout: float = 5.0) -> dict[str, str]:
        """The next event (``event`` defaults to ``message``); raises EOFError at the end."""
        async with asyncio.timeout(scaled(timeout)):
            event = await self.events.get()
        if event is None:
            self.events.put_nowait(None)
            raise EOFError("stream ended")
        return event

    async def messages(self, count: int, timeout: float = 10.0) -> list[dict[str, Any]]:
        got: list[dict[str, Any]] = []
        while len(got) < count:
            event = await self.next(timeout)
            assert event["event"] == "message", event
            got.append({"sse_id": event["id"], **orjson.loads(event["data"])})
        return got

    async def nothing_more(self, within: float = 0.3) -> None:
        try:
            event = await self.next(within)
        except TimeoutError:
            return
        raise AssertionError(f"unexpected event {event}")

    async def close(self) -> None:
        if self.task is None:
            return
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


@contextlib.asynccontextmanager
async def sse_stream(
    gateway: RunningGateway,
    queue: str,
    token: str | None,
    headers: dict[str, str] | None = None,
    **params: Any,
) -> AsyncIterator[SseReader]:
    all_headers = {"Accept": "text/event-stream", **(headers or {})}
    if token:
        all_headers["Authorization"] = f"Bearer {token}"
    async with (
        httpx.AsyncClient(base_url=gateway.url, timeout=scaled(30)) as client,
        client.stream("GET", f"/v1/queues/{queue}/events", params=params, headers=all_headers) as response,
    ):
        reader = SseReader(response)
        try:
            yield reader
        finally:
            await reader.close()
