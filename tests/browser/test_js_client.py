"""The JS client (clients/js/pushgate.js) in headless Chromium against real gateways.

The page is on the tenant's allowed origin (the page server's ``localhost``) and imports
the client from the gateway's ``/client/pushgate.js``, as an application would. Every
test checks the queue over HTTP afterwards: what the page acked is gone.
"""

from __future__ import annotations

import itertools
import json
import signal
import subprocess
import sys
from collections.abc import Generator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, Page

from gateway.local_ports import free_port
from tests.conftest import scaled
from tests.gateway.processes import REPO, ServeProcess

from .conftest import TENANT, PageServer, WebGateway

_names = itertools.count()

# Runs in the page: import the client from the gateway, subscribe, ack everything it gets.
START_CONSUMER = """async ({gw, queue, token, options}) => {
  const { Pushgate } = await import(`${gw}/client/pushgate.js`);
  window.received = []; window.acked = 0; window.nacked = 0; window.states = []; window.errors = [];
  window.tokenCalls = 0;
  const tokenSource = token.mint
    ? async () => {
        window.tokenCalls += 1;
        const r = await fetch(`${gw}/v1/tokens`, {method: "POST",
          headers: {Authorization: `Bearer ${token.key}`, "Content-Type": "application/json"},
          body: JSON.stringify({ttl_s: token.ttlS})});
        const minted = await r.json();
        window.firstExpiry ??= minted.expires_at;
        return minted.token;
      }
    : token.key;
  const {nackFirst, ...clientOptions} = options;
  const pg = new Pushgate(gw, {token: tokenSource, backoff: {initialMs: 100, maxMs: 1000},
    onStateChange: (state) => window.states.push(state), ...clientOptions});
  window.pg = pg;
  (async () => {
    try {
      for await (const message of pg.subscribe(queue, {prefetch: 5})) {
        window.received.push(message.body);
        if (nackFirst && message.receive_count === 1) {
          // Given back once: it must come again, one receive later, and then be acked.
          if (await message.nack(0)) window.nacked += 1;
          continue;
        }
        if (await message.ack()) window.acked += 1;
      }
    } catch (error) { window.errors.push(`${error.code}: ${error.message}`); }
  })();
  await pg.connect();
  return pg.transport;
}"""

# Replaces WebSocket before any script runs: a network where WebSockets never get through.
BLOCK_WEBSOCKET = """window.WebSocket = class BlockedWebSocket {
  constructor() {
    setTimeout(() => { this.onerror && this.onerror(new Event("error"));
                       this.onclose && this.onclose({code: 1006, reason: ""}); }, 10);
  }
  send() { throw new Error("blocked"); }
  close() {}
};"""


def open_page(chromium: Browser, origin: str, init_script: str | None = None) -> Generator[Page, None, None]:
    context = chromium.new_context()
    if init_script:
        context.add_init_script(init_script)
    page = context.new_page()
    page.set_default_timeout(scaled(20) * 1000)
    page.goto(f"{origin}/blank.html")
    try:
        yield page
    finally:
        context.close()


def wait_in_page(page: Page, condition: str) -> None:
    try:
        page.wait_for_function(condition, timeout=scaled(30) * 1000)
    except Exception:
        state = page.evaluate(
            "() => ({states: window.states, errors: window.errors, received: window.received})"
        )
        raise AssertionError(f"page never reached {condition}: {state}") from None


class Http:
    def __init__(self, url: str, key: str) -> None:
        self.client = httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=scaled(30)
        )

    def __enter__(self) -> Http:
        return self

    def __exit__(self, *exc: object) -> None:
        self.client.close()

    def queue(self, name: str) -> str:
        assert self.client.put(f"/v1/queues/{name}", json={}).status_code in (200, 201)
        return name

    def send(self, queue: str, body: str) -> None:
        assert self.client.post(f"/v1/queues/{queue}/messages", json={"body": body}).status_code == 201

    def stats(self, queue: str) -> dict[str, Any]:
        result: dict[str, Any] = self.client.get(f"/v1/queues/{queue}").json()["stats"]
        return result

    def assert_drained(self, queue: str) -> None:
        stats = self.stats(queue)
        assert (stats["visible"], stats["in_flight"], stats["delayed"]) == (0, 0, 0), stats
        assert self.client.post(f"/v1/queues/{queue}/receive", json={"max": 10}).json() == {"messages": []}


@pytest.fixture
def qname() -> str:
    return f"js{next(_names)}"


# A gateway process that can be restarted -------------------------------------------


def admin(data: Path, *args: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "admin", "--data", str(data), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=scaled(60),
        check=True,
    )
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def serve(data: Path, port: int) -> ServeProcess:
    args = [sys.executable, "-m", "gateway.cli", "serve", "--data", str(data), "--port", str(port)]
    return ServeProcess(args).wait_until_serving(30)


def test_receives_acks_and_survives_a_gateway_restart(
    chromium: Browser, page_server: PageServer, tmp_path: Path, qname: str
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    admin(data, "tenant", "create", TENANT, "--origin", page_server.allowed)
    key = admin(data, "key", "create", "--tenant", TENANT, "--scope", "manage:* send:* receive:*")["key"]
    port = free_port()
    gateway = serve(data, port)
    url = f"http://127.0.0.1:{port}"
    http = Http(url, key)
    page_cm = open_page(chromium, page_server.allowed)
    try:
        http.queue(qname)
        page = next(page_cm)
        transport = page.evaluate(
            START_CONSUMER, {"gw": url, "queue": qname, "token": {"key": key}, "options": {}}
        )
        assert transport == "websocket"
        for i in range(5):
            http.send(qname, f"before-{i}")
        sent = page.evaluate("async (q) => (await window.pg.send(q, 'from-page')).duplicate", qname)
        assert sent is False
        wait_in_page(page, "() => window.acked >= 6")

        # SIGTERM: drain, close WebSockets with 1001; uvicorn then re-raises the signal (docs/http.md).
        assert gateway.terminate() == -signal.SIGTERM
        wait_in_page(page, "() => window.states.includes('connecting')")
        gateway = serve(data, port)  # same data directory, same port
        for i in range(5):
            http.send(qname, f"after-{i}")
        wait_in_page(page, "() => window.acked >= 11")
        client = page.evaluate("() => ({reconnects: window.pg.reconnects, transport: window.pg.transport})")
        assert client["reconnects"] >= 1
        assert client["transport"] == "websocket"
        received = page.evaluate("() => window.received")
        expected = {f"before-{i}" for i in range(5)} | {f"after-{i}" for i in range(5)} | {"from-page"}
        assert set(received) == expected
        assert page.evaluate("() => window.errors") == []
        http.assert_drained(qname)
    finally:
        page_cm.close()  # on failure too: a page left open breaks the next test's event loop
        http.client.close()
        gateway.stop()


def test_refreshes_its_token_without_reconnecting(
    chromium: Browser, web: WebGateway, page_server: PageServer, qname: str
) -> None:
    http = Http(web.url, web.key)
    http.queue(qname)
    for page in open_page(chromium, page_server.allowed):
        page.evaluate(
            START_CONSUMER,
            {
                "gw": web.url,
                "queue": qname,
                # Refreshed 4 s before expiry: slack for a loaded machine, where a late refresh
                # would let the token expire (4001) and the test would see a reconnect.
                "token": {"key": web.key, "mint": True, "ttlS": 6},
                "options": {"refreshBeforeS": 4, "nackFirst": True},
            },
        )
        # Past the first token's expiry: without a refresh the gateway would have closed with 4001.
        wait_in_page(page, "() => window.firstExpiry && Date.now() > window.firstExpiry * 1000 + 300")
        assert page.evaluate("() => window.tokenCalls") >= 3
        http.send(qname, "after-expiry")
        wait_in_page(page, "() => window.acked >= 1")
        assert page.evaluate("() => window.pg.reconnects") == 0
        assert page.evaluate("() => window.received") == ["after-expiry", "after-expiry"]
        assert page.evaluate("() => window.nacked") == 1
    with http:
        http.assert_drained(qname)


def test_falls_back_to_sse_where_websocket_is_blocked(
    chromium: Browser, web: WebGateway, page_server: PageServer, qname: str
) -> None:
    http = Http(web.url, web.key)
    http.queue(qname)
    for page in open_page(chromium, page_server.allowed, BLOCK_WEBSOCKET):
        transport = page.evaluate(
            START_CONSUMER,
            {"gw": web.url, "queue": qname, "token": {"key": web.key}, "options": {"nackFirst": True}},
        )
        assert transport == "sse"
        for i in range(3):
            http.send(qname, f"m{i}")
        result = page.evaluate("async (q) => await window.pg.send(q, 'from-page')", qname)
        assert result["duplicate"] is False
        wait_in_page(page, "() => window.acked >= 4")
        assert page.evaluate("() => window.nacked") == 4
        assert sorted(page.evaluate("() => window.received")) == sorted(["from-page", "m0", "m1", "m2"] * 2)
    with http:
        http.assert_drained(qname)


def test_backoff_is_full_jitter(chromium: Browser, web: WebGateway, page_server: PageServer) -> None:
    # Uniform in [0, min(maxMs, initialMs * 2^attempt)): docs/browser.md, as AWS's "full jitter".
    for page in open_page(chromium, page_server.allowed):
        delays = page.evaluate(
            """async (gw) => {
              const { backoffDelay } = await import(`${gw}/client/pushgate.js`);
              const opts = {initialMs: 100, maxMs: 1000};
              return [0, 1, 2, 3, 4, 10].map((n) => [backoffDelay(n, opts, () => 0),
                                                      backoffDelay(n, opts, () => 0.999999)]);
            }""",
            web.url,
        )
        assert delays == [[0, 99], [0, 199], [0, 399], [0, 799], [0, 999], [0, 999]]


def test_refusals_end_a_subscription(chromium: Browser, web: WebGateway, page_server: PageServer) -> None:
    # A queue that does not exist: over WebSocket the subscribe is answered with an error;
    # over SSE the stream is refused (EventSource does not say why) and the client asks.
    for init_script, transport in ((None, "websocket"), (BLOCK_WEBSOCKET, "sse")):
        for page in open_page(chromium, page_server.allowed, init_script):
            used = page.evaluate(
                START_CONSUMER,
                {"gw": web.url, "queue": "no-such-queue", "token": {"key": web.key}, "options": {}},
            )
            assert used == transport
            wait_in_page(page, "() => window.errors.length > 0")
            (error,) = page.evaluate("() => window.errors")
            assert error.startswith("queue_not_found: "), error


def test_a_bad_key_fails_instead_of_retrying(
    chromium: Browser, web: WebGateway, page_server: PageServer
) -> None:
    for page in open_page(chromium, page_server.allowed):
        failed = page.evaluate(
            """async (gw) => {
              const { Pushgate } = await import(`${gw}/client/pushgate.js`);
              const pg = new Pushgate(gw, {token: "pgk_0000000000000000_not-a-key"});
              try { await pg.connect(); return "connected"; }
              catch (error) { return [error.code, pg.state]; }
            }""",
            web.url,
        )
        assert failed == ["unauthorized", "closed"]
