"""The console at 1,000 queues, and its layout at 1,280 px, in a real Chromium.

The issue asks that the console at 1,000 queues paints in under a second. Whether it does
is a figure of the machine as much as of the console (a shared 2-core machine under load
paints the same page 2-3 times slower), so it is measured by ``bench/console_bench.py``
and reported in ``bench/README.md``, not asserted here (docs/testing.md, timing rule 5:
no timing assertions on speed). This test checks what must hold on any machine: the page
at 1,000 queues is complete and correct (the first 200 rows, the pager, all 1,000 on one
page on request, and live), and it records the first contentful paint it saw as a test
property (``--junitxml`` shows it) so a run's figure is kept beside its result.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect

from tests.conftest import scaled
from tests.gateway.conftest import RunningGateway, api_for, start_gateway

TIMEOUT_MS = scaled(30) * 1000
QUEUES = 1000


def _create_queues(url: str, key: str) -> None:
    # Sixteen at a time from a thread pool (the test thread's asyncio loop is Playwright's).
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=url, headers=headers, timeout=scaled(60)) as client:

        def one(i: int) -> None:
            client.put(f"/v1/queues/scale-{i:04d}").raise_for_status()

        with ThreadPoolExecutor(16) as pool:
            list(pool.map(one, range(QUEUES)))


@pytest.fixture(scope="module")
def big_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    running = start_gateway(tmp_path_factory.mktemp("scale-gateway"), monitor_interval_s=1)
    try:
        _create_queues(running.url, running.admin_key)
        yield running
    finally:
        running.stop()


@pytest.fixture
def page(chromium: Browser, big_gateway: RunningGateway) -> Iterator[Page]:
    context = chromium.new_context(base_url=big_gateway.url, viewport={"width": 1280, "height": 800})
    context.set_default_timeout(TIMEOUT_MS)
    try:
        yield context.new_page()
    finally:
        context.close()


def log_in(page: Page, key: str) -> None:
    page.goto("/console/login")
    page.get_by_label("Admin key or JWT").fill(key)
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("heading", name="Queues")).to_be_visible()


def first_contentful_paint(page: Page) -> float:
    page.wait_for_function("performance.getEntriesByName('first-contentful-paint').length > 0")
    fcp: float = page.evaluate("performance.getEntriesByName('first-contentful-paint')[0].startTime")
    return fcp


def test_the_console_at_1000_queues(
    page: Page,
    big_gateway: RunningGateway,
    artifacts_dir: Path,
    record_property: Callable[[str, object], None],
) -> None:
    log_in(page, big_gateway.admin_key)
    page.goto("/console/")
    record_property("first_contentful_paint_ms_200_rows", round(first_contentful_paint(page)))
    rows = page.locator("#queues tbody tr")
    expect(rows).to_have_count(200)
    expect(page.locator("#queues caption")).to_contain_text(f"{QUEUES}")
    expect(page.locator("#queues caption")).to_contain_text("page 1 of 5")
    expect(rows.first).to_have_id("queue-scale-0000")
    page.screenshot(path=artifacts_dir / "console-1000-queues.png")
    page.get_by_role("link", name="Next page").click()
    expect(rows.first).to_have_id("queue-scale-0200")

    page.goto(f"/console/?per_page={QUEUES}")
    record_property("first_contentful_paint_ms_1000_rows", round(first_contentful_paint(page)))
    expect(rows).to_have_count(QUEUES)
    expect(rows.last).to_have_id(f"queue-scale-{QUEUES - 1:04d}")
    # Live at that size: a send to the last queue shows up in its row without a reload.
    for api in api_for(big_gateway, big_gateway.admin_key):
        assert api.send(f"scale-{QUEUES - 1:04d}", "x").status_code == 201
    expect(rows.last.locator('[data-field="visible"]')).to_have_text("1")


def test_at_1280_px_no_column_runs_into_the_next(
    page: Page, big_gateway: RunningGateway, artifacts_dir: Path
) -> None:
    name = "scale-0001"
    for api in api_for(big_gateway, big_gateway.admin_key):
        for i in range(3):
            assert api.send(name, f"message {i}", group_id="g" * 40).status_code == 201
    log_in(page, big_gateway.admin_key)
    page.goto(f"/console/queues/{name}")
    expect(page.locator("#peek tbody tr")).to_have_count(3)
    page.screenshot(path=artifacts_dir / "console-queue-1280.png", full_page=True)
    boxes = page.locator("#peek").evaluate(
        """table => Array.from(table.querySelectorAll('tbody tr')).map(tr => {
             const cells = Array.from(tr.children).map(td => td.getBoundingClientRect());
             const content = Array.from(tr.children).map(td => {
               const range = document.createRange(); range.selectNodeContents(td);
               return range.getBoundingClientRect();
             });
             return {cells: cells.map(r => [r.left, r.right]), content: content.map(r => [r.left, r.right])};
           })"""
    )
    for row in boxes:
        for (cell_left, cell_right), (left, right) in zip(row["cells"], row["content"], strict=True):
            # Each cell's text stays inside its own cell (0.5 px for subpixel rounding).
            assert cell_left - 0.5 <= left and right <= cell_right + 0.5, row
    ids = page.locator("#peek td.id code").all_inner_texts()
    assert len(ids) == 3 and all(re.fullmatch(r"\S+", i) for i in ids)
    # The rates chart beside the depth chart (side by side from 48 rem up), not below it.
    depth, rates = (page.locator(f"#{chart}").bounding_box() for chart in ("chart", "rates-chart"))
    assert depth is not None and rates is not None
    assert abs(depth["y"] - rates["y"]) < 1 and rates["x"] >= depth["x"] + depth["width"], (depth, rates)
