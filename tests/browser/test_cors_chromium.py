"""CORS and the origin rule in a real browser: plain pages (no client library) on two origins.

A page on the tenant's allowed origin sends with fetch (a preflighted request: it carries
``Authorization``), reads pushes through ``EventSource`` with ``?access_token=``, acks
them with fetch, and does the same over a WebSocket with first-frame auth. A page on a
foreign origin gets nowhere on any of the three, and the queue shows it did nothing.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, Page

from tests.conftest import scaled

from .conftest import PageServer, WebGateway

_names = itertools.count()

# Runs in the page: send with fetch, read one push over SSE, ack it with fetch.
SSE_ROUND_TRIP = """async ({gw, key, queue}) => {
  const headers = {Authorization: `Bearer ${key}`, "Content-Type": "application/json"};
  const out = {};
  try {
    const sent = await fetch(`${gw}/v1/queues/${queue}/messages`,
      {method: "POST", headers, body: JSON.stringify({body: "via-sse"})});
    out.sendStatus = sent.status;  // readable only because the answer allowed this origin
  } catch (e) { out.sendError = e.name; }
  out.sse = await new Promise((resolve) => {
    const source = new EventSource(`${gw}/v1/queues/${queue}/events?prefetch=1&access_token=${key}`);
    const timer = setTimeout(() => { source.close(); resolve({timeout: true}); }, 8000);
    source.addEventListener("message", (event) => {
      clearTimeout(timer); source.close(); resolve({message: JSON.parse(event.data)});
    });
    source.onerror = () => {
      if (source.readyState === EventSource.CLOSED) { clearTimeout(timer); resolve({closed: true}); }
    };
  });
  if (out.sse.message) {
    const acked = await fetch(`${gw}/v1/queues/${queue}/ack`,
      {method: "POST", headers, body: JSON.stringify({receipts: [out.sse.message.receipt]})});
    out.ack = await acked.json();
  }
  return out;
}"""

# Runs in the page: first-frame auth over a WebSocket, subscribe, receive one push, ack it.
WS_ROUND_TRIP = """async ({gw, key, queue}) => {
  return await new Promise((resolve) => {
    const ws = new WebSocket(gw.replace("http", "ws") + "/v1/ws", "pushgate.v1");
    const replies = [];
    ws.onopen = () => {
      ws.send(JSON.stringify({op: "auth", token: key, id: 1}));
      ws.send(JSON.stringify({op: "subscribe", queue, prefetch: 1, id: 2}));
      ws.send(JSON.stringify({op: "send", queue, body: "via-ws", id: 3}));
    };
    ws.onmessage = (event) => {
      const frame = JSON.parse(event.data);
      replies.push(frame.op);
      if (frame.op === "message") ws.send(JSON.stringify({op: "ack", receipts: [frame.message.receipt], id: 4}));
      if (frame.op === "ok" && frame.id === 4) { ws.close(1000); resolve({replies, acked: frame.acked}); }
    };
    ws.onclose = (event) => resolve({replies, closeCode: event.code});
  });
}"""


@pytest.fixture
def queue(web: WebGateway) -> str:
    name = f"bq{next(_names)}"
    response = httpx.put(
        f"{web.url}/v1/queues/{name}", json={}, headers={"Authorization": f"Bearer {web.key}"}
    )
    assert response.status_code == 201
    return name


def stats(web: WebGateway, queue: str) -> dict[str, Any]:
    response = httpx.get(f"{web.url}/v1/queues/{queue}", headers={"Authorization": f"Bearer {web.key}"})
    result: dict[str, Any] = response.json()["stats"]
    return result


@pytest.fixture
def page_at(chromium: Browser, page_server: PageServer) -> Iterator[Any]:
    contexts = []

    def open_page(origin: str) -> Page:
        context = chromium.new_context()
        contexts.append(context)
        page = context.new_page()
        page.set_default_timeout(scaled(15) * 1000)
        page.goto(f"{origin}/blank.html")
        return page

    yield open_page
    for context in contexts:
        context.close()


def test_allowed_origin_sends_receives_over_sse_and_acks(
    web: WebGateway, page_server: PageServer, page_at: Any, queue: str
) -> None:
    page = page_at(page_server.allowed)
    out = page.evaluate(SSE_ROUND_TRIP, {"gw": web.url, "key": web.key, "queue": queue})
    assert out["sendStatus"] == 201
    assert out["sse"]["message"]["body"] == "via-sse"
    assert out["ack"] == {"acked": 1, "failed": []}
    assert (stats(web, queue)["visible"], stats(web, queue)["in_flight"]) == (0, 0)
    assert stats(web, queue)["acked_total"] == 1


def test_allowed_origin_over_websocket(
    web: WebGateway, page_server: PageServer, page_at: Any, queue: str
) -> None:
    page = page_at(page_server.allowed)
    out = page.evaluate(WS_ROUND_TRIP, {"gw": web.url, "key": web.key, "queue": queue})
    assert out.get("acked") == 1, out
    assert "message" in out["replies"]
    assert stats(web, queue)["acked_total"] == 1


def test_foreign_origin_gets_nowhere(
    web: WebGateway, page_server: PageServer, page_at: Any, queue: str
) -> None:
    page = page_at(page_server.foreign)
    # A message waits, so that a foreign stream that got through would have something to read.
    sent = httpx.post(
        f"{web.url}/v1/queues/{queue}/messages",
        json={"body": "waiting"},
        headers={"Authorization": f"Bearer {web.key}"},
    )
    assert sent.status_code == 201
    out = page.evaluate(SSE_ROUND_TRIP, {"gw": web.url, "key": web.key, "queue": queue})
    assert out.get("sendError") == "TypeError", out  # the preflight was refused
    assert out["sse"] == {"closed": True}  # the stream was refused with 403
    ws = page.evaluate(WS_ROUND_TRIP, {"gw": web.url, "key": web.key, "queue": queue})
    assert ws["closeCode"] == 4003, ws
    assert "message" not in ws["replies"]
    after = stats(web, queue)
    assert (after["visible"], after["in_flight"], after["sent_total"]) == (1, 0, 1)
