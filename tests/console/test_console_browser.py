"""The console in a real headless Chromium: log in, live depth, an alert firing and
resolving, a redrive, a purge, and being refused without a session or with a bad CSRF token.

Screenshots of each step go to ``test-artifacts/console-*.png``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.conftest import scaled
from tests.gateway.conftest import Api, RunningGateway, api_for

from .conftest import wait_sampled

TIMEOUT_MS = scaled(15) * 1000


@pytest.fixture
def tenant_key(ops_gateway: RunningGateway) -> str:
    return ops_gateway.make_key("admin", ops_gateway.make_tenant())


@pytest.fixture
def api(ops_gateway: RunningGateway, tenant_key: str) -> Iterator[Api]:
    yield from api_for(ops_gateway, tenant_key)


@pytest.fixture
def page(chromium: Browser, ops_gateway: RunningGateway) -> Iterator[Page]:
    context = chromium.new_context(base_url=ops_gateway.url)
    context.set_default_timeout(TIMEOUT_MS)
    try:
        yield context.new_page()
    finally:
        context.close()


def log_in(page: Page, key: str) -> None:
    page.goto("/console/")
    expect(page).to_have_url(re.compile(r"/console/login$"))
    page.get_by_label("Admin key or JWT").fill(key)
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("heading", name="Queues")).to_be_visible()


def test_operator_flow(
    page: Page, api: Api, ops_gateway: RunningGateway, tenant_key: str, qname: str, artifacts_dir: Path
) -> None:
    api.put_queue(qname, visibility_timeout_s=60)
    wait_sampled(ops_gateway, qname)
    page.goto("/console/")
    expect(page.get_by_role("heading", name="Log in")).to_be_visible()
    page.screenshot(path=artifacts_dir / "console-login.png")
    log_in(page, tenant_key)

    # Live depth: a send through the API shows up without a reload.
    row = page.locator(f"#queue-{qname}")
    expect(row.locator('[data-field="visible"]')).to_have_text("0")
    api.send(qname, "one")
    expect(row.locator('[data-field="visible"]')).to_have_text("1")
    page.screenshot(path=artifacts_dir / "console-overview-live.png")

    # An alert rule made in the console fires on the overview, live, and resolves.
    page.get_by_role("link", name="Alerts").click()
    page.get_by_label("Kind").select_option("queue_depth")
    page.get_by_label("Queue (name or glob; empty: all)").fill(qname)
    page.get_by_label("Threshold", exact=True).fill("1")
    page.get_by_role("button", name="Add rule").click()
    expect(page.locator("#notice")).to_contain_text("added")
    page.get_by_role("link", name="Queues").click()
    firing = page.locator("#active-alerts tr.alert-firing")
    expect(firing).to_have_count(0)
    api.send(qname, "two")
    expect(firing).to_have_count(1)
    expect(firing).to_contain_text(qname)
    expect(row.locator('[data-field="visible"]')).to_have_text("2")
    page.screenshot(path=artifacts_dir / "console-alert-firing.png")
    receipts = [m["receipt"] for m in api.receive(qname, max=2).json()["messages"]]
    api.ack(qname, receipts)
    expect(firing).to_have_count(0)
    expect(row.locator('[data-field="visible"]')).to_have_text("0")
    page.screenshot(path=artifacts_dir / "console-alert-resolved.png")
    page.get_by_role("link", name="Alerts").click()
    expect(page.locator("#alert-history tr.event-resolved")).to_have_count(1)
    expect(page.locator("#alert-history tr.event-fired")).to_have_count(1)


def test_queues_created_and_deleted_appear_live_on_the_overview(
    page: Page, api: Api, tenant_key: str, qname: str, artifacts_dir: Path
) -> None:
    log_in(page, tenant_key)  # a fresh tenant: no queues yet
    expect(page.locator("#queues tr.empty")).to_have_text("No queues yet.")
    api.put_queue(qname)
    row = page.locator(f"#queue-{qname}")
    expect(row.get_by_role("link", name=qname)).to_have_attribute("href", f"/console/queues/{qname}")
    expect(page.locator("#queues tr.empty")).to_have_count(0)
    expect(page.locator("#queue-total")).to_have_text("1")
    api.send(qname, "one")
    expect(row.locator('[data-field="visible"]')).to_have_text("1")
    page.screenshot(path=artifacts_dir / "console-overview-new-queue.png")
    assert api.client.delete(f"/v1/queues/{qname}").status_code == 204
    expect(row).to_have_count(0)
    expect(page.locator("#queues tr.empty")).to_have_text("No queues yet.")
    expect(page.locator("#queue-total")).to_have_text("0")


def test_redrive_and_purge(page: Page, api: Api, tenant_key: str, qname: str, artifacts_dir: Path) -> None:
    dlq = f"{qname}-dlq"
    api.put_queue(dlq)
    api.put_queue(qname, max_receives=1, dead_letter_queue=dlq, visibility_timeout_s=0)
    api.send(qname, "poison")
    api.receive(qname, max=1)
    assert api.receive(qname, max=1).json() == {"messages": []}  # moved to the DLQ
    log_in(page, tenant_key)
    page.goto(f"/console/queues/{dlq}")
    expect(page.locator("#peek tbody tr")).to_have_count(1)
    expect(page.locator("#peek")).to_contain_text("poison")
    expect(page.locator("#chart svg")).to_have_count(1)
    page.screenshot(path=artifacts_dir / "console-dead-letters.png", full_page=True)
    page.get_by_role("button", name="Redrive").click()
    expect(page.locator("#notice")).to_have_text(f"Moved 1 message(s) to {qname}.")
    expect(page.locator("#peek")).to_contain_text("The queue is empty.")
    page.screenshot(path=artifacts_dir / "console-redriven.png", full_page=True)
    assert [m["body"] for m in api.receive(qname, max=5, visibility_timeout_s=60).json()["messages"]] == [
        "poison"
    ]

    api.send(dlq, "a")
    page.goto(f"/console/queues/{dlq}")
    page.get_by_role("button", name="Purge").click()  # without typing the name: refused
    expect(page.locator("#notice")).to_contain_text("type the queue's name")
    page.get_by_label(f"Type {dlq} to delete every message of this queue").fill(dlq)
    page.get_by_role("button", name="Purge").click()
    expect(page.locator("#notice")).to_have_text("Purged 1 message(s).")

    page.get_by_role("button", name="Log out").click()
    expect(page.get_by_role("heading", name="Log in")).to_be_visible()
    page.goto(f"/console/queues/{dlq}")
    expect(page.get_by_role("heading", name="Log in")).to_be_visible()


def test_refused_without_a_session_and_with_a_bad_csrf_token(
    page: Page, api: Api, tenant_key: str, qname: str, artifacts_dir: Path
) -> None:
    api.put_queue(qname)
    api.send(qname, "keep me")
    # A stranger: pages send it to the login page, actions and streams are refused.
    page.goto(f"/console/queues/{qname}")
    expect(page.get_by_role("heading", name="Log in")).to_be_visible()
    r = page.request.post(f"/console/queues/{qname}/purge", form={"confirm": qname, "csrf": "x"})
    assert r.status == 403
    assert page.request.get("/console/events").status == 401
    page.get_by_label("Admin key or JWT").fill("pg_not_a_real_key")
    page.get_by_role("button", name="Log in").click()
    expect(page.locator("#login-error")).to_have_text("That key or token is not valid.")

    log_in(page, tenant_key)
    page.goto(f"/console/queues/{qname}")
    page.locator("#purge-form input[name=csrf]").evaluate("input => { input.value = 'forged'; }")
    page.get_by_label(f"Type {qname} to delete every message of this queue").fill(qname)
    with page.expect_response(lambda r: r.url.endswith("/purge")) as answer:
        page.get_by_role("button", name="Purge").click()
    assert answer.value.status == 403
    expect(page.locator("#refused")).to_contain_text("CSRF token")
    page.screenshot(path=artifacts_dir / "console-bad-csrf.png")
    assert api.client.get(f"/v1/queues/{qname}").json()["stats"]["visible"] == 1  # nothing purged
