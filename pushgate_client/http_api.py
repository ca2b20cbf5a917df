"""The HTTP requests both client flavours make, as data: method, path, JSON and how to read
the answer. The async and sync clients only differ in who performs the request."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from .errors import PushgateError
from .models import Message, SendResult, message_json

NO_RECONNECT_CLOSE_CODES = frozenset({1000, 1002, 1003, 1007, 1008, 1009, 1010, 4001, 4003, 4400})


def should_reconnect(code: int) -> bool:
    """Mirror of the server's close-code table (push/close_codes.py): auth, scope and
    malformed-frame closes need a fix first; going away, policy and lost connections do not."""
    return code not in NO_RECONNECT_CLOSE_CODES


@dataclass(frozen=True, slots=True)
class Call:
    method: str
    path: str
    json: Any = None


def check(response: httpx.Response) -> Any:
    """The JSON of a 2xx answer, or the problem document raised as :class:`PushgateError`."""
    if response.status_code >= 400:
        try:
            doc = response.json()
        except ValueError:
            doc = None
        raise PushgateError.from_problem(response.status_code, doc)
    if response.status_code == 204 or not response.content:
        return None
    return response.json()


def entry_json(entry: str | bytes | dict[str, Any]) -> dict[str, Any]:
    return entry if isinstance(entry, dict) else message_json(entry)


def create_queue(name: str, attributes: dict[str, Any]) -> Call:
    return Call("PUT", f"/v1/queues/{name}", attributes)


def send(queue: str, doc: dict[str, Any]) -> Call:
    return Call("POST", f"/v1/queues/{queue}/messages", doc)


def send_batch(queue: str, entries: Sequence[str | bytes | dict[str, Any]]) -> Call:
    return Call("POST", f"/v1/queues/{queue}/messages", {"messages": [entry_json(e) for e in entries]})


def receive(queue: str, max_messages: int, wait_s: float, visibility_timeout_s: float | None) -> Call:
    doc: dict[str, Any] = {"max": max_messages, "wait_s": wait_s}
    if visibility_timeout_s is not None:
        doc["visibility_timeout_s"] = visibility_timeout_s
    return Call("POST", f"/v1/queues/{queue}/receive", doc)


def ack(queue: str, receipts: Sequence[str]) -> Call:
    return Call("POST", f"/v1/queues/{queue}/ack", {"receipts": list(receipts)})


def nack(queue: str, receipts: Sequence[str], delay_s: float) -> Call:
    return Call("POST", f"/v1/queues/{queue}/nack", {"receipts": list(receipts), "delay_s": delay_s})


def read_send(doc: Any) -> SendResult:
    result = SendResult.from_json(doc)
    assert isinstance(result, SendResult)
    return result


def read_batch(doc: Any) -> list[SendResult | PushgateError]:
    return [SendResult.from_json(r) for r in doc["results"]]


def read_messages(queue: str, doc: Any) -> list[Message]:
    return [Message.from_json(queue, m) for m in doc["messages"]]


def subscribe_frame(
    queue: str, prefetch: int, ack_mode: str, batch: int, visibility_timeout_s: float | None
) -> dict[str, Any]:
    frame: dict[str, Any] = {
        "op": "subscribe",
        "id": "subscribe",
        "queue": queue,
        "prefetch": prefetch,
        "ack": ack_mode,
        "batch": batch,
    }
    if visibility_timeout_s is not None:
        frame["visibility_timeout_s"] = visibility_timeout_s
    return frame


def sse_params(prefetch: int, ack_mode: str, visibility_timeout_s: float | None) -> dict[str, Any]:
    params: dict[str, Any] = {"prefetch": prefetch, "ack": ack_mode}
    if visibility_timeout_s is not None:
        params["visibility_timeout_s"] = visibility_timeout_s
    return params


def ws_url(base_url: str) -> str:
    return base_url.replace("http", "ws", 1).rstrip("/") + "/v1/ws"


def read_push_frame(raw: str | bytes) -> list[Message]:
    """Messages of a server frame on a subscription connection; errors raise; the rest is ignored."""
    frame = orjson.loads(raw)
    op = frame.get("op")
    if op == "message":
        return [Message.from_json(frame["queue"], frame["message"])]
    if op == "messages":
        queue = frame["queue"]
        return [Message.from_json(queue, m) for m in frame["messages"]]
    if op == "error" and (frame.get("queue") is not None or frame.get("id") == "subscribe"):
        raise PushgateError(str(frame.get("code")), str(frame.get("message", "")))
    return []


def read_sse_close(data: str) -> tuple[int, str, bool]:
    doc = orjson.loads(data)
    return int(doc.get("code", 1000)), str(doc.get("reason", "")), bool(doc.get("reconnect", False))
