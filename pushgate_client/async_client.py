"""The asyncio client: HTTP calls through httpx, push subscriptions over WebSocket or SSE
with automatic reconnect and backoff, and a pipelining WebSocket producer."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import deque
from collections.abc import Sequence
from types import TracebackType
from typing import Any, Literal

import httpx
import orjson
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from . import http_api as api
from .backoff import Backoff
from .errors import ConnectionEnded, PushgateError
from .models import Message, SendResult, message_json
from .sse import SseParser

Transport = Literal["ws", "sse"]


class AsyncClient:
    """``async with AsyncClient(url, token) as client: await client.send("q", "hi")``."""

    def __init__(self, url: str, token: str, *, timeout: float = 30.0, verify: bool = True) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.http = httpx.AsyncClient(
            base_url=self.url, headers={"Authorization": f"Bearer {token}"}, timeout=timeout, verify=verify
        )

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self.http.aclose()

    async def _call(self, call: api.Call) -> Any:
        return api.check(await self.http.request(call.method, call.path, json=call.json))

    async def create_queue(self, name: str, **attributes: Any) -> dict[str, Any]:
        result: dict[str, Any] = await self._call(api.create_queue(name, attributes))
        return result

    async def send(self, queue: str, body: str | bytes, **options: Any) -> SendResult:
        return api.read_send(await self._call(api.send(queue, message_json(body, **options))))

    async def send_batch(
        self, queue: str, entries: Sequence[str | bytes | dict[str, Any]]
    ) -> list[SendResult | PushgateError]:
        return api.read_batch(await self._call(api.send_batch(queue, entries)))

    async def receive(
        self, queue: str, max_messages: int = 1, wait_s: float = 0, visibility_timeout_s: float | None = None
    ) -> list[Message]:
        doc = await self._call(api.receive(queue, max_messages, wait_s, visibility_timeout_s))
        return api.read_messages(queue, doc)

    async def ack(self, queue: str, receipts: Sequence[str]) -> dict[str, Any]:
        result: dict[str, Any] = await self._call(api.ack(queue, receipts))
        return result

    async def nack(self, queue: str, receipts: Sequence[str], delay_s: float = 0) -> dict[str, Any]:
        result: dict[str, Any] = await self._call(api.nack(queue, receipts, delay_s))
        return result

    def subscribe(
        self,
        queue: str,
        *,
        transport: Transport = "ws",
        prefetch: int = 10,
        ack: Literal["manual", "auto"] = "manual",
        batch: int = 1,
        visibility_timeout_s: float | None = None,
        reconnect: bool = True,
        backoff: Backoff | None = None,
    ) -> AsyncSubscription:
        """An async iterator of messages that reconnects (with backoff) when it may."""
        options = _Options(queue, prefetch, ack, batch, visibility_timeout_s, reconnect, backoff or Backoff())
        if transport == "sse":
            return AsyncSseSubscription(self, options)
        return AsyncWsSubscription(self, options)

    def producer(self) -> AsyncWsProducer:
        """A WebSocket for pipelined sends: many in flight, each answered by id."""
        return AsyncWsProducer(self)

    def _ws_connect(self, **kwargs: Any) -> Any:
        return connect(
            api.ws_url(self.url),
            subprotocols=["pushgate.v1"],  # type: ignore[list-item]
            additional_headers={"Authorization": f"Bearer {self.token}"},
            max_size=None,
            # Small JSON frames: deflate costs more CPU on both ends than it saves.
            compression=None,
            **kwargs,
        )


class _Options:
    __slots__ = ("ack", "backoff", "batch", "prefetch", "queue", "reconnect", "visibility_timeout_s")

    def __init__(
        self,
        queue: str,
        prefetch: int,
        ack: str,
        batch: int,
        visibility_timeout_s: float | None,
        reconnect: bool,
        backoff: Backoff,
    ) -> None:
        self.queue = queue
        self.prefetch = prefetch
        self.ack = ack
        self.batch = batch
        self.visibility_timeout_s = visibility_timeout_s
        self.reconnect = reconnect
        self.backoff = backoff


class AsyncSubscription:
    """Common part: a buffer of received messages and the reconnect decision."""

    def __init__(self, client: AsyncClient, options: _Options) -> None:
        self.client = client
        self.options = options
        self.pending: deque[Message] = deque()
        self.closed = False
        self.connects = 0

    def __aiter__(self) -> AsyncSubscription:
        return self

    async def __anext__(self) -> Message:
        raise NotImplementedError

    async def __aenter__(self) -> AsyncSubscription:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        self.closed = True

    async def ack(self, *messages: Message) -> None:
        raise NotImplementedError

    async def _after_close(self, code: int, reason: str) -> None:
        """Wait before reconnecting, or end the iteration with the reason."""
        if self.closed:
            raise StopAsyncIteration
        if not self.options.reconnect or not api.should_reconnect(code):
            raise ConnectionEnded(code, reason, api.should_reconnect(code))
        await asyncio.sleep(self.options.backoff.next_delay())


class AsyncWsSubscription(AsyncSubscription):
    def __init__(self, client: AsyncClient, options: _Options) -> None:
        super().__init__(client, options)
        self.ws: ClientConnection | None = None

    async def _connect(self) -> ClientConnection:
        o = self.options
        ws: ClientConnection = await self.client._ws_connect()
        frame = api.subscribe_frame(o.queue, o.prefetch, o.ack, o.batch, o.visibility_timeout_s)
        # Text frames: pushgate.v1 is JSON text; a binary frame is closed with 4400.
        await ws.send(orjson.dumps(frame).decode())
        self.connects += 1
        return ws

    async def __anext__(self) -> Message:
        while not self.pending:
            if self.closed:
                raise StopAsyncIteration
            try:
                if self.ws is None:
                    self.ws = await self._connect()
                self.pending.extend(api.read_push_frame(await self.ws.recv()))
                self.options.backoff.reset()
            except ConnectionClosed as exc:
                self.ws = None
                received = exc.rcvd
                await self._after_close(
                    received.code if received else 1006, received.reason if received else ""
                )
            except (OSError, InvalidStatus, TimeoutError) as exc:
                self.ws = None
                await self._after_close(1006, str(exc))
            except PushgateError:
                await self.close()  # the subscription was refused: nothing more will come
                raise
        return self.pending.popleft()

    async def ack(self, *messages: Message) -> None:
        """Ack without waiting for an answer; after a reconnect the old receipts are void anyway."""
        if self.ws is not None and messages:
            with contextlib.suppress(ConnectionClosed):
                await self.ws.send(
                    orjson.dumps({"op": "ack", "receipts": [m.receipt for m in messages]}).decode()
                )

    async def nack(self, *messages: Message, delay_s: float = 0) -> None:
        if self.ws is not None and messages:
            frame = {"op": "nack", "receipts": [m.receipt for m in messages], "delay_s": delay_s}
            with contextlib.suppress(ConnectionClosed):
                await self.ws.send(orjson.dumps(frame).decode())

    async def close(self) -> None:
        self.closed = True
        if self.ws is not None:
            await self.ws.close()
            self.ws = None


class AsyncSseSubscription(AsyncSubscription):
    def __init__(self, client: AsyncClient, options: _Options) -> None:
        super().__init__(client, options)
        self.parser = SseParser()
        self.stream: Any = None
        self.response: httpx.Response | None = None
        self.chunks: Any = None

    async def _open(self) -> None:
        o = self.options
        headers = {"Accept": "text/event-stream"}
        if self.parser.last_event_id:
            headers["Last-Event-ID"] = self.parser.last_event_id
        self.stream = self.client.http.stream(
            "GET",
            f"/v1/queues/{o.queue}/events",
            params=api.sse_params(o.prefetch, o.ack, o.visibility_timeout_s),
            headers=headers,
            timeout=httpx.Timeout(self.client.http.timeout.connect, read=None),
        )
        response: httpx.Response = await self.stream.__aenter__()
        if response.status_code != 200:
            await response.aread()
            await self._drop()
            error = PushgateError.from_problem(response.status_code, _json_or_none(response))
            if response.status_code < 500:
                raise error
            raise OSError(str(error))
        self.response = response
        self.chunks = response.aiter_text()
        self.connects += 1

    async def _drop(self) -> None:
        stream, self.stream, self.response, self.chunks = self.stream, None, None, None
        if stream is not None:
            await stream.__aexit__(None, None, None)

    async def __anext__(self) -> Message:
        while not self.pending:
            if self.closed:
                raise StopAsyncIteration
            try:
                if self.stream is None:
                    await self._open()
                chunk = await self.chunks.__anext__()
            except StopAsyncIteration:
                await self._drop()
                await self._after_close(1006, "stream ended")
                continue
            except (OSError, httpx.TransportError) as exc:
                await self._drop()
                await self._after_close(1006, str(exc))
                continue
            for event in self.parser.feed(chunk):
                if event.event == "message":
                    self.pending.append(
                        Message.from_json(self.options.queue, orjson.loads(event.data), event.id)
                    )
                elif event.event == "close":
                    code, reason, _ = api.read_sse_close(event.data)
                    await self._drop()
                    await self._after_close(code, reason)
                    break
            self.options.backoff.reset()
        return self.pending.popleft()

    async def ack(self, *messages: Message) -> None:
        if messages:
            await self.client.ack(self.options.queue, [m.receipt for m in messages])

    async def close(self) -> None:
        self.closed = True
        await self._drop()


def _json_or_none(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return None


class AsyncWsProducer:
    """Pipelined sends over one WebSocket: ``await producer.send(...)`` waits for its ``ok``;
    ``await producer.submit(...)`` returns a future at once, so many can be outstanding."""

    def __init__(self, client: AsyncClient) -> None:
        self.client = client
        self.ws: ClientConnection | None = None
        self._ids = itertools.count()
        self._waiting: dict[int, asyncio.Future[Any]] = {}
        self._reader: asyncio.Task[None] | None = None

    async def __aenter__(self) -> AsyncWsProducer:
        self.ws = await self.client._ws_connect()
        self._reader = asyncio.get_running_loop().create_task(self._read())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.ws is not None:
            await self.ws.close()
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)

    async def _read(self) -> None:
        assert self.ws is not None
        try:
            async for raw in self.ws:
                frame = orjson.loads(raw)
                future = self._waiting.pop(frame.get("id"), None)
                if future is None or future.done():
                    continue
                if frame["op"] == "error":
                    future.set_exception(PushgateError(frame["code"], frame.get("message", "")))
                else:
                    future.set_result(frame)
        except ConnectionClosed:
            pass
        finally:
            for future in self._waiting.values():
                if not future.done():
                    future.set_exception(PushgateError("connection_closed", "the producer connection closed"))
            self._waiting.clear()

    async def submit(self, queue: str, body: str | bytes, **options: Any) -> asyncio.Future[Any]:
        """Write a send frame and return a future of the server's ``ok`` frame, without
        waiting for it: submit many, then gather."""
        assert self.ws is not None, "use the producer as an async context manager"
        request_id = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting[request_id] = future
        frame = {"op": "send", "id": request_id, "queue": queue, **message_json(body, **options)}
        await self.ws.send(orjson.dumps(frame).decode())
        return future

    async def send(self, queue: str, body: str | bytes, **options: Any) -> SendResult:
        frame = await (await self.submit(queue, body, **options))
        return api.read_send(frame["result"])
