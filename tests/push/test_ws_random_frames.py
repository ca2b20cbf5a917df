"""Random WebSocket frames never make the server fail (issue 47): a property test (Hypothesis)
against a real gateway's ``/v1/ws``.

Each example opens an authenticated connection and sends one frame: an object with an ``op``
(one of the protocol's, or another) and the protocol's field names with random JSON values of
every type, or text that is not a JSON object at all. The server must answer with a protocol
frame (``ok``, ``error``, ``pong``) or close with a client-error code (4001, 4003, 4008,
4400, 1009), never 1011 (an unexpected server error) or a dropped connection.
"""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.exceptions import ConnectionClosed

from tests.conftest import scaled
from tests.gateway.conftest import RunningGateway

from .conftest import ws_connect

OPS = ["auth", "subscribe", "unsubscribe", "ack", "nack", "send", "ping", "pong", "other", ""]
FIELDS = ["id", "queue", "token", "prefetch", "ack", "visibility_timeout_s", "batch", "receipts", "delay_s"]
FIELDS += ["body", "attributes", "group_id", "dedupe_id", "messages", "body_base64"]
CLIENT_ERRORS = {4001, 4003, 4008, 4400, 1009}
QUEUE = f"wsfuzz-{time.monotonic_ns() % 10**9}"

scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=30)
    | st.just(QUEUE)
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=10,
)
frames = st.builds(
    lambda op, fields: json.dumps({"op": op, **fields}),
    st.sampled_from(OPS) | json_values,
    st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=6),
) | st.one_of(
    json_values.map(json.dumps),
    st.text(max_size=50),
)


async def _one_frame(gateway: RunningGateway, text: str) -> None:
    async with ws_connect(gateway, gateway.admin_key) as ws:
        await ws.send(text)
        try:
            async with asyncio.timeout(scaled(10)):
                while True:
                    reply = orjson.loads(await ws.recv())
                    # A subscribe may be followed by deliveries: the answer is what matters.
                    if reply.get("op") in ("ok", "error", "pong"):
                        if reply["op"] == "error":
                            assert isinstance(reply.get("code"), str), reply
                        return
                    assert reply.get("op") in ("message", "messages"), reply
        except ConnectionClosed as closed:
            assert closed.rcvd is not None and closed.rcvd.code in CLIENT_ERRORS, (text, closed.rcvd)


@pytest.mark.slow
def test_random_frames_get_a_protocol_answer_or_a_client_error_close(gateway: RunningGateway) -> None:
    created = httpx.put(
        f"{gateway.url}/v1/queues/{QUEUE}", json={}, headers={"Authorization": f"Bearer {gateway.admin_key}"}
    )
    assert created.status_code in (200, 201), created.text

    @given(text=frames)
    @settings(max_examples=150, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    def check(text: str) -> None:
        asyncio.run(_one_frame(gateway, text))

    check()
