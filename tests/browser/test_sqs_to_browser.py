"""Issue 26's "done when": an SQS application's queue consumed by a browser.

A backend fills queues with boto3, unchanged but for ``endpoint_url`` and credentials (AWS JSON
1.0, SigV4); a page in headless Chromium on the tenant's allowed origin imports the JavaScript
client from the gateway and consumes them over WebSocket, acking what it gets; the backend then
sees them gone through the SQS API (GetQueueAttributes, ReceiveMessage). A FIFO queue (its name
ends in ``.fifo``, as SQS requires) keeps each group's order on the way to the page.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest
from playwright.sync_api import Browser, Page

from tests.sqs.conftest import aws_credentials, sqs_client

from .conftest import TENANT, PageServer, WebGateway
from .test_js_client import START_CONSUMER, open_page, wait_in_page


@pytest.fixture
def backend(web: WebGateway) -> Any:
    """The SQS application's client: boto3 with credentials of tenant ``web``."""
    _, access_key_id, secret = aws_credentials(web.gateway, "admin send:* receive:*", tenant=TENANT)
    return sqs_client(web.gateway, access_key_id, secret)


@pytest.fixture
def page(chromium: Browser, page_server: PageServer) -> Generator[Page, None, None]:
    yield from open_page(chromium, page_server.allowed)


def _consume(page: Page, web: WebGateway, queue: str) -> None:
    transport = page.evaluate(
        START_CONSUMER, {"gw": web.url, "queue": queue, "token": {"key": web.key}, "options": {}}
    )
    assert transport == "websocket"


def _gone(backend: Any, url: str) -> None:
    attributes = backend.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert (
        attributes["ApproximateNumberOfMessages"],
        attributes["ApproximateNumberOfMessagesNotVisible"],
    ) == (
        "0",
        "0",
    ), attributes
    assert backend.receive_message(QueueUrl=url, WaitTimeSeconds=0).get("Messages", []) == []


def test_messages_sent_with_boto3_are_pushed_to_a_browser_and_acked_there(
    backend: Any, page: Page, web: WebGateway
) -> None:
    url = backend.create_queue(QueueName="to-browser")["QueueUrl"]
    _consume(page, web, "to-browser")
    sent = [f"order-{i}" for i in range(5)]
    for body in sent[:3]:
        backend.send_message(QueueUrl=url, MessageBody=body)
    batch = [{"Id": str(i), "MessageBody": body} for i, body in enumerate(sent[3:])]
    assert len(backend.send_message_batch(QueueUrl=url, Entries=batch)["Successful"]) == 2
    wait_in_page(page, f"() => window.acked >= {len(sent)}")
    assert sorted(page.evaluate("() => window.received")) == sorted(sent)
    assert page.evaluate("() => window.errors") == []
    _gone(backend, url)


def test_a_fifo_queue_made_over_sqs_reaches_the_browser_in_group_order(
    backend: Any, page: Page, web: WebGateway
) -> None:
    name = "checkout.fifo"
    url = backend.create_queue(QueueName=name, Attributes={"FifoQueue": "true"})["QueueUrl"]
    _consume(page, web, name)
    sent = {group: [f"{group}-{i}" for i in range(4)] for group in ("cart-a", "cart-b")}
    for i in range(4):
        for group, bodies in sent.items():
            backend.send_message(
                QueueUrl=url, MessageBody=bodies[i], MessageGroupId=group, MessageDeduplicationId=bodies[i]
            )
    wait_in_page(page, "() => window.acked >= 8")
    received: list[str] = page.evaluate("() => window.received")
    for group, bodies in sent.items():
        assert [b for b in received if b.startswith(group)] == bodies
    assert page.evaluate("() => window.errors") == []
    _gone(backend, url)
