"""``/docs`` is Swagger UI, works offline, and "try it out" reaches the gateway with a bearer key.

Chromium may load nothing but the gateway: every other request is refused and recorded,
so a CDN link or a validator badge would fail the test. Screenshots land in
``test-artifacts/`` for a human to look at.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
from playwright.sync_api import Browser, Page, Route

from gateway.asyncapi import asyncapi_document
from gateway.openapi import openapi_document
from tests.conftest import scaled

from .conftest import WebGateway


def operation(page: Page, method: str, path: str) -> Any:
    return page.locator(f".opblock-{method}").filter(
        has=page.locator(f'.opblock-summary-path[data-path="{path}"]')
    )


def test_docs_is_an_offline_interactive_api_browser(
    chromium: Browser, web: WebGateway, artifacts_dir: Path
) -> None:
    admin_key = web.gateway.admin_key
    created = httpx.put(
        f"{web.url}/v1/queues/docs-demo", json={}, headers={"Authorization": f"Bearer {admin_key}"}
    )
    assert created.status_code == 201, created.text  # a Response is always truthy: check the status
    outside: list[str] = []

    def only_the_gateway(route: Route) -> None:
        if route.request.url.startswith(web.url + "/"):
            route.continue_()
        else:
            outside.append(route.request.url)
            route.abort()

    context = chromium.new_context(viewport={"width": 1280, "height": 900})
    try:
        context.route("**/*", only_the_gateway)
        page = context.new_page()
        page.set_default_timeout(scaled(20) * 1000)
        page.goto(f"{web.url}/docs")
        page.wait_for_selector(".opblock")
        # Every operation of the OpenAPI document is listed.
        paths = {p for p, item in openapi_document()["paths"].items() for m in item if m != "parameters"}
        shown = set(page.locator(".opblock-summary-path").evaluate_all("els => els.map(e => e.dataset.path)"))
        assert shown == paths
        page.screenshot(path=str(artifacts_dir / "docs.png"))

        page.click(".auth-wrapper .authorize")
        page.fill(".modal-ux input", admin_key)
        page.click(".modal-ux .auth-btn-wrapper .authorize")
        page.click(".modal-ux .btn-done")

        send = operation(page, "post", "/v1/queues/{queue}/messages")
        send.locator(".opblock-summary").click()
        send.locator(".try-out__btn").click()
        send.locator('input[placeholder="queue"]').fill("docs-demo")
        send.locator("textarea.body-param__text").fill('{"body": "sent from /docs"}')
        send.locator(".execute").click()
        status = send.locator(".live-responses-table .response .response-col_status").first
        status.wait_for()
        assert status.inner_text().strip() == "201"
        send.scroll_into_view_if_needed()
        page.screenshot(path=str(artifacts_dir / "docs-try-it-out.png"))
    finally:
        context.close()
    assert outside == []
    received = httpx.post(
        f"{web.url}/v1/queues/docs-demo/receive",
        json={"max": 10},
        headers={"Authorization": f"Bearer {admin_key}"},
    ).json()["messages"]
    assert [m["body"] for m in received] == ["sent from /docs"]


def test_asyncapi_document_is_consistent(web: WebGateway) -> None:
    doc = httpx.get(f"{web.url}/asyncapi.json").json()
    assert doc == asyncapi_document()
    assert doc["asyncapi"].startswith("3.")

    def resolve(ref: str) -> Any:
        node: Any = doc
        for part in ref.removeprefix("#/").split("/"):
            node = node[part]
        return node

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if "$ref" in node:
                resolve(node["$ref"])  # KeyError if it points nowhere
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(doc)
    ws = doc["channels"]["ws"]
    client_ops = {m["name"] for k, m in ws["messages"].items() if k.startswith("client_")}
    assert client_ops == {"auth", "subscribe", "unsubscribe", "ack", "nack", "send", "ping"}
    assert {c["code"] for c in ws["x-close-codes"]} >= {1001, 4001, 4003, 4008, 4400, 1009}


def test_client_files_are_served(web: WebGateway) -> None:
    js = httpx.get(f"{web.url}/client/pushgate.js")
    assert js.status_code == 200
    assert js.headers["content-type"].startswith("text/javascript")
    repo_copy = Path(__file__).resolve().parents[2] / "clients" / "js" / "pushgate.js"
    assert js.content == repo_copy.read_bytes()
    again = httpx.get(f"{web.url}/client/pushgate.js", headers={"If-None-Match": js.headers["etag"]})
    assert again.status_code == 304
    assert httpx.get(f"{web.url}/client/pushgate.d.ts").status_code == 200
    assert httpx.get(f"{web.url}/client/package.json").status_code == 404
    assert httpx.get(f"{web.url}/docs/assets/index.html").status_code == 404
