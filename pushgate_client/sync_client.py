"""The blocking client: the same calls as :class:`~pushgate_client.AsyncClient`, for scripts
and threads. Subscriptions use ``websockets.sync`` and httpx's blocking streams."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator, Sequence
from typing import Any, Literal

import httpx
import orjson
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from . import http_api as api
from .backoff import Backoff
from .errors import ConnectionEnded, PushgateError
from .models import Message, SendResult, message_json
from .sse import SseParser


class Client:
    """``with Client(url, token) as client: client.send("q", "hi")``."""

    def __init__(self, url: str, token: str, *, timeout: float = 30.0, verify: bool = True) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.http = httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {token}"}, timeout=timeout, verify=verify
        )

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()

    def _call(self, call: api.Call) -> Any:
        return api.check(self.http.request(call.method, call.path, json=call.json))

    def create_queue(self, name: str, **attributes: Any) -> dict[str, Any]:
        result: dict[str, Any] = self._call(api.create_queue(name, attributes))
        return result

    def send(self, queue: str, body: str | bytes, **options: Any) -> SendResult:
        return api.read_send(self._call(api.send(queue, message_json(body, **options))))

    def send_batch(
        self, queue: str, entries: Sequence[str | bytes | dict[str, Any]]
    ) -> list[SendResult | PushgateError]:
        return api.read_batch(self._call(api.send_batch(queue, entries)))

    def receive(
        self, queue: str, max_messages: int = 1, wait_s: float = 0, visibility_timeout_s: float | None = None
    ) -> list[Message]:
        return api.read_messages(
            queue, self._call(api.receive(queue, max_messages, wait_s, visibility_timeout_s))
        )

    def ack(self, queue: str, receipts: Sequence[str]) -> dict[str, Any]:
        result: dict[str, Any] = self._call(api.ack(queue, receipts))
        return result

    def nack(self, queue: str, receipts: Sequence[str], delay_s: float = 0) -> dict[str, Any]:
        result: dict[str, Any] = self._call(api.nack(queue, receipts, delay_s))
        return result

    def subscribe(
        self,
        queue: str,
        *,
        transport: Literal["ws", "sse"] = "ws",
        prefetch: int = 10,
        ack: Literal["manual", "auto"] = "manual",
        batch: int = 1,
        visibility_timeout_s: float | None = None,
        reconnect: bool = True,
        backoff: Backoff | None = None,
    ) -> Subscription:
        """An iterator of messages that reconnects (with backoff) when it may."""
        return Subscription(
            self,
            queue,
            transport,
            prefetch,
            ack,
            batch,
            visibility_timeout_s,
            reconnect,
            backoff or Backoff(),
        )


class Subscription:
    """Blocking iterator over pushed messages; ``ack()`` what you processed."""

    def __init__(
        self,
        client: Client,
        queue: str,
        transport: str,
        prefetch: int,
        ack: str,
        batch: int,
        visibility_timeout_s: float | None,
        reconnect: bool,
        backoff: Backoff,
    ) -> None:
        self.client = client
        self.queue = queue
        self.transport = transport
        self.prefetch = prefetch
        self.ack_mode = ack
        self.batch = batch
        self.visibility_timeout_s = visibility_timeout_s
        self.reconnect = reconnect
        self.backoff = backoff
        self.pending: deque[Message] = deque()
        self.ws: ClientConnection | None = None
        self.parser = SseParser()
        self.sse: Iterator[str] | None = None
        self._sse_response: Any = None
        self.closed = False
        self.connects = 0

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __iter__(self) -> Subscription:
        return self

    def __next__(self) -> Message:
        while not self.pending:
            if self.closed:
                raise StopIteration
            try:
                if self.transport == "sse":
                    self._read_sse()
                else:
                    self._read_ws()
                self.backoff.reset()
            except ConnectionClosed as exc:
                self.ws = None
                received = exc.rcvd
                self._after_close(received.code if received else 1006, received.reason if received else "")
            except (OSError, InvalidStatus, TimeoutError, httpx.TransportError) as exc:
                self._drop()
                self._after_close(1006, str(exc))
            except PushgateError:
                self.close()  # the subscription was refused: nothing more will come
                raise
        return self.pending.popleft()

    def _after_close(self, code: int, reason: str) -> None:
        if self.closed:
            raise StopIteration
        if not self.reconnect or not api.should_reconnect(code):
            raise ConnectionEnded(code, reason, api.should_reconnect(code))
        time.sleep(self.backoff.next_delay())

    def _read_ws(self) -> None:
        if self.ws is None:
            self.ws = connect(
                api.ws_url(self.client.url),
                subprotocols=["pushgate.v1"],  # type: ignore[list-item]
                additional_headers={"Authorization": f"Bearer {self.client.token}"},
                max_size=None,
                compression=None,  # small JSON frames: deflate costs more than it saves
            ).__enter__()  # websockets >= 17.1 warns unless entered; works on older ones too
            frame = api.subscribe_frame(
                self.queue, self.prefetch, self.ack_mode, self.batch, self.visibility_timeout_s
            )
            self.ws.send(orjson.dumps(frame).decode())
            self.connects += 1
        self.pending.extend(api.read_push_frame(self.ws.recv()))

    def _read_sse(self) -> None:
        if self.sse is None:
            headers = {"Accept": "text/event-stream"}
            if self.parser.last_event_id:
                headers["Last-Event-ID"] = self.parser.last_event_id
            self._sse_response = self.client.http.stream(
                "GET",
                f"/v1/queues/{self.queue}/events",
                params=api.sse_params(self.prefetch, self.ack_mode, self.visibility_timeout_s),
                headers=headers,
                timeout=httpx.Timeout(self.client.http.timeout.connect, read=None),
            )
            response = self._sse_response.__enter__()
            if response.status_code != 200:
                response.read()
                self._drop()
                error = PushgateError.from_problem(response.status_code, _json_or_none(response))
                if response.status_code < 500:
                    raise error
                raise OSError(str(error))
            self.sse = response.iter_text()
            self.connects += 1
        assert self.sse is not None
        try:
            chunk = next(self.sse)
        except StopIteration:
            self._drop()
            self._after_close(1006, "stream ended")
            return
        for event in self.parser.feed(chunk):
            if event.event == "message":
                self.pending.append(Message.from_json(self.queue, orjson.loads(event.data), event.id))
            elif event.event == "close":
                code, reason, _ = api.read_sse_close(event.data)
                self._drop()
                self._after_close(code, reason)
                return

    def _drop(self) -> None:
        if self.ws is not None:
            self.ws.close()
            self.ws = None
        response, self._sse_response, self.sse = self._sse_response, None, None
        if response is not None:
            response.__exit__(None, None, None)

    def ack(self, *messages: Message) -> None:
        if not messages:
            return
        receipts = [m.receipt for m in messages]
        if self.transport == "sse":
            self.client.ack(self.queue, receipts)
        elif self.ws is not None:
            try:
                self.ws.send(orjson.dumps({"op": "ack", "receipts": receipts}).decode())
            except ConnectionClosed:
                self.ws = None

    def close(self) -> None:
        self.closed = True
        self._drop()


def _json_or_none(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return None
