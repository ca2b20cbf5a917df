"""docs/api.md's message requests over real HTTP: send, batches, receive and long-poll, ack, nack, visibility."""

from __future__ import annotations

import base64
import threading
import time
from collections.abc import Mapping
from pathlib import Path

import httpx
import pytest

from backend_store.limits import MAX_RECEIPTS, MAX_VISIBILITY_S
from push.settings import PushSettings
from tests.conftest import scaled
from tests.fixtures.dev_cluster import StoreTarget

from .conftest import Api, RunningGateway, api_for, problem_code, start_gateway


def test_send_one_is_201_and_receive_returns_it(admin: Api, qname: str) -> None:
    admin.put_queue(qname)
    r = admin.send(qname, "payload", attributes={"k": "v"}, group_id="g1")
    assert r.status_code == 201
    sent = r.json()
    assert sent["duplicate"] is False and isinstance(sent["seq"], int) and sent["id"]
    msgs = admin.receive(qname).json()["messages"]
    assert len(msgs) == 1
    m = msgs[0]
    assert set(m) == {"id", "seq", "receipt", "body", "attributes", "group_id", "sent_at", "receive_count"}
    assert (m["id"], m["seq"], m["body"], m["attributes"], m["group_id"]) == (
        sent["id"],
        sent["seq"],
        "payload",
        {"k": "v"},
        "g1",
    )
    assert m["receive_count"] == 1 and isinstance(m["sent_at"], float)


def test_body_base64_round_trips_binary(admin: Api, qname: str) -> None:
    admin.put_queue(qname)
    raw = bytes(range(256))
    r = admin.client.post(
        f"/v1/queues/{qname}/messages", json={"body_base64": base64.b64encode(raw).decode()}
    )
    assert r.status_code == 201
    (m,) = admin.receive(qname).json()["messages"]
    assert "body" not in m
    assert base64.b64decode(m["body_base64"]) == raw


def test_message_validation(admin: Api, qname: str) -> None:
    admin.put_queue(qname)
    url = f"/v1/queues/{qname}/messages"
    bad = [
        {},
        {"body": "a", "body_base64": "YQ=="},
        {"body": 5},
        {"body_base64": "not base64!"},
        {"body": "a", "attributes": {"k": 1}},
        {"body": "a", "delay_s": 901},
        {"body": "a", "delay_s": -1},
        {"body": "a", "group_id": ""},
        {"body": "a", "dedupe_id": "x" * 129},
        {"body": "a", "unknown": 1},
        "just a string",
    ]
    for doc in bad:
        assert problem_code(admin.client.post(url, json=doc), 400) == "invalid_request", doc


def test_dedupe_id_and_idempotency_key(admin: Api, qname: str) -> None:
    admin.put_queue(qname)
    first = admin.send(qname, "a", dedupe_id="d1")
    again = admin.send(qname, "a", dedupe_id="d1")
    assert first.status_code == 201 and again.status_code == 200
    assert again.json() == {**first.json(), "duplicate": True}
    url = f"/v1/queues/{qname}/messages"
    k1 = admin.client.post(url, json={"body": "b"}, headers={"Idempotency-Key": "key-1"})
    k2 = admin.client.post(url, json={"body": "b"}, headers={"Idempotency-Key": "key-1"})
    assert k1.status_code == 201 and k2.status_code == 200
    assert k2.json()["id"] == k1.json()["id"] and k2.json()["duplicate"] is True
    too_long = admin.client.post(url, json={"body": "b"}, headers={"Idempotency-Key": "k" * 129})
    assert problem_code(too_long, 400) == "invalid_request"
    assert len(admin.receive(qname, max=10).json()["messages"]) == 2


def test_batch_results_in_order_with_per_entry_errors(admin: Api, qname: str) -> None:
    admin.put_queue(qname, max_message_bytes=10)
    batch = [
        {"body": "one"},
        {"body": 5},
        {"body": "x" * 11},
        {"body": "two", "dedupe_id": "d"},
        {"body": "3", "dedupe_id": "d"},
    ]
    r = admin.client.post(f"/v1/queues/{qname}/messages", json={"messages": batch})
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert len(results) == 5
    assert results[0]["duplicate"] is False
    assert results[1]["error"]["code"] == "invalid_request" and results[1]["error"]["status"] == 400
    assert results[2]["error"]["code"] == "message_too_large"
    assert results[3]["duplicate"] is False
    assert results[4] == {**results[3], "duplicate": True}
    bodies = [m["body"] for m in admin.receive(qname, max=10).json()["messages"]]
    assert bodies == ["one", "two"]


def test_batch_size_bounds(admin: Api, qname: str) -> None:
    admin.put_queue(qname)
    url = f"/v1/queues/{qname}/messages"
    assert problem_code(admin.client.post(url, json={"messages": []}), 400) == "invalid_request"
    many = [{"body": str(i)} for i in range(101)]
    assert problem_code(admin.client.post(url, json={"messages": many}), 400) == "invalid_request"
    r = admin.client.post(url, json={"messages": many[:100]})
    assert r.status_code == 200 and len(r.json()["results"]) == 100
    assert (
        problem_code(admin.client.post(url, json={"messages": [{"body": "a"}], "x": 1}), 400)
        == "invalid_request"
    )


def test_batch_of_only_invalid_entries_still_needs_the_queue(admin: Api, qname: str) -> None:
    r = admin.client.post(f"/v1/queues/{qname}/messages", json={"messages": [{"body": 1}]})
    assert problem_code(r, 404) == "queue_not_found"


def test_message_too_large_and_queue_full(admin: Api, qname: str) -> None:
    admin.put_queue(qname, max_message_bytes=4, max_messages=1)
    assert problem_code(admin.send(qname, "12345"), 413) == "message_too_large"
    assert admin.send(qname, "1234").status_code == 201
    assert problem_code(admin.send(qname, "x"), 409) == "queue_full"


def test_send_to_missing_queue_is_404(admin: Api, qname: str) -> None:
    assert problem_code(admin.send(qname), 404) == "queue_not_found"
    assert problem_code(admin.receive(qname), 404) == "queue_not_found"
    assert problem_code(admin.client.post(f"/v1/queues/{qname}/receive"), 404) == "queue_not_found"


def test_every_message_route_answers_404_for_a_missing_queue(admin: Api, qname: str) -> None:
    # A well-formed receipt of a real queue, used against a queue that does not exist.
    admin.put_queue(qname)
    admin.send(qname, "x")
    [msg] = admin.receive(qname).json()["messages"]
    missing = qname + "-missing"
    base = f"/v1/queues/{missing}"
    receipts = {"receipts": [msg["receipt"]]}
    for r in (
        admin.client.post(f"{base}/ack", json=receipts),
        admin.client.post(f"{base}/nack", json=receipts),
        admin.client.post(f"{base}/visibility", json={"receipt": msg["receipt"], "timeout_s": 5}),
        admin.client.delete(f"{base}/messages/{msg['receipt']}"),
        admin.client.post(f"{base}/ack", json={"receipts": ["r"]}),
    ):
        assert problem_code(r, 404) == "queue_not_found", r.request.url
    # Nothing happened to the message.
    assert admin.client.post(f"/v1/queues/{qname}/ack", json=receipts).json()["acked"] == 1


def test_receive_parameters(admin: Api, qname: str) -> None:
    admin.put_queue(qname)
    for i in range(5):
        admin.send(qname, str(i))
    assert len(admin.receive(qname, max=3).json()["messages"]) == 3
    assert len(admin.receive(qname, max=100).json()["messages"]) == 2
    for params in (
        {"max": 0},
        {"max": 101},
        {"max": 1.5},
        {"wait_s": 21},
        {"wait_s": -1},
        {"visibility_timeout_s": 43201},
        {"max": "1"},
        {"other": 1},
    ):
        r = admin.client.post(f"/v1/queues/{qname}/receive", json=params)
        assert problem_code(r, 400) == "invalid_request", params


def test_receive_with_no_body_means_defaults(admin: Api, qname: str) -> None:
    admin.put_queue(qname)
    admin.send(qname, "a")
    admin.send(qname, "b")
    r = admin.client.post(f"/v1/queues/{qname}/receive")
    assert r.status_code == 200 and len(r.json()["messages"]) == 1


def test_received_messages_are_invisible_until_the_timeout(admin: Api, qname: str) -> None:
    # Timed from before the first receive, so a slow round trip on a loaded machine can only
    # make the check easier, never fail it: the message comes back no sooner than 1 s later.
    admin.put_queue(qname)
    admin.send(qname)
    start = time.monotonic()
    (m,) = admin.receive(qname, visibility_timeout_s=1).json()["messages"]
    again = admin.receive(qname, wait_s=scaled(10)).json()["messages"]
    assert time.monotonic() - start >= 0.9, "handed out again before its visibility timeout"
    assert [x["id"] for x in again] == [m["id"]] and again[0]["receive_count"] == 2
    # The first receipt died when the message became visible again.
    assert admin.ack(qname, [m["receipt"]]).json()["acked"] == 0


def test_long_poll_returns_as_soon_as_a_message_arrives(
    gateway: RunningGateway, admin: Api, qname: str
) -> None:
    admin.put_queue(qname)
    sent_at: list[float] = []

    def send_later() -> None:
        # Waits for the long-poll to be parked (a gauge in /metrics), then sends from
        # another connection: so the answer can only come from the wake-up.
        with httpx.Client(base_url=gateway.url, headers=admin.client.headers) as other:
            deadline = time.monotonic() + scaled(10)
            while "pushgate_receive_waiting 1.0" not in other.get("/metrics").text:
                assert time.monotonic() < deadline, "the long-poll never parked"
                time.sleep(0.01)
            sent_at.append(time.monotonic())
            other.post(f"/v1/queues/{qname}/messages", json={"body": "late"})

    thread = threading.Thread(target=send_later)
    start = time.monotonic()
    thread.start()
    r = admin.receive(qname, wait_s=20)
    done = time.monotonic()
    thread.join()
    assert [m["body"] for m in r.json()["messages"]] == ["late"]
    assert done - start < scaled(5), "the long-poll waited for its whole wait_s"
    assert done >= sent_at[0]


def test_long_poll_ends_empty_after_wait_s(admin: Api, qname: str) -> None:
    admin.put_queue(qname)
    start = time.monotonic()
    r = admin.receive(qname, wait_s=0.3)
    elapsed = time.monotonic() - start
    assert r.json() == {"messages": []}
    assert 0.29 <= elapsed < scaled(3)


def test_long_poll_wakes_for_a_delayed_message(tmp_path: Path, store_target: StoreTarget, qname: str) -> None:
    # Not before the delay ends (timed from before the send: load can only add to it), and
    # well before the safety re-check could have found it: the delay's end woke the poll.
    # The re-check is a minute here (longer than the wait), so a busy machine's slow round
    # trips cannot pass for it.
    gateway = start_gateway(tmp_path, target=store_target, push=PushSettings(safety_poll_s=60))
    try:
        for admin in api_for(gateway, gateway.admin_key):
            admin.put_queue(qname)
            start = time.monotonic()
            admin.send(qname, "later", delay_s=1)
            r = admin.receive(qname, wait_s=20)
            elapsed = time.monotonic() - start
            assert [m["body"] for m in r.json()["messages"]] == ["later"]
            # A poll that nothing woke would answer only after its 20 s.
            assert 0.9 <= elapsed < 15, elapsed
    finally:
        gateway.stop()


def test_queue_receive_wait_s_is_the_default_wait(admin: Api, qname: str) -> None:
    admin.put_queue(qname, receive_wait_s=0.3)
    start = time.monotonic()
    r = admin.client.post(f"/v1/queues/{qname}/receive", json={})
    assert r.json() == {"messages": []}
    assert time.monotonic() - start >= 0.29


def test_ack_by_body(admin: Api, qname: str) -> None:
    admin.put_queue(qname)
    admin.send(qname, "a")
    admin.send(qname, "b")
    receipts = [m["receipt"] for m in admin.receive(qname, max=2).json()["messages"]]
    r = admin.ack(qname, [*receipts, "bogus"])
    assert r.status_code == 200
    assert r.json()["acked"] == 2
    assert [f["receipt"] for f in r.json()["failed"]] == ["bogus"]
    assert r.json()["failed"][0]["code"] == "invalid_receipt"
    assert admin.ack(qname, receipts).json()["acked"] == 0
    stats = admin.client.get(f"/v1/queues/{qname}").json()["stats"]
    assert stats["visible"] == 0 and stats["in_flight"] == 0 and stats["acked_total"] == 2
    doc: Mapping[str, object]
    for doc in (
        {"receipts": []},
        {"receipts": "x"},
        {"receipts": [1]},
        {},
        {"receipts": ["x"] * (MAX_RECEIPTS + 1)},
    ):
        assert problem_code(admin.client.post(f"/v1/queues/{qname}/ack", json=doc), 400) == "invalid_request"


def test_ack_with_a_receipt_of_another_queue_fails(admin: Api, qname: str) -> None:
    admin.put_queue(qname)
    admin.put_queue(f"{qname}-other")
    admin.send(qname)
    (m,) = admin.receive(qname).json()["messages"]
    r = admin.ack(f"{qname}-other", [m["receipt"]])
    assert r.json()["acked"] == 0 and r.json()["failed"][0]["code"] == "invalid_receipt"


def test_delete_by_receipt(admin: Api, qname: str) -> None:
    admin.put_queue(qname)
    admin.send(qname)
    (m,) = admin.receive(qname).json()["messages"]
    assert admin.client.delete(f"/v1/queues/{qname}/messages/{m['receipt']}").status_code == 204
    r = admin.client.delete(f"/v1/queues/{qname}/messages/{m['receipt']}")
    assert problem_code(r, 400) == "invalid_receipt"
    assert (
        problem_code(admin.client.delete(f"/v1/queues/{qname}/messages/nonsense"), 400) == "invalid_receipt"
    )


def test_nack_makes_messages_visible_again(admin: Api, qname: str) -> None:
    admin.put_queue(qname)
    admin.send(qname)
    (m,) = admin.receive(qname).json()["messages"]
    r = admin.client.post(f"/v1/queues/{qname}/nack", json={"receipts": [m["receipt"], "bogus"]})
    assert r.status_code == 200
    assert r.json()["nacked"] == 1 and r.json()["failed"][0]["receipt"] == "bogus"
    (again,) = admin.receive(qname).json()["messages"]
    assert again["id"] == m["id"] and again["receive_count"] == 2


def test_nack_with_delay(admin: Api, qname: str) -> None:
    # Two messages: one nacked for 60 s (still hidden whenever the test looks, however slow
    # the machine), one for 1 s (back no sooner than that, timed from before its nack).
    admin.put_queue(qname)
    admin.send(qname, "long")
    admin.send(qname, "short")
    got = {m["body"]: m for m in admin.receive(qname, max=2).json()["messages"]}
    url = f"/v1/queues/{qname}/nack"
    r = admin.client.post(url, json={"receipts": [got["long"]["receipt"]], "delay_s": 60})
    assert r.status_code == 200 and r.json()["nacked"] == 1
    start = time.monotonic()
    r = admin.client.post(url, json={"receipts": [got["short"]["receipt"]], "delay_s": 1})
    assert r.status_code == 200 and r.json()["nacked"] == 1
    back = admin.receive(qname, max=10, wait_s=scaled(10)).json()["messages"]
    assert time.monotonic() - start >= 0.9
    assert [m["body"] for m in back] == ["short"]
    assert admin.receive(qname, max=10).json()["messages"] == []
    m = got["long"]
    for doc in (
        {"receipts": [m["receipt"]], "delay_s": MAX_VISIBILITY_S + 1},
        {"receipts": [], "delay_s": 0},
    ):
        assert problem_code(admin.client.post(f"/v1/queues/{qname}/nack", json=doc), 400) == "invalid_request"


def test_visibility_extension(admin: Api, qname: str) -> None:
    admin.put_queue(qname)
    admin.send(qname)
    # Extended within its first 5 s, then watched until past them: still invisible.
    start = time.monotonic()
    (m,) = admin.receive(qname, visibility_timeout_s=5).json()["messages"]
    r = admin.client.post(f"/v1/queues/{qname}/visibility", json={"receipt": m["receipt"], "timeout_s": 60})
    assert r.status_code == 200
    assert r.json()["receipt"] == m["receipt"] and r.json()["visible_at"] > time.time() + 50
    wait_s = max(0.1, start + 6 - time.monotonic())
    assert admin.receive(qname, wait_s=wait_s).json()["messages"] == []
    # timeout_s 0: visible again at once.
    r = admin.client.post(f"/v1/queues/{qname}/visibility", json={"receipt": m["receipt"], "timeout_s": 0})
    assert r.status_code == 200
    assert len(admin.receive(qname, wait_s=scaled(5)).json()["messages"]) == 1


def test_visibility_validation(admin: Api, qname: str) -> None:
    admin.put_queue(qname)
    url = f"/v1/queues/{qname}/visibility"
    for doc in (
        {"receipt": "x"},
        {"timeout_s": 5},
        {"receipt": "x", "timeout_s": 43201},
        {"receipt": 1, "timeout_s": 1},
    ):
        assert problem_code(admin.client.post(url, json=doc), 400) == "invalid_request", doc
    assert (
        problem_code(admin.client.post(url, json={"receipt": "bogus", "timeout_s": 5}), 400)
        == "invalid_receipt"
    )


def test_fifo_queue_hands_out_one_message_per_group(admin: Api, qname: str) -> None:
    admin.put_queue(qname, ordering="fifo")
    for i in range(3):
        admin.send(qname, f"a{i}", group_id="a")
    admin.send(qname, "b0", group_id="b")
    first = admin.receive(qname, max=10).json()["messages"]
    assert sorted(m["body"] for m in first) == ["a0", "b0"]
    admin.ack(qname, [m["receipt"] for m in first if m["body"] == "a0"])
    assert [m["body"] for m in admin.receive(qname, max=10).json()["messages"]] == ["a1"]


def test_dead_letter_after_max_receives(admin: Api, qname: str) -> None:
    admin.put_queue(f"{qname}-dlq")
    admin.put_queue(qname, max_receives=1, dead_letter_queue=f"{qname}-dlq", visibility_timeout_s=0)
    admin.send(qname, "poison")
    assert len(admin.receive(qname).json()["messages"]) == 1
    assert admin.receive(qname).json()["messages"] == []
    (dead,) = admin.receive(f"{qname}-dlq").json()["messages"]
    assert dead["body"] == "poison"


def test_an_abandoned_long_poll_takes_no_message(gateway: RunningGateway, admin: Api, qname: str) -> None:
    admin.put_queue(qname)
    with pytest.raises(httpx.ReadTimeout):
        admin.client.post(f"/v1/queues/{qname}/receive", json={"wait_s": 20}, timeout=0.3)
    # The gateway noticed the hang-up: the poll is no longer parked...
    deadline = time.monotonic() + scaled(5)
    while "pushgate_receive_waiting 0.0" not in admin.client.get("/metrics").text:
        assert time.monotonic() < deadline, "the abandoned long-poll is still parked"
        time.sleep(0.01)
    # ...so a message sent now goes to the next receiver, not to the closed connection.
    admin.send(qname, "for a live client")
    assert [m["body"] for m in admin.receive(qname).json()["messages"]] == ["for a live client"]
