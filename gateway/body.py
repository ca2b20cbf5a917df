"""Reading JSON request bodies and writing JSON responses.

The body is streamed and counted, so an oversized request is refused with
``413 request_too_large`` before it is held whole in memory; a declared
``Content-Length`` past the cap is refused before reading anything.
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from backend_store.errors import InvalidRequest

from .errors import RequestTooLarge, UnsupportedMediaType

# Small bodies (queue attributes, receive and ack parameters) need far less than a send.
SMALL_BODY_BYTES = 256 * 1024


def _is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


async def read_body(request: Request, limit: int) -> bytes:
    """The raw body, at most ``limit`` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            if int(declared) > limit:
                raise RequestTooLarge(f"request body is larger than {limit} bytes")
        except ValueError:
            raise InvalidRequest("bad Content-Length") from None
    # ASGI messages read directly: Request.stream() is an async generator, a measurable
    # cost on small requests, and the body is read once here anyway.
    chunks: list[bytes] = []
    total = 0
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        chunk: bytes = message.get("body", b"")
        total += len(chunk)
        if total > limit:
            raise RequestTooLarge(f"request body is larger than {limit} bytes")
        if not message.get("more_body", False):
            if not chunks:
                return chunk
            chunks.append(chunk)
            return b"".join(chunks)
        chunks.append(chunk)


async def read_json(request: Request, limit: int = SMALL_BODY_BYTES, *, required: bool = True) -> Any:
    """The body parsed as JSON.

    With ``required=False`` an empty body (and no content type) reads as ``{}``, so
    ``POST .../receive`` with no body means "the defaults", as SQS clients expect.
    """
    content_type = request.headers.get("content-type")
    if content_type is not None and not _is_json(content_type):
        raise UnsupportedMediaType("the request body must be application/json")
    raw = await read_body(request, limit)
    if not raw or raw.isspace():  # no copy of a large body just to look at it
        if required:
            raise InvalidRequest("a JSON body is required")
        return {}
    if content_type is None:
        raise UnsupportedMediaType("the request body must be application/json")
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise InvalidRequest("the request body is not valid JSON") from None


async def read_object(
    request: Request, limit: int = SMALL_BODY_BYTES, *, required: bool = True
) -> dict[str, Any]:
    """The body as a JSON object; anything else is ``400 invalid_request``."""
    doc = await read_json(request, limit, required=required)
    if not isinstance(doc, dict):
        raise InvalidRequest("the request body must be a JSON object")
    return doc


def check_fields(doc: dict[str, Any], allowed: frozenset[str]) -> None:
    unknown = set(doc) - allowed
    if unknown:
        raise InvalidRequest(f"unknown field: {', '.join(sorted(unknown))}")


class JSONResponse(Response):
    """A response serialized with orjson (several times faster than the stdlib on our payloads)."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)
