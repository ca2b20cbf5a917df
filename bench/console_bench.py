"""First paint of the console's overview with 1,000 queues (the issue asks for under 1 s).

Run: ``python bench/console_bench.py [--queues 1000] [--runs 10]``

A real ``pushgate serve`` on a free port; ``--queues`` queues are created over HTTP (every
tenth holds a few messages), then:

- ``html``: ``GET /console/`` with a session, the whole server-rendered page (queue stats
  read from the store for the cold run; the warm runs reuse the monitor's latest sample);
- ``first contentful paint``: Debian's Chromium, headless through Playwright, loads the
  overview with the session cookie (Paint Timing API): the default first page (200 rows,
  the rest a "next page" away), all queues on one page (``?per_page=1000``) and one
  queue's page (its depth and rates charts side by side, the peek table);
- the login page (a tiny page from the same server, same browser) is the baseline, so the
  ratio says what 1,000 rows cost over an empty page on this machine.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from a checkout

from bench.push_common import machine, start_gateway


async def create_queues(url: str, key: str, count: int) -> None:
    headers = {"Authorization": f"Bearer {key}"}
    limits = httpx.Limits(max_connections=16)
    async with httpx.AsyncClient(base_url=url, headers=headers, limits=limits, timeout=60) as client:
        sem = asyncio.Semaphore(16)

        async def one(i: int) -> None:
            async with sem:
                name = f"bench-{i:05d}"
                r = await client.put(f"/v1/queues/{name}")
                r.raise_for_status()
                if i % 10 == 0:
                    batch = {"messages": [{"body": f"m{j}"} for j in range(5)]}
                    (await client.post(f"/v1/queues/{name}/messages", json=batch)).raise_for_status()

        await asyncio.gather(*(one(i) for i in range(count)))


def paint_times(url: str, cookie: str, path: str, runs: int) -> list[tuple[float, float, float, float]]:
    """Per load: (first paint, first contentful paint, response end, DOM content loaded), ms."""
    from playwright.sync_api import sync_playwright

    out = []
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path="/usr/bin/chromium",
            headless=True,
            args=["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"],
        )
        try:
            for _ in range(runs):
                context = browser.new_context()
                context.add_cookies([{"name": "pushgate_console", "value": cookie, "url": url + "/console/"}])
                page = context.new_page()
                page.goto(url + path, wait_until="load")
                # Paint entries can land just after load.
                page.wait_for_function("performance.getEntriesByType('paint').length >= 2", timeout=10_000)
                entries = page.evaluate(
                    "Object.fromEntries(performance.getEntriesByType('paint').map(e => [e.name, e.startTime]))"
                )
                nav = page.evaluate(
                    "(() => { const n = performance.getEntriesByType('navigation')[0];"
                    " return [n.responseEnd, n.domContentLoadedEventEnd]; })()"
                )
                out.append((entries["first-paint"], entries["first-contentful-paint"], nav[0], nav[1]))
                context.close()
        finally:
            browser.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--queues", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    print(machine())
    with tempfile.TemporaryDirectory(prefix="pushgate-console-bench-") as tmp:
        proc, url, key = start_gateway(Path(tmp) / "data")
        try:
            started = time.perf_counter()
            asyncio.run(create_queues(url, key, args.queues))
            print(f"created {args.queues} queues in {time.perf_counter() - started:.1f}s")
            time.sleep(1.5)  # past the console's page max age: the first load reads the store
            with httpx.Client(base_url=url, timeout=60, follow_redirects=False) as client:
                r = client.post("/console/login", data={"token": key})
                cookie = r.cookies["pushgate_console"]
                timings = []
                size = 0
                for _ in range(args.runs + 1):
                    t0 = time.perf_counter()
                    page = client.get("/console/")
                    timings.append(time.perf_counter() - t0)
                    size = len(page.content)
                    rows = min(args.queues, 200)
                    assert page.status_code == 200 and page.text.count('<tr id="queue-') == rows
            cold, warm = timings[0], timings[1:]
            print(
                f"html /console/ ({size / 1024:.0f} KiB, first page of {args.queues} queues): cold {cold * 1000:.0f} ms, "
                f"warm p50 {statistics.median(warm) * 1000:.0f} ms, max {max(warm) * 1000:.0f} ms"
            )
            login = paint_times(url, cookie, "/console/login", args.runs)
            base = statistics.median(x[1] for x in login)
            print(f"chromium login page (baseline) first contentful paint p50 {base:.0f} ms")
            for label, path in (
                ("overview, first page (200 rows)", "/console/"),
                (f"overview, all {args.queues} rows on one page", f"/console/?per_page={args.queues}"),
                ("a queue's page (depth and rates charts, peek)", "/console/queues/bench-00000"),
            ):
                loads = paint_times(url, cookie, path, args.runs)
                fcp = statistics.median(x[1] for x in loads)
                print(
                    f"chromium {label}: first contentful paint p50 {fcp:.0f} ms "
                    f"(max {max(x[1] for x in loads):.0f} ms; response end p50 "
                    f"{statistics.median(x[2] for x in loads):.0f} ms, DOM content loaded p50 "
                    f"{statistics.median(x[3] for x in loads):.0f} ms), {fcp / base:.1f}x the baseline"
                )
        finally:
            proc.terminate()
            proc.wait(30)


if __name__ == "__main__":
    main()
