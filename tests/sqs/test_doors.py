"""One queue, every door: what SQS sends, /v1 reads, and the other way round."""

from __future__ import annotations

import asyncio
import time

import httpx
from websockets.asyncio.client import connect
from websockets.typing import Subprotocol

from tests.gateway.conftest import RunningGateway
from tests.push.conftest import deliveries, request, sse_stream, ws_url
from tests.sqs.conftest import aws_credentials, sqs_client


def test_a_v1_send_is_read_by_receive_message_and_an_sqs_send_by_v1(gateway: RunningGateway) -> None:
    token, access_key_id, secret = aws_credentials(gateway, "admin send:* receive:*")
    sqs = sqs_client(gateway, access_key_id, secret)
    name = f"doors-{time.monotonic_ns() % 10**9}"
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    with httpx.Client(base_url=gateway.url, headers={"Authorization": f"Bearer {token}"}) as v1:
        sent = v1.post(f"/v1/queues/{name}/messages", json={"body": "from v1", "attributes": {"k": "v"}})
        assert sent.status_code == 201, sent.text
        got = sqs.receive_message(QueueUrl=url, MessageAttributeNames=["All"])["Messages"]
        assert [(m["Body"], m["MessageAttributes"]["k"]["StringValue"]) for m in got] == [("from v1", "v")]
        sqs.delete_message(QueueUrl=url, ReceiptHandle=got[0]["ReceiptHandle"])
        message_id = sqs.send_message(QueueUrl=url, MessageBody="from sqs")["MessageId"]
        pulled = v1.post(f"/v1/queues/{name}/receive", json={"wait_s": 0}).json()["messages"]
        assert [(m["id"], m["body"]) for m in pulled] == [(message_id, "from sqs")]


async def test_an_sqs_send_is_pushed_to_a_websocket_consumer(gateway: RunningGateway) -> None:
    token, access_key_id, secret = aws_credentials(gateway, "admin send:* receive:*")
    sqs = sqs_client(gateway, access_key_id, secret)
    name = f"pushed-{time.monotonic_ns() % 10**9}"
    url = await asyncio.to_thread(lambda: sqs.create_queue(QueueName=name)["QueueUrl"])
    async with connect(
        ws_url(gateway),
        subprotocols=[Subprotocol("pushgate.v1")],
        additional_headers={"Authorization": f"Bearer {token}"},
    ) as ws:
        assert (await request(ws, op="subscribe", queue=name, id=1))["op"] == "ok"
        message_id = await asyncio.to_thread(
            lambda: sqs.send_message(QueueUrl=url, MessageBody="to the browser")["MessageId"]
        )
        [pushed] = await deliveries(ws, 1)
        assert (pushed["id"], pushed["body"]) == (message_id, "to the browser")


async def test_a_fifo_queue_named_dot_fifo_works_on_every_door(gateway: RunningGateway) -> None:
    token, access_key_id, secret = aws_credentials(gateway, "admin send:* receive:*.fifo")
    sqs = sqs_client(gateway, access_key_id, secret)
    name = f"doors-{time.monotonic_ns() % 10**9}.fifo"

    def send(body: str) -> str:
        out = sqs.send_message(
            QueueUrl=url, MessageBody=body, MessageGroupId="g", MessageDeduplicationId=body
        )
        return str(out["MessageId"])

    url = await asyncio.to_thread(
        lambda: sqs.create_queue(QueueName=name, Attributes={"FifoQueue": "true"})["QueueUrl"]
    )
    # Long-poll on /v1: a wait that a send ends.
    async with httpx.AsyncClient(base_url=gateway.url, headers={"Authorization": f"Bearer {token}"}) as v1:
        queue = (await v1.get(f"/v1/queues/{name}")).json()
        assert (queue["name"], queue["attributes"]["ordering"]) == (name, "fifo")
        polling = asyncio.create_task(v1.post(f"/v1/queues/{name}/receive", json={"wait_s": 10}, timeout=30))
        first = await asyncio.to_thread(send, "one")
        [polled] = (await polling).json()["messages"]
        assert polled["id"] == first
        assert (await v1.post(f"/v1/queues/{name}/ack", json={"receipts": [polled["receipt"]]})).json()[
            "acked"
        ] == 1
        # SSE.
        second = await asyncio.to_thread(send, "two")
        async with sse_stream(gateway, name, token) as sse:
            [streamed] = await sse.messages(1)
        assert streamed["id"] == second
    # WebSocket (the SSE stream's message went back to the queue when the stream closed).
    async with connect(
        ws_url(gateway),
        subprotocols=[Subprotocol("pushgate.v1")],
        additional_headers={"Authorization": f"Bearer {token}"},
    ) as ws:
        assert (await request(ws, op="subscribe", queue=name, id=1))["op"] == "ok"
        [pushed] = await deliveries(ws, 1)
        assert (pushed["id"], pushed["body"]) == (second, "two")
