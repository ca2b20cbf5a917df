"""Two real ``pushgate serve`` processes on one data directory share alert state.

Both sample the store every 0.2 s and evaluate the same rule; the claim in the store's
metadata (docs/console.md, "Several gateways on one store") makes one of them record each
transition. What an operator depends on: one webhook POST per transition (not one per
gateway), and the same active alerts and history whichever gateway answers.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import scaled
from tests.gateway.processes import ServeProcess, serve

from .conftest import WebhookReceiver, _receiver


@pytest.fixture(scope="module")
def receiver() -> Iterator[WebhookReceiver]:
    hook = _receiver()  # answers 503 to each new body once, then 200
    try:
        yield hook
    finally:
        hook.server.shutdown()
        hook.server.server_close()


def wait_for(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + scaled(15)
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_one_post_per_transition_and_the_same_view_on_both(tmp_path: Any, receiver: WebhookReceiver) -> None:
    env = {**os.environ, "PUSHGATE_MONITOR_INTERVAL_S": "0.2"}
    data = tmp_path / "data"
    gateways: list[ServeProcess] = []
    try:
        for _ in range(2):
            gateways.append(serve(data, "--alert-webhook-url", receiver.url, env=env))
        key = gateways[0].key
        assert key is not None
        headers = {"Authorization": f"Bearer {key}"}
        a, b = (httpx.Client(base_url=g.url, headers=headers, timeout=scaled(10)) for g in gateways)
        with a, b:
            assert a.put("/v1/queues/orders", json={}).status_code == 201
            rule = a.post("/v1/alerts/rules", json={"kind": "queue_depth", "queue": "orders", "threshold": 1})
            assert rule.status_code == 201, rule.text
            for body in ("one", "two"):
                assert b.post("/v1/queues/orders/messages", json={"body": body}).status_code == 201

            def active_on_both() -> bool:
                return all(
                    [x["subject"] for x in g.get("/v1/alerts").json()["active"]] == ["default/orders"]
                    for g in (a, b)
                )

            wait_for(active_on_both, "both gateways to show the alert firing")
            assert a.post("/v1/queues/orders/purge").status_code == 200
            wait_for(
                lambda: not any(g.get("/v1/alerts").json()["active"] for g in (a, b)),
                "both gateways to show it resolved",
            )
            receiver.wait_for(lambda docs: any(d["alert"]["state"] == "resolved" for d in docs))
            histories = [[e["state"] for e in g.get("/v1/alerts").json()["history"]] for g in (a, b)]
    finally:
        for g in gateways:
            g.terminate()
    # Every body a gateway tried to POST (each is answered 503 once, then retried): one per
    # transition, from whichever gateway claimed it.
    attempted = {(d["alert"]["state"], d["alert"]["at"]) for d in receiver.attempts}
    assert sorted(state for state, _ in attempted) == ["fired", "resolved"]
    assert [d["alert"]["state"] for d in receiver.delivered] == ["fired", "resolved"]
    assert histories == [["resolved", "fired"], ["resolved", "fired"]]
