"""Playwright's ``expect`` waits out the suites' scaled deadline, not its own 5 s.

``context.set_default_timeout`` covers actions and ``wait_for_*`` only; an ``expect``
assertion polls for 5 s unless told otherwise, which is not a deadline from
``tests.conftest.scaled()`` (docs/testing.md, timing rule 4). Under load (a load average
of 8-11 on the shared 2-core machine) the console's live updates took longer than that,
e.g. a send shown in the 1,000th row of the overview after a sample of 1,000 queues, whose
next sample waits ten times the last one's duration (docs/console.md, "Live").
"""

from __future__ import annotations

from playwright.sync_api import Browser, expect

# Longer than Playwright's own 5 s, well inside the suites' deadline.
LATE_MS = 6500


def test_an_expectation_waits_past_five_seconds(chromium: Browser) -> None:
    context = chromium.new_context()
    try:
        page = context.new_page()
        page.set_content(
            '<p id="late">before</p>'
            f"<script>setTimeout(() => {{ document.getElementById('late').textContent = 'after'; }}, {LATE_MS});</script>"
        )
        expect(page.locator("#late")).to_have_text("after")
    finally:
        context.close()
