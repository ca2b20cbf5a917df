"""The console of a real cluster in a real Chromium: nodes, partitions, a queue's partitions,
and a drain run from the console and watched live until the node holds nothing.

``pushgate dev-cluster`` of its own (three nodes, two managers, etcd and the gateway, real
processes; not the session's shared one, since a drain moves its partitions), the
gateway's own console, a 1,280 x 800 window. Screenshots go to
``test-artifacts/console-cluster-*.png``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from playwright.sync_api import Browser, Page, expect

from backend_store.cluster.coordination.pools import place
from tests.conftest import scaled
from tests.fixtures.dev_cluster import DevClusterProcess, start_dev_cluster

TIMEOUT_MS = scaled(20) * 1000
# A drain moves leadership by hand-over, then each replica, which catches up: seconds each.
DRAIN_MS = scaled(90) * 1000
QUEUES = ("orders", "billing", "mail")
DRAINED = "node-1"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevClusterProcess]:
    # Three partitions a pool (dev-cluster's default is one): the pages show partitions led
    # by several nodes, and a drained node has leaders to hand over.
    data = tmp_path_factory.mktemp("console-cluster") / "data"
    running = start_dev_cluster(data, extra=["--partitions", "3"])
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="module")
def api(cluster: DevClusterProcess) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {cluster.admin_key}"}
    with httpx.Client(base_url=cluster.gateway_url, headers=headers, timeout=scaled(30)) as client:
        for name in QUEUES:
            # Two replicas of two partitions each: six partitions over three nodes, so every
            # node holds some and a drained node's replicas have somewhere to go.
            r = client.put(f"/v1/queues/{name}", json={"replication_factor": 2, "partitions": 2})
            assert r.status_code in (200, 201), r.text
            for i in range(4):
                assert client.post(f"/v1/queues/{name}/messages", json={"body": f"m{i}"}).status_code == 201
        yield client


@pytest.fixture
def page(chromium: Browser, cluster: DevClusterProcess) -> Iterator[Page]:
    context = chromium.new_context(base_url=cluster.gateway_url, viewport={"width": 1280, "height": 800})
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


def cluster_doc(api: httpx.Client) -> dict[str, Any]:
    doc: dict[str, Any] = api.get("/v1/cluster").json()
    return doc


def audit_records(cluster: DevClusterProcess) -> list[dict[str, Any]]:
    return [
        orjson.loads(line)
        for path in sorted((cluster.data / "gateway" / "audit").glob("date=*/audit.jsonl"))
        for line in path.read_bytes().splitlines()
        if line.strip()
    ]


def receive_all(api: httpx.Client, queue: str, count: int) -> list[str]:
    """Receives until ``count`` messages came (a receive asks one partition at a time)."""
    bodies: list[str] = []
    deadline = time.monotonic() + scaled(30)
    while len(bodies) < count and time.monotonic() < deadline:
        got = api.post(
            f"/v1/queues/{queue}/receive", json={"max": 10, "wait_s": 1, "visibility_timeout_s": 60}
        )
        bodies += [m["body"] for m in got.json()["messages"]]
    return bodies


# Words (runs of non-space characters) that a table at 1,280 px breaks across lines: each
# word's text range must lie on one line (a word that runs past its cell shows up too, in
# the screenshots). Node ids, states, numbers and sizes are short: none needs breaking.
BROKEN_WORDS_JS = """table => {
  const broken = [];
  const walker = document.createTreeWalker(table, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    for (const match of node.data.matchAll(/\\S+/g)) {
      const range = document.createRange();
      range.setStart(node, match.index);
      range.setEnd(node, match.index + match[0].length);
      const lines = new Set(Array.from(range.getClientRects(), r => Math.round(r.top)));
      if (lines.size > 1) broken.push(match[0]);
    }
  }
  return broken;
}"""


def placed_partitions(doc: dict[str, Any], queue: str, count: int) -> list[dict[str, Any]]:
    """The partitions a queue created on a pool lives on: placed as the gateway places it
    (coordination/pools.py), over the pool's slots in the cluster document."""
    slots = sorted((p for p in doc["partitions"] if p["tenant"] == ""), key=lambda p: p["index"])
    ids = place("default", queue, count, [p["id"] for p in slots])
    return [next(p for p in slots if p["id"] == pid) for pid in ids]


def broken_words(page: Page, table: str) -> list[str]:
    words: list[str] = page.locator(table).evaluate(BROKEN_WORDS_JS)
    return words


def test_nodes_partitions_and_a_queues_partitions(
    page: Page, api: httpx.Client, cluster: DevClusterProcess, artifacts_dir: Path
) -> None:
    doc = cluster_doc(api)
    log_in(page, cluster.admin_key)
    page.get_by_role("link", name="Nodes").click()
    expect(page.locator("#nodes tbody tr")).to_have_count(3)
    expect(page.locator("#cluster-identity")).to_contain_text(doc["cluster"]["id"])
    for node in doc["nodes"]:
        row = page.locator(f"#node-{node['id']}")
        expect(row.locator('[data-field="state"]')).to_have_text("up")
        placed = sum(node["id"] in (p["leader"], *p["followers"]) for p in doc["partitions"])
        expect(row.locator('[data-field="placed"]')).to_contain_text(str(placed))
    assert broken_words(page, "#nodes") == []
    page.screenshot(path=artifacts_dir / "console-cluster-nodes.png", full_page=True)

    page.get_by_role("link", name="Partitions").click()
    rows = page.locator("#partitions tbody tr")
    expect(rows).to_have_count(len(doc["partitions"]))  # the pool's partitions (docs/cluster.md 12)
    for part in doc["partitions"]:
        row = page.locator(f"#partition-{part['id']}")
        expect(row.locator("td.leader")).to_have_text(part["leader"])
        [follower] = part["followers"]
        expect(row.locator(f'td.followers [data-node="{follower}"]')).to_be_visible()
        expect(row.locator(f'td.followers [data-node="{follower}"] .lag')).to_have_text(re.compile(r"^\d+$"))
    assert broken_words(page, "#partitions") == []
    # No membership change is under way: its fields (learners, leaving, successor) say nothing.
    expect(page.locator("#partitions")).not_to_contain_text("learners")
    page.screenshot(path=artifacts_dir / "console-cluster-partitions.png", full_page=True)

    page.goto("/console/queues/orders")
    own = placed_partitions(doc, "orders", 2)
    expect(page.locator("#queue-partitions #partitions tbody tr")).to_have_count(2)
    for part in own:
        expect(page.locator(f"#partition-{part['id']} td.leader")).to_have_text(part["leader"])
    expect(page.locator("#rates-chart")).to_be_visible()
    page.screenshot(path=artifacts_dir / "console-cluster-queue.png", full_page=True)


def test_a_drain_from_the_console_moves_the_nodes_partitions_live(
    page: Page, api: httpx.Client, cluster: DevClusterProcess, artifacts_dir: Path
) -> None:
    before = cluster_doc(api)
    placed = [p["id"] for p in before["partitions"] if DRAINED in (p["leader"], *p["followers"])]
    assert placed, "the drained node must hold partitions for this test to mean anything"
    log_in(page, cluster.admin_key)
    page.goto(f"/console/nodes/{DRAINED}")
    table = page.locator("#node-partitions tbody tr[data-partition]")
    expect(table).to_have_count(len(placed))
    expect(page.locator("#drain-status")).to_contain_text("Not draining")
    assert broken_words(page, "#node-partitions") == []
    page.screenshot(path=artifacts_dir / "console-cluster-node-before.png", full_page=True)

    # Refused: without the typed confirmation, and with a forged CSRF token. Nothing moves.
    page.get_by_role("button", name="Drain").click()
    expect(page.locator("#error")).to_contain_text("type the node's id")
    page.locator("#drain-form input[name=csrf]").evaluate("input => { input.value = 'forged'; }")
    page.get_by_label(f"Type {DRAINED} to drain this node").fill(DRAINED)
    with page.expect_response(lambda r: r.url.endswith("/drain")) as answer:
        page.get_by_role("button", name="Drain").click()
    assert answer.value.status == 403
    expect(page.locator("#refused")).to_contain_text("CSRF token")
    assert not any(r["action"].startswith("node.") for r in audit_records(cluster))

    # A second tab watches the node (and the nodes page) while the first asks for the drain:
    # both follow the moves over their live streams, never reloaded.
    watcher = page.context.new_page()
    watcher.goto(f"/console/nodes/{DRAINED}")
    watched = watcher.locator("#node-partitions tbody tr[data-partition]")
    expect(watched).to_have_count(len(placed))
    watcher.evaluate("window.stillTheSamePage = true")
    overview = page.context.new_page()
    overview.goto("/console/nodes")
    expect(overview.locator(f"#node-{DRAINED} [data-field=drain]")).to_have_text("-")
    overview.evaluate("window.stillTheSamePage = true")

    page.goto(f"/console/nodes/{DRAINED}")
    page.get_by_label(f"Type {DRAINED} to drain this node").fill(DRAINED)
    page.get_by_role("button", name="Drain").click()
    expect(page.locator("#notice")).to_contain_text(f"Drain of {DRAINED} requested")
    page.screenshot(path=artifacts_dir / "console-cluster-node-drain-requested.png", full_page=True)

    expect(watcher.locator("#drain-status")).to_contain_text("Drained", timeout=DRAIN_MS)
    expect(watched).to_have_count(0)
    expect(watcher.locator("#node-partitions tr.empty")).to_have_text("No partition is placed on this node.")
    expect(overview.locator(f"#node-{DRAINED} [data-field=drain]")).to_have_text("drained", timeout=DRAIN_MS)
    expect(overview.locator(f"#node-{DRAINED} [data-field=placed]")).to_have_text("0")
    for tab in (watcher, overview):
        assert tab.evaluate("window.stillTheSamePage") is True  # followed live, not reloaded
    watcher.screenshot(path=artifacts_dir / "console-cluster-node-drained.png", full_page=True)

    after = cluster_doc(api)
    for part in after["partitions"]:
        assert DRAINED not in (part["leader"], *part["followers"])
    assert {p["id"] for p in after["partitions"]} == {p["id"] for p in before["partitions"]}
    # The copies it kept (strays, never deleted on absence) go on the manager's tombstones once
    # the new replica sets committed past them: the drain frees the node's disk, live.
    expect(watcher.locator("#node-strays tr.empty")).to_have_text("No strays.", timeout=DRAIN_MS)
    node = next(n for n in cluster_doc(api)["nodes"] if n["id"] == DRAINED)
    assert node["strays"] == []
    assert broken_words(overview, "#nodes") == []  # "drained" in the last column, whole
    overview.screenshot(path=artifacts_dir / "console-cluster-nodes-drained.png", full_page=True)

    # Every message is still there.
    for name in QUEUES:
        assert sorted(receive_all(api, name, 4)) == [f"m{i}" for i in range(4)]

    # Withdrawn from the console too.
    page.goto(f"/console/nodes/{DRAINED}")
    page.get_by_role("button", name="Withdraw the drain").click()
    expect(page.locator("#notice")).to_have_text(f"Drain of {DRAINED} withdrawn.")
    expect(page.locator("#drain-form")).to_be_visible()

    records = [r for r in audit_records(cluster) if r["action"].startswith("node.")]
    assert [(r["action"], r["target"], r["source"], r["tenant"]) for r in records] == [
        ("node.drain_requested", DRAINED, "console", "default"),
        ("node.drain_withdrawn", DRAINED, "console", "default"),
    ]
    assert records[0]["details"]["placed"] == len(placed)
    assert records[0]["actor"].startswith("key:")
